"""The store's rows as typed records, validated where they are read.

A database is a file: damaged on disk, edited by hand, or handed over with a store. What a row
says sizes threads, names files and indexes loops, so each record checks its row when it is
built from one (types, ranges, paths that stay in the store) and a row that fails is one line,
``FT018``, naming the row, before anything acts on it: never a crash, a read outside the store,
or ``torch.set_num_threads(100000)``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from flortrain.errors import FlortrainError, Located
from flortrain.store import confine

#: a row that fails validation: the store is damaged or was edited
DAMAGED = "FT018"
#: intra-op threads a run may have recorded (torch crashes far above what any machine has)
MAX_THREADS = 1024
#: checkpoint sizes, iteration numbers and the like: at most this (2**53, a float's exact range)
MAX_COUNT = 1 << 53

_HEX64 = re.compile(r"[0-9a-f]{64}")
E = TypeVar("E", bound=StrEnum)


class Damaged(Exception):
    """Why one field of a row is not what flortrain writes; :func:`refuse` names the row."""


def refuse(where: str, what: str, why: Damaged) -> FlortrainError:
    """The one-line refusal of a damaged row ``what`` (``run 3``, ``checkpoint K of run 3``)."""
    return FlortrainError(
        f"the store's {what} is damaged ({why}); record into a new store (--store DIR)",
        Located(where),
        DAMAGED,
    )


def count(value: object, name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """An integer field in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Damaged(f"{name} {value!r} is not an integer in {low}..{high}")
    return value


def maybe_count(value: object, name: str, low: int = 0, high: int = MAX_COUNT) -> int | None:
    return None if value is None else count(value, name, low, high)


def text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise Damaged(f"{name} {value!r} is not text")
    return value


def seconds(value: object, name: str) -> float:
    """A time or a duration: a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise Damaged(f"{name} {value!r} is not a number")
    if abs(value) > MAX_COUNT:
        raise Damaged(f"{name} {value!r} is out of range")
    return float(value)


def maybe_seconds(value: object, name: str) -> float | None:
    return None if value is None else seconds(value, name)


def loaded(value: object, name: str, kind: type) -> Any:
    """A JSON column holding a ``kind`` (list, dict)."""
    try:
        doc = json.loads(text(value, name))
    except ValueError:
        raise Damaged(f"{name} is not JSON") from None
    if not isinstance(doc, kind):
        raise Damaged(f"{name} is not a JSON {kind.__name__}")
    return doc


class BlockState(StrEnum):
    """What became of a block instance (a ``blocks`` row's ``state``); the values are the
    strings the schema holds."""

    #: record: executed, no checkpoint (declined, lost, or not yet committed)
    RECORDED = "recorded"
    #: record: executed, its checkpoint committed
    CHECKPOINTED = "checkpointed"
    #: record: a main-loop boundary (its checkpoint, when committed, resumes the loop there)
    BOUNDARY = "boundary"
    #: replay: restored from its checkpoint
    SKIPPED = "skipped"
    #: replay: executed
    EXECUTED = "executed"


class RunStatus(StrEnum):
    """A ``runs`` row's ``status``: ``running`` until the run finishes."""

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    #: stopped by SIGINT or SIGTERM once what it had was committed
    INTERRUPTED = "interrupted"


#: what a ``running`` run whose process is gone reads as (:attr:`Run.effective_status`)
INCOMPLETE = "incomplete"


def member(kind: type[E], value: object, name: str, what: str) -> E:
    """A column holding one of an enum's values."""
    try:
        return kind(text(value, name))
    except ValueError:
        raise Damaged(f"{name} {value!r} is not {what}") from None


@dataclass(frozen=True)
class BlockRow:
    """A block instance (or a main-loop boundary) of a run: a ``blocks`` row."""

    key: str
    block_id: str
    main_id: str
    #: the main loop's entry
    main_inst: int
    iteration: int
    occurrence: int
    state: BlockState
    compute_s: float | None = None
    materialize_s: float | None = None
    restore_s: float | None = None
    note: str | None = None
    #: part -> digest of the state at the end (checkpointed, or executed where the record has a
    #: checkpoint): what ``diff`` compares
    state_sha: dict[str, str] | None = None

    def values(self, run_id: int) -> tuple[Any, ...]:
        """The row as ``INSERT INTO blocks VALUES`` takes it."""
        return (
            run_id,
            self.key,
            self.block_id,
            self.main_id,
            self.main_inst,
            self.iteration,
            self.occurrence,
            str(self.state),
            self.compute_s,
            self.materialize_s,
            self.restore_s,
            self.note,
            None if self.state_sha is None else json.dumps(self.state_sha),
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> BlockRow:
        """A ``blocks`` row (``SELECT *``, after ``run_id``), validated."""
        key, block_id, main_id, entry, it, occ, st, compute, materialize, restore, note, sha = row
        digests = None if sha is None else loaded(sha, "state_sha", dict)
        return cls(
            text(key, "key"),
            text(block_id, "block_id"),
            text(main_id, "main_id"),
            count(entry, "main_inst"),
            count(it, "iteration"),
            count(occ, "occurrence"),
            member(BlockState, st, "state", "a block state"),
            maybe_seconds(compute, "compute_s"),
            maybe_seconds(materialize, "materialize_s"),
            maybe_seconds(restore, "restore_s"),
            None if note is None else text(note, "note"),
            digests,
        )


@dataclass(frozen=True)
class Run:
    id: int
    kind: str
    script: str
    cwd: str
    argv: list[str]
    source_sha: str
    parent: int | None
    started: float
    finished: float | None
    status: RunStatus
    exit_code: int | None
    threads: int | None
    pid: int
    host: str
    meta: dict[str, Any]
    #: a process holds the run's lock (see :class:`~flortrain.store.trust.RunLock`)
    live: bool = False

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started

    @property
    def effective_status(self) -> str:
        """``running`` only while its process lives; a killed run reads as ``incomplete``."""
        if self.status != RunStatus.RUNNING or self.live:
            return self.status
        return INCOMPLETE

    @classmethod
    def from_row(cls, row: tuple[Any, ...], live: bool) -> Run:
        """A ``runs`` row (``SELECT *``), validated; :class:`Damaged` names the field that fails."""
        rid, kind, script, cwd, argv, sha, parent, started, finished, status, code, threads = row[
            :12
        ]
        pid, host, meta = row[12:]
        args = loaded(argv, "argv", list)
        if not all(isinstance(a, str) for a in args):
            raise Damaged("argv is not a list of text")
        if kind not in ("record", "replay"):
            raise Damaged(f"kind {kind!r} is neither record nor replay")
        return cls(
            count(rid, "id", 1),
            kind,
            text(script, "script"),
            text(cwd, "cwd"),
            args,
            text(sha, "source_sha"),
            maybe_count(parent, "parent", 1),
            seconds(started, "started"),
            maybe_seconds(finished, "finished"),
            member(RunStatus, status, "status", "a run status"),
            maybe_count(code, "exit_code", -(1 << 31), 1 << 31),
            maybe_count(threads, "threads", 1, MAX_THREADS),
            count(pid, "pid"),
            text(host, "host"),
            loaded(meta, "meta", dict),
            live,
        )


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint as a replay asks for it (a ``checkpoints`` row)."""

    key: str
    #: its blob, relative to the blob store (below it: ``store/confine.py``)
    path: str
    #: the sha256 of the key and the blob's bytes (:func:`flortrain.store.blobs.digest`)
    sha256: str
    #: the blob's bytes and those of the objects it wrote
    nbytes: int

    @classmethod
    def from_row(cls, key: object, path: object, sha: object, nbytes: object) -> Checkpoint:
        rel = text(path, "path")
        if not confine.relative(rel):
            raise Damaged(f"its path {rel!r} leaves the store")
        digest = text(sha, "sha256")
        if not _HEX64.fullmatch(digest):
            raise Damaged(f"sha256 {digest!r} is not a sha256")
        return cls(text(key, "key"), rel, digest, count(nbytes, "nbytes"))


__all__ = [
    "DAMAGED",
    "INCOMPLETE",
    "MAX_THREADS",
    "BlockRow",
    "BlockState",
    "Checkpoint",
    "Damaged",
    "Run",
    "RunStatus",
    "count",
    "loaded",
    "maybe_count",
    "maybe_seconds",
    "refuse",
    "seconds",
    "text",
]
