"""How parallel-replay workers share one machine, and when dividing a main loop cannot pay.

A local parallel replay runs its workers side by side on this machine. Each worker replays its
segment with the record's intra-op thread count pinned (bitwise equality needs it), so it keeps
as many cores busy as the record's main loop did. When the workers together ask for more cores
than the machine has, they queue: N workers on a machine the record already filled are no
faster than one, and each pays its own start-up and the script's setup besides. The record
keeps, per main loop, the cores its iterations kept busy (CPU over wall seconds, the run's
``load`` meta); the planner weighs that against the cores this process may use.

The same figures bound, before anything is planned or started, what dividing could save at
best (every iteration divided evenly, no resume cost): when even that is below what the
workers' start-up costs, the replay runs serially from the start, with its static pass beside
torch's import as ``--jobs 1`` does, instead of paying for workers it would then dismiss.
"""

from __future__ import annotations

import os

from flortrain.replay.costs import WORKER_STARTUP_S, WORTHWHILE, iteration_seconds
from flortrain.store.db import Store
from flortrain.store.records import Run, RunStatus


def machine_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or ``taskset``
    narrows), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def loop_load(record: Run, main_id: str) -> float:
    """Cores one process kept busy running this main loop at record (at least one; one for a
    record that did not measure it)."""
    load = record.meta.get("load", {})
    value = load.get(main_id, 1.0) if isinstance(load, dict) else 1.0
    return max(1.0, float(value))


def concurrency(record: Run, main_id: str, jobs: int, cores: int | None = None) -> float:
    """How many of ``jobs`` local workers can run this loop at full speed at once."""
    return min(float(jobs), (cores or machine_cores()) / loop_load(record, main_id))


def slowdown(record: Run, main_id: str, jobs: int, cores: int | None = None) -> float:
    """How much slower each of ``jobs`` local workers runs than a serial replay does, because
    they share the machine's cores (1 when they fit)."""
    return max(1.0, jobs / concurrency(record, main_id, jobs, cores))


def cannot_pay(store: Store, record: Run, jobs: int, cores: int | None = None) -> str | None:
    """Why dividing the record's main loops among ``jobs`` local workers cannot pay, from the
    record alone; None when it might (the planner decides then)."""
    end = record.duration if record.effective_status == RunStatus.COMPLETE else None
    cores = cores or machine_cores()
    longest: tuple[float, str, float] | None = None
    for (main_id, _), rows in store.iteration_times(record.id).items():
        if len(rows) < 2:
            continue
        starts = [t for _, t in rows]
        # the loop and what follows it: an upper bound on its replay
        total = sum(iteration_seconds(starts, end))
        q = concurrency(record, main_id, jobs, cores)
        # parallel >= startup + setup + total / q; worth it only below WORTHWHILE * serial
        if total * (WORTHWHILE - 1.0 / q) >= WORKER_STARTUP_S + (1.0 - WORTHWHILE) * starts[0]:
            return None
        if longest is None or total > longest[0]:
            longest = (total, main_id, loop_load(record, main_id))
    if longest is None:
        return "no main loop ran for more than one iteration at record"
    total, main_id, load = longest
    return (
        f"dividing main loop {main_id} cannot pay: at record it ran {total:.1f}s keeping {load:.1f}"
        f" core(s) busy, and {jobs} workers on {cores} core(s) would save less than they cost to start"
    )


__all__ = [
    "cannot_pay",
    "concurrency",
    "loop_load",
    "machine_cores",
    "slowdown",
]
