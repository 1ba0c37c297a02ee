"""One parallel-replay worker: a fresh process that replays one segment of the main loop.

``python -m flortrain.replay.worker TASK RESULT`` reads a pickled :class:`WorkerTask` and writes
a pickled :class:`WorkerResult`. A fresh interpreter per segment, never a reused one: a process
that ran one segment holds that segment's RNG streams, modules and caches, and the next segment
would silently start from them. The worker never opens the SQLite store (it may run on another
machine): the task carries what the driver read from it, the blobs are read from the location the
task names, and every row the run produces is returned to the driver, which owns the replay run.

The script's stdout goes nowhere here: the driver prints the merged output, in loop order, from
the captured lines. The worker's stderr is the driver's to show (a traceback fails the replay).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from flortrain.store.iterations import IterationRow
from flortrain.store.logs import LogEntry
from flortrain.store.records import BlockRow, Checkpoint
from flortrain.store.rows import JumpRow

#: (source, names read from the record, live names, names read through an attribute)
GuardSpec = tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]


@dataclass
class WorkerTask:
    """Everything a worker needs, none of it from the SQLite store."""

    index: int
    script: str  # as the user gave it, relative to ``cwd``
    cwd: str
    args: list[str]
    threads: int | None
    uses_torch: bool
    code_text: str  # the script instrumented for this replay, probes included
    disk_text: str  # the script as it is on disk (frames point at its lines)
    modules: dict[str, str]  # project module file -> the text the record instrumented
    record_id: int
    execute: frozenset[str]
    checkpoints: dict[str, Checkpoint]
    guards: dict[str, list[GuardSpec]]
    scalars: dict[tuple[str, int, int], dict[str, Any] | None]
    boundaries: dict[tuple[str, int], list[int]]
    segment: Any  # flortrain.runtime.jumps.Segment
    blobs: str  # the blob store: a directory or an fsspec URL
    meta: dict[str, Any] = field(default_factory=dict)  # the record's (its deterministic settings)


@dataclass
class WorkerResult:
    index: int
    status: int
    elapsed: float  # seconds the script ran (torch's import included), start-up excluded
    marks: dict[str, int]
    unterminated: bool  # the last captured line had no newline
    blocks: list[BlockRow] = field(default_factory=list)
    iterations: list[IterationRow] = field(default_factory=list)
    jumps: list[JumpRow] = field(default_factory=list)
    logs: list[LogEntry] = field(default_factory=list)
    #: statement line -> times fast-forward left it out before the segment
    forwarded: dict[int, int] = field(default_factory=dict)


def run_task(task: WorkerTask) -> WorkerResult:
    """Replay the task's segment in this process (which must be fresh)."""
    from flortrain.determinism.settings import deterministic
    from flortrain.process.training import execute, pin_threads
    from flortrain.runtime import allocator
    from flortrain.runtime.importhook import ProjectHook
    from flortrain.runtime.jumps import SpanReplay, compile_guard
    from flortrain.runtime.replaying import ReplaySession
    from flortrain.runtime.session import ReplaySource
    from flortrain.static.linemap import compile_for
    from flortrain.static.project_files import ProjectFiles, project_roots
    from flortrain.store.blobs import BlobReader
    from flortrain.store.rows import WorkerRows

    os.chdir(task.cwd)
    allocator.steady()
    pin_threads(task.threads)
    deterministic(task.meta, task.uses_torch)
    rows = WorkerRows(BlobReader(task.blobs))
    guards = {m: [compile_guard(*g) for g in gs] for m, gs in task.guards.items()}
    spans = SpanReplay(guards, task.scalars, task.boundaries, segment=task.segment)
    source = ReplaySource(task.record_id, task.execute, task.checkpoints, spans)
    session = ReplaySession(rows, 0, replay=source)
    code = compile_for(os.path.abspath(task.script), task.code_text, task.disk_text)
    hook = ProjectHook(ProjectFiles(project_roots(task.script), task.script), recorded=task.modules)
    t0 = time.perf_counter()
    status = execute(session, code, task.script, task.args, task.uses_torch, hook)
    tee = session.tee
    return WorkerResult(
        task.index,
        status,
        time.perf_counter() - t0,
        dict(session.marks),
        tee is not None and tee.unterminated,
        rows.blocks,
        rows.iterations,
        rows.jumps,
        rows.logs,
        dict(session.forwarded),
    )


def warm_up(uses_torch: bool) -> None:
    """Import what :func:`run_task` will need, before the task exists. Importing runs no script
    code and draws no random numbers the script could see (torch seeds its generators on import
    either way), so a warmed process is as fresh as a cold one when its task arrives."""
    import flortrain.instrument
    import flortrain.process.training
    import flortrain.runtime.importhook
    import flortrain.runtime.jumps
    import flortrain.runtime.replaying
    import flortrain.runtime.session
    import flortrain.static.text
    import flortrain.store.blobs

    if uses_torch and flortrain.static.text.torch_available():
        import torch  # noqa: F401


def main(argv: list[str]) -> int:
    """``TASK RESULT``; or ``--wait torch|plain``: warm up, then read ``TASK\\0RESULT`` from stdin
    (an empty stdin means the driver decided to replay without this worker)."""
    if argv[0] == "--wait":
        warm_up(argv[1] == "torch")
        line = sys.stdin.buffer.readline().rstrip(b"\n")
        if not line:
            return 0
        task_path, result_path = line.decode().split("\0")
    else:
        task_path, result_path = argv
    with open(task_path, "rb") as f:
        task = pickle.load(f)  # written by this user's own driver, a moment ago
    result = run_task(task)
    tmp = result_path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, result_path)
    return result.status


if __name__ == "__main__":
    # the classes must pickle under their module's name, not ``__main__``'s
    from flortrain.replay.worker import main as worker_main

    sys.exit(worker_main(sys.argv[1:]))
