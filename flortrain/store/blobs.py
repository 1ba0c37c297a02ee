"""Reading checkpoint blobs, wherever the blob store lives.

The store is split on purpose: the SQLite metadata (runs, blocks, logs) stays with the process
that records or drives a replay, while the blobs (``<run>/<key>.ft`` plus content-addressed
``objects/ab/<name>``) are plain immutable files that anyone holding the right URL can read.
A replay worker on another machine (the Ray backend) is given the blob store's location, a local
path on a shared filesystem or any fsspec URL (``s3://bucket/store/blobs``, ``gs://…``,
``file:///…``), and never opens the database. Every read is verified against the hash the
metadata recorded (a blob's sha256 over its key and bytes; the blob names its objects by their XXH3-128,
``content.py``), so a blob store reached through a network is trusted no more than a local one.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import Any

from flortrain.store import confine, content
from flortrain.store.records import Checkpoint

#: Verified content-addressed objects a replay keeps in memory (see ``BlobReader.read_object``).
OBJECT_CACHE_BYTES = 1 << 30
#: How far a replay's reads may run ahead of its restores, in checkpoint bytes (:class:`ReadAhead`);
#: well within :data:`OBJECT_CACHE_BYTES`, so what is read ahead is still cached when it is needed.
READ_AHEAD_BYTES = 256 << 20


def hasher(key: str) -> Any:
    """A sha256 that has taken in ``key``: what a blob's digest starts from. The digest covers the
    checkpoint's key as well as its bytes, so a row that names another checkpoint's blob (two
    rows swapped, a blob copied over another) does not verify and is never restored as this one."""
    raw = key.encode()
    h = hashlib.sha256(len(raw).to_bytes(8, "big"))
    h.update(raw)
    return h


def digest(key: str, data: bytes) -> str:
    """The digest a checkpoint row holds for blob ``data`` of checkpoint ``key``."""
    h = hasher(key)
    h.update(data)
    return str(h.hexdigest())


def is_url(location: str) -> bool:
    """Whether ``location`` names a blob store through fsspec rather than a local directory."""
    return "://" in location


def object_rel(sha: str) -> str:
    """A content-addressed object, relative to the blob store: ``objects/ab/abcdef...``."""
    return f"objects/{sha[:2]}/{sha}"


class BlobReader:
    """Verified reads of blobs and objects under one location (a directory or an fsspec URL)."""

    def __init__(self, location: str | Path) -> None:
        self.location = str(location)
        self._fs: Any = None
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._objects_bytes = 0
        self._lock = threading.Lock()  # the cache, shared with the read-ahead's thread
        self._reading: dict[str, threading.Event] = {}  # objects being read, by name
        self._ahead: ReadAhead | None = None

    def _read(self, rel: str) -> bytes | None:
        if not confine.relative(rel):
            return None
        if not is_url(self.location):
            try:
                return confine.read(Path(self.location), rel)
            except OSError:  # missing, or a link planted below the blob store
                return None
        if self._fs is None:
            import fsspec  # only a replay from a remote blob store needs it

            self._fs, self._root = fsspec.core.url_to_fs(self.location)
        try:
            data = self._fs.cat_file(f"{self._root.rstrip('/')}/{rel}")
        except (OSError, ValueError):  # fsspec maps a missing key to FileNotFoundError
            return None
        return bytes(data)

    def read_ahead(self, order: list[Checkpoint], refs: Callable[[bytes], list[str]]) -> None:
        """Read the checkpoints in ``order`` (those a replay may restore, in the order the record
        took them) ahead of the replay, from the first one it asks for on (:class:`ReadAhead`).
        ``refs`` names the objects a blob refers to. A local blob store only: a remote one is
        read as the replay asks."""
        if order and not is_url(self.location):
            self._ahead = ReadAhead(self, order, refs)

    def read_blob(self, ck: Checkpoint) -> bytes | None:
        """The blob, or None when it is missing or does not match its recorded digest."""
        if self._ahead is not None:
            data = self._ahead.take(ck)
            if data is not None:
                return data
        return self._read_blob(ck)

    def _read_blob(self, ck: Checkpoint) -> bytes | None:
        data = self._read(ck.path)
        if data is None or digest(ck.key, data) != ck.sha256:
            return None
        return data

    def read_object(self, sha: str) -> bytes | None:
        """A content-addressed tensor, or None when it is missing or its bytes do not hash to its
        name. A replay restores the same unchanged object (a frozen table) at every skipped
        instance: it is read and verified once, and the most recent are kept within a budget.
        An object the read-ahead is reading is waited for, not read twice."""
        with self._lock:
            cached = self._objects.get(sha)
            if cached is not None:
                self._objects.move_to_end(sha)
                return cached
            busy = self._reading.get(sha)
            if busy is None:
                self._reading[sha] = done = threading.Event()
        if busy is not None:
            busy.wait()
            with self._lock:
                cached = self._objects.get(sha)
            return cached if cached is not None else self._read_object(sha)
        try:
            return self._read_object(sha)
        finally:
            with self._lock:
                del self._reading[sha]
            done.set()

    def forget(self, shas: frozenset[str]) -> None:
        """Drop these objects from the cache (see ``ReadAhead._used_up``)."""
        with self._lock:
            for sha in shas:
                data = self._objects.pop(sha, None)
                if data is not None:
                    self._objects_bytes -= len(data)

    def _read_object(self, sha: str) -> bytes | None:
        data = self._read(object_rel(sha))
        if data is None or not content.verifies(data, sha):
            return None
        with self._lock:
            if sha not in self._objects:
                self._objects[sha] = data
                self._objects_bytes += len(data)
            while self._objects_bytes > OBJECT_CACHE_BYTES and len(self._objects) > 1:
                _, old = self._objects.popitem(last=False)
                self._objects_bytes -= len(old)
        return data


class ReadAhead:
    """A replay's checkpoints, read and verified on a thread before the replay restores them.

    An outer-probe replay is mostly restores: for each skipped instance it reads a blob and its
    objects from disk, verifies their hashes and copies them into the live state, one after
    the other on the script's thread. Read from a cold page cache (a replay days after its record)
    the reads are a large share of such a replay (docs/benchmarks.md). File reads and a blob's
    sha256 release the GIL, so a thread does both while the script restores the previous checkpoint;
    an object's XXH3 holds it, for 3 ms per 100 MB.

    It starts at the first checkpoint the replay asks for (a parallel worker's segment, a jump's
    target) and stays at most :data:`READ_AHEAD_BYTES` ahead of the latest one; a checkpoint the
    replay passes over is dropped. What it reads is verified like any read, and the object cache
    it fills is the reader's own, so a replay restores the same bytes with or without it. Blobs
    it read are kept until taken; objects go to the reader's cache."""

    def __init__(
        self, reader: BlobReader, order: list[Checkpoint], refs: Callable[[bytes], list[str]]
    ) -> None:
        self.reader = reader
        self.order = order
        self.refs = refs
        self.index = {ck.path: i for i, ck in enumerate(order)}
        self.ends = list(accumulate(ck.nbytes for ck in order))  # bytes up to and including each
        self.cond = threading.Condition()
        self.taken = -1  # the latest checkpoint the replay took
        self.next = 0  # the next one the thread reads
        self.reading: str | None = None
        self.blobs: dict[str, bytes] = {}  # read ahead, verified, not yet taken
        self.blob_refs: dict[str, frozenset[str]] = {}  # the objects each of those refers to
        self.last_refs: frozenset[str] = frozenset()  # those of the latest checkpoint taken
        self.thread: threading.Thread | None = None
        self.objects: ThreadPoolExecutor | None = None

    def take(self, ck: Checkpoint) -> bytes | None:
        """``ck``'s blob if it was read ahead (verified against its digest); None if it was
        not, and it is then the caller's to read. Moves the read-ahead on to the checkpoints
        after it."""
        rel = ck.path
        i = self.index.get(rel)
        if i is None or self.order[i] != ck:
            return None
        with self.cond:
            self.taken = max(self.taken, i)
            self.next = max(self.next, self.taken + 1)
            while self.reading == rel:
                self.cond.wait()
            data = self.blobs.pop(rel, None)
            refs = self.blob_refs.pop(rel, None)
            for stale in [r for r in self.blobs if self.index[r] <= self.taken]:
                del self.blobs[stale]
                del self.blob_refs[stale]
            done = self._used_up(refs)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="flortrain-read-ahead", daemon=True
                )
                self.thread.start()
            self.cond.notify_all()
        self.reader.forget(done)
        return data

    def _used_up(self, refs: frozenset[str] | None) -> frozenset[str]:
        """The objects of the previous checkpoint taken that neither the one taken now (``refs``)
        nor one read ahead refers to: the replay restored them, and nothing it will restore soon
        names them again. Called with the condition held.

        Why: the object cache keeps what it read up to :data:`OBJECT_CACHE_BYTES`, so a replay whose
        every tensor changes each epoch would hold all of it, and every read and every restore's
        copy would land on fresh pages, a page fault per 4 KB. Let go of, they are memory the next
        reads reuse. An object both checkpoints name (a frozen table) stays; one dropped too eagerly
        is only read again, and verified again."""
        if refs is None:  # read by the caller: its objects are unknown here, left to the budget
            self.last_refs = frozenset()
            return frozenset()
        keep = refs.union(*self.blob_refs.values())
        done, self.last_refs = self.last_refs - keep, refs
        return done

    def _pool(self) -> ThreadPoolExecutor:
        """Threads that read and verify one checkpoint's objects side by side: one thread reads
        from disk while another hashes, and the disk serves several reads at once."""
        if self.objects is None:
            self.objects = ThreadPoolExecutor(
                min(4, os.cpu_count() or 1), thread_name_prefix="flortrain-read-ahead"
            )
        return self.objects

    def _ahead(self) -> int:
        """Bytes read (or being read) ahead of the latest checkpoint taken."""
        return (
            self.ends[self.next - 1] - (self.ends[self.taken] if self.taken >= 0 else 0)
            if self.next
            else 0
        )

    def _run(self) -> None:
        while True:
            with self.cond:
                while (
                    self.next < len(self.order)
                    and self.next > self.taken + 1
                    and self._ahead() >= READ_AHEAD_BYTES
                ):
                    self.cond.wait()
                if self.next >= len(self.order):
                    return
                j = self.next
                self.next += 1
                ck = self.order[j]
                rel = ck.path
                self.reading = rel
            data = None
            try:
                data = self.reader._read_blob(ck)
                refs: frozenset[str] = frozenset()
                if data is not None:
                    refs = frozenset(self.refs(data))
                    list(self._pool().map(self.reader.read_object, refs))
            except Exception:  # a blob it cannot parse is read again, and judged, when it is taken
                data = None
            finally:
                with self.cond:
                    self.reading = None
                    if (
                        data is not None and j >= self.taken
                    ):  # not passed over (it may be waited for)
                        self.blobs[rel], self.blob_refs[rel] = data, refs
                    self.cond.notify_all()


__all__ = [
    "OBJECT_CACHE_BYTES",
    "READ_AHEAD_BYTES",
    "BlobReader",
    "Checkpoint",
    "ReadAhead",
    "digest",
    "hasher",
    "is_url",
    "object_rel",
]
