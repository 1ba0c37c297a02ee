"""What a checkpoint will cost the writer, timed before the script starts: the figures an
:class:`~flortrain.checkpoint.staging.Estimate` is priced with."""

from __future__ import annotations

import mmap
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from flortrain.checkpoint.writer import Objects
from flortrain.store import content
from flortrain.store.checkpoints import write_durably


@dataclass(frozen=True)
class WriterSpeed:
    """What a checkpoint costs, measured (:func:`writer_speed`): the writer takes ``per_item +
    per_object * objects + per_byte * bytes``; staging takes ``stage_per_byte * bytes`` of the
    training thread into arena pages touched for the first time (mostly page faults), and
    ``warm_stage_per_byte`` into pages already mapped (``checkpoint/arena.py``)."""

    per_item: float
    per_object: float
    per_byte: float
    stage_per_byte: float = 1e-9
    #: the tensor hash (``store/content.py``) on one thread: what naming a tensor kept from the
    #: loop's entry costs (``kept``)
    hash_per_byte: float = 1e-9
    warm_stage_per_byte: float = 1e-10

    def seconds(self, staged: int, objects: int = 0) -> float:
        return self.per_item + self.per_object * objects + self.per_byte * staged


#: tries of each of :func:`writer_speed`'s copies, the fastest kept (about 1.5 ms a try)
SPEED_TRIES = 6


def writer_speed(blobs: Path) -> WriterSpeed:
    """What a checkpoint will cost, timed before the script starts (10 to 20 ms). It is what the run
    waits for where training leaves the writer no CPU: its backlog is then written after training
    ends, on idle cores. A byte costs its hash (``store/content.py``), spread over the writer's
    threads, and its write, which goes around the page cache (``store.direct``) at the disk's pace
    whatever the threads; so a byte costs the larger of the two. A single-threaded copy into fresh
    pages stands in for the disk (single 2 MB direct writes are too noisy to time). Both are timed
    here on 2 MB, as are staging's copies into fresh and into warm arena pages, and a file's
    creation in a scratch directory beside the store's objects. Not learned from the writer's
    replies: on such a machine they come after training, and where they come sooner the writer ran
    on idle CPU and cost nothing (``period.contention``). Measurements: docs/materializer.md.

    Each figure is the fastest of :data:`SPEED_TRIES` tries: one slow try is the machine, not the
    bytes, and an outlier would price checkpoints too high and halve them."""
    size = 2 << 20
    src = bytes(size)
    stage = warm = hashing = float("inf")
    for _ in range(SPEED_TRIES):
        with mmap.mmap(-1, size) as arena:
            t0 = time.perf_counter()
            arena[:] = src  # fresh pages, as staging beyond the warmed arena meets them
            t1 = time.perf_counter()
            content.name(arena)
            t2 = time.perf_counter()
            arena[:] = src  # pages mapped already
            t3 = time.perf_counter()
        stage, hashing = min(stage, (t1 - t0) / size), min(hashing, (t2 - t1) / size)
        warm = min(warm, (t3 - t2) / size)
    scratch = blobs / f".calibrate-{os.getpid()}"
    objects = Objects(scratch)
    try:
        t0 = time.perf_counter()
        write_durably(scratch, "blob", "calibration", [bytes(4096)])
        t1 = time.perf_counter()
        objects._one((memoryview(os.urandom(64)), False))  # its work, not a lane's thread start
        t2 = time.perf_counter()
        per_item, per_object = t1 - t0, t2 - t1
    except OSError:  # a store we cannot write to fails later, where it is reported
        per_item, per_object = 1e-3, 1e-3
    finally:
        objects.close()
        shutil.rmtree(scratch, ignore_errors=True)
    per_byte = max(hashing / objects.threads, stage)
    return WriterSpeed(per_item, per_object, per_byte, stage, hashing, warm)
