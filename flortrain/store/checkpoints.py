"""The ``checkpoints`` table and the blobs it commits: a checkpoint exists once its row does, and
its row is written only after its blob (and every object it names) is on disk."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flortrain.store import confine
from flortrain.store.blobs import hasher, object_rel
from flortrain.store.records import Checkpoint, Damaged, refuse
from flortrain.store.tables import Tables, guarded_write


class Checkpoints(Tables):
    def blob_rel(self, run_id: int, key: str) -> str:
        """Where a checkpoint's blob lives, relative to the blobs directory."""
        return f"{run_id}/{_safe(key)}.ft"

    def write_blob(self, run_id: int, key: str, data: bytes) -> tuple[str, str]:
        """Write a checkpoint blob durably under a temporary name, then rename it into place."""
        rel = self.blob_rel(run_id, key)
        sha = write_durably(self.blobs, rel, key, [data])
        return rel, sha

    @guarded_write
    def commit_checkpoint(self, run_id: int, key: str, rel: str, sha: str, nbytes: int) -> None:
        """The commit marker: a checkpoint exists only once this row does. Written only after its
        blob (and every tensor object it refers to) is on disk and verified."""
        self._claim(
            "INSERT OR REPLACE INTO checkpoints VALUES (?,?,?,?,?)",
            [(run_id, key, rel, sha, nbytes)],
        )

    def checkpoints(self, run_id: int) -> dict[str, Checkpoint]:
        """key -> checkpoint, in the order the record committed them: the order a replay restores
        them in, which its read-ahead follows. A row whose path leaves the store, or that is
        otherwise not one flortrain writes, is refused (``FT018``)."""
        out: dict[str, Checkpoint] = {}
        for k, p, s, n in self.db.execute(
            "SELECT key, path, sha256, nbytes FROM checkpoints WHERE run_id=? ORDER BY rowid",
            (run_id,),
        ):
            try:
                out[k] = Checkpoint.from_row(k, p, s, n)
            except Damaged as e:
                raise refuse(self._db_path(), f"checkpoint {k!r} of run {run_id}", e) from None
        return out

    def read_blob(self, ck: Checkpoint) -> bytes | None:
        """The blob, or None when it is missing or does not match its recorded digest."""
        return self.reader.read_blob(ck)

    def read_object(self, sha: str) -> bytes | None:
        """A content-addressed tensor (see :mod:`flortrain.checkpoint.materializer`), verified."""
        return self.reader.read_object(sha)

    def read_ahead(self, order: list[Checkpoint], refs: Callable[[bytes], list[str]]) -> None:
        """Read ``order``'s checkpoints ahead of a replay (:class:`~flortrain.store.blobs.ReadAhead`)."""
        self.reader.read_ahead(order, refs)


def object_path(blobs: Path, sha: str) -> Path:
    """A content-addressed object: ``objects/ab/abcdef...`` (the sha256 of its bytes)."""
    return blobs / object_rel(sha)


def write_durably(
    root: Path, rel: str, key: str, chunks: Iterable[Any], fsync: bool = False
) -> str:
    """Write checkpoint ``key``'s blob ``chunks`` to ``root/rel`` through a temporary file,
    hashing as they go (no copy of the data is made), rename into place; return the digest of
    the key and the bytes (:func:`~flortrain.store.blobs.digest`). On any failure the temporary
    file is removed and nothing is left at ``rel``; a symbolic link below ``root`` is refused
    (``store/confine.py``).

    A blob in the page cache survives the recording process being killed; only a power loss or
    kernel crash can drop it, and SQLite (WAL, ``synchronous=NORMAL``) may then lose its latest
    commits too. So by default there is no fsync: every read verifies the sha256, and a blob a
    power loss truncated is a missing checkpoint (its instance re-executes), never a wrong one.
    ``fsync`` is for callers that need more."""
    h = hasher(key)
    with confine.replacing(root, rel) as fd, os.fdopen(fd, "wb", closefd=False) as f:
        for c in chunks:
            h.update(c)
            f.write(c)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return str(h.hexdigest())


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)


__all__ = ["Checkpoints", "object_path", "write_durably"]
