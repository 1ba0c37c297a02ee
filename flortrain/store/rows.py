"""What a running script writes, and where: the store itself, or a replay worker's buffer.

A session writes the rows of its run (block instances, main-loop iterations, jumps, captured
output) and reads checkpoints. In a serial replay or a record those go to the SQLite
:class:`~flortrain.store.db.Store`. A parallel replay's worker writes nothing to SQLite: it may
run on another machine with only the blob store in reach, and several workers must not race on
one run's rows. It keeps its rows in :class:`WorkerRows` and sends them back to the driver,
which keeps the rows of the iterations each worker owns and writes them as one replay run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from flortrain.store.blobs import BlobReader
from flortrain.store.iterations import IterationRow
from flortrain.store.logs import LogEntry
from flortrain.store.records import BlockRow, Checkpoint
from flortrain.store.scriptfiles import FileRow, FileState

#: a jump: main id, entry, first iteration skipped, iteration resumed at
JumpRow = tuple[str, int, int, int]


@runtime_checkable
class RunSink(Protocol):
    """The part of the store a replaying session uses."""

    def put_block(self, run_id: int, row: BlockRow) -> None: ...

    def put_blocks(self, run_id: int, rows: Iterable[BlockRow]) -> None: ...

    def put_iterations(self, run_id: int, rows: Iterable[IterationRow]) -> None: ...

    def put_jump(
        self, run_id: int, main_id: str, main_inst: int, first: int, resumed: int
    ) -> None: ...

    def put_logs(self, run_id: int, entries: Iterable[LogEntry]) -> None: ...

    def read_blob(self, ck: Checkpoint) -> bytes | None: ...

    def read_object(self, sha: str) -> bytes | None: ...

    def read_ahead(self, order: list[Checkpoint], refs: Callable[[bytes], list[str]]) -> None: ...


@runtime_checkable
class RecordSink(RunSink, Protocol):
    """What a recording session and its checkpoint writer write through while the script runs:
    the store itself (:class:`~flortrain.store.db.Store`), typed against here so that the
    runtime and the checkpoint code depend on these writes, not on the whole store."""

    root: Path
    blobs: Path
    #: why the store stopped taking writes (``store/tables.py``), once it has
    failed: str | None

    def put_files(self, run_id: int, rows: Iterable[FileRow]) -> None: ...

    def put_file_states(self, run_id: int, rows: Iterable[tuple[str, FileState]]) -> None: ...

    def write_held(self) -> None: ...

    def blob_rel(self, run_id: int, key: str) -> str: ...

    def write_blob(self, run_id: int, key: str, data: bytes) -> tuple[str, str]: ...

    def commit_checkpoint(self, run_id: int, key: str, rel: str, sha: str, nbytes: int) -> None: ...

    def mark_checkpointed(self, run_id: int, key: str, digests: dict[str, str]) -> None: ...

    def note_block(self, run_id: int, key: str, note: str) -> None: ...


@dataclass
class WorkerRows:
    """A replay worker's rows, in memory, and verified reads from the blob store."""

    reader: BlobReader
    blocks: list[BlockRow] = field(default_factory=list)
    iterations: list[IterationRow] = field(default_factory=list)
    jumps: list[JumpRow] = field(default_factory=list)
    logs: list[LogEntry] = field(default_factory=list)

    def put_block(self, run_id: int, row: BlockRow) -> None:
        self.blocks.append(row)

    def put_blocks(self, run_id: int, rows: Iterable[BlockRow]) -> None:
        self.blocks.extend(rows)

    def put_iterations(self, run_id: int, rows: Iterable[IterationRow]) -> None:
        self.iterations.extend(rows)

    def put_jump(self, run_id: int, main_id: str, main_inst: int, first: int, resumed: int) -> None:
        self.jumps.append((main_id, main_inst, first, resumed))

    def put_logs(self, run_id: int, entries: Iterable[LogEntry]) -> None:
        self.logs.extend(entries)

    def read_blob(self, ck: Checkpoint) -> bytes | None:
        return self.reader.read_blob(ck)

    def read_object(self, sha: str) -> bytes | None:
        return self.reader.read_object(sha)

    def read_ahead(self, order: list[Checkpoint], refs: Callable[[bytes], list[str]]) -> None:
        self.reader.read_ahead(order, refs)


__all__ = ["JumpRow", "RecordSink", "RunSink", "WorkerRows"]
