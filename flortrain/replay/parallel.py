"""``flortrain replay --jobs N``: the driver of a parallel replay (Flor Sections 3.3.2, 4.3).

The driver plans, starts one fresh worker per segment of the main loop
(:mod:`flortrain.replay.segments`, :mod:`flortrain.replay.backends`), and merges what they
return into one replay run, as if one process had run it:

- output: worker 1's lines before the loop, then every worker's lines of the iterations it owns,
  in loop order, then the last worker's lines after the loop; printed as soon as every earlier
  segment has been printed, so stdout reads as one run;
- rows (block instances, iterations, jumps): the owner's, for the segmented loop's iterations;
  the first worker's and the last's for everything else;
- a worker that fails fails the replay: the output of the segments before it and its own are
  printed, then its stderr (the traceback), and the replay exits with its status.

``flortrain diff`` then checks the merged run against the record exactly as it checks a serial
replay: output, RNG streams at every iteration boundary, state digests.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from flortrain import knobs
from flortrain.errors import FlortrainError
from flortrain.replay import backends, costs
from flortrain.replay.backends import Outcome
from flortrain.replay.conclusion import conclude, open_run
from flortrain.replay.costs import WORTHWHILE, LoopCosts
from flortrain.replay.files import begin_files, end_files
from flortrain.replay.preparation import Prepared
from flortrain.replay.segments import SegmentPlan, divide, even
from flortrain.replay.sharing import slowdown
from flortrain.replay.worker import GuardSpec, WorkerResult, WorkerTask
from flortrain.runtime.jumps import Segment
from flortrain.store.logs import LogEntry
from flortrain.store.records import RunStatus


def _say(msg: str) -> None:
    print(f"flortrain: {msg}", file=sys.stderr, flush=True)


def loop_costs(p: Prepared) -> list[LoopCosts]:
    """Per main-loop entry the record ran for two iterations or more, what each iteration cost
    it (:func:`flortrain.replay.costs.loop_costs`)."""
    record = p.record
    end = record.duration if record.effective_status == RunStatus.COMPLETE else None
    times = p.store.iteration_times(record.id)
    return costs.loop_costs(times, p.blocks, p.checkpoints, p.rplan.execute, p.restore_ratio, end)


def _resumable(p: Prepared, main_id: str) -> bool:
    """Whether a worker may restore this main loop's boundary checkpoints."""
    return main_id not in p.rplan.unresumable and knobs.resume() == "direct"


def plan_segments(p: Prepared, jobs: int, backend: str = "local") -> tuple[SegmentPlan | None, str]:
    """The division of the main loop worth dividing, or None and why the replay stays serial.
    Local workers share this machine's cores (:mod:`flortrain.replay.sharing`): the estimate
    of a division counts the queueing when they ask for more cores than there are."""
    if not p.rplan.probes:
        return None, "no probes: the replay only re-runs what has no checkpoint"
    if not p.compares:
        return None, "new script arguments: the record's iterations are not this run's to divide"
    if p.files is not None and p.files.read_back:
        shown = ", ".join(p.files.shown(f) for f in p.files.read_back[:3])
        return (
            None,
            f"the script reads back files it writes ({shown}): workers in one directory would overwrite each other's",
        )
    loops = []
    carried = []
    for loop in loop_costs(p):
        if p.rplan.spans.get(loop.main_id) == []:
            continue  # no probe in it: a serial replay jumps over its iterations
        if loop.main_id in p.rplan.carried:
            carried.append(loop.main_id)  # a worker would start the probes' state afresh
            continue
        loops.append(loop)
    if not loops and carried:
        m = carried[0]
        return None, (
            f"main loop {m} carries probe state: {p.rplan.carried[m]}; no checkpoint holds it, so a"
            " worker resuming at a later iteration would start it afresh"
        )
    if not loops:
        return None, "no main loop with a probe in it ran for more than one iteration"
    loop = max(loops, key=lambda lc: sum(lc.run))
    marks = p.boundaries.get((loop.main_id, loop.entry), []) if _resumable(p, loop.main_id) else []
    if knobs.segments() == "even":
        plan = divide(loop, marks, jobs, shape=even(loop))
        return (
            (plan, "")
            if len(plan.workers) > 1
            else (None, f"main loop {loop.main_id} has one iteration")
        )
    plan = divide(loop, marks, jobs)
    slow = slowdown(p.record, loop.main_id, len(plan.workers)) if backend == "local" else 1.0
    if len(plan.workers) < 2 or plan.parallel * slow > WORTHWHILE * plan.serial:
        shared = (
            f", {len(plan.workers)} workers sharing the cores"
            if slow > 1.0 and len(plan.workers) > 1
            else ""
        )
        return None, (
            f"dividing main loop {loop.main_id} would not pay (estimated {plan.parallel * slow:.1f}s{shared}"
            f" against {plan.serial:.1f}s serially)"
        )
    return plan, ""


def worker_task(
    p: Prepared,
    index: int,
    segment: Segment,
    blobs: str,
    execute: frozenset[str],
    guards: dict[str, list[GuardSpec]],
    marks: dict[tuple[str, int], list[int]],
) -> WorkerTask:
    """The task of a worker replaying ``segment`` of the prepared replay, ``execute`` the
    blocks it runs (``verify``'s resumes run every block, with no guards)."""
    return WorkerTask(
        index,
        p.script,
        os.getcwd(),
        p.args,
        p.record.threads,
        p.uses_torch,
        p.code_text,
        p.disk_text,
        p.modules,
        p.record.id,
        execute,
        p.checkpoints,
        guards,
        p.store.iteration_scalars(p.record.id),
        marks,
        segment,
        blobs,
        {k: v for k, v in p.record.meta.items() if k == "deterministic"},
    )


def _tasks(p: Prepared, plan: SegmentPlan, blobs: str) -> list[WorkerTask]:
    marks = {k: v for k, v in p.boundaries.items() if _resumable(p, k[0])}
    guards = {
        m: [(g.source, g.recorded, g.live, g.through) for g in gs]
        for m, gs in p.rplan.spans.items()
    }
    execute = frozenset(p.rplan.execute)
    return [
        worker_task(p, k, w.segment, blobs, execute, guards, marks)
        for k, w in enumerate(plan.workers)
    ]


def _owned(
    seg: Segment, main_id: str | None, entry: int | None, iteration: int | None
) -> bool | None:
    """Whether a row of this main-loop iteration belongs to the worker of ``seg`` (None: a row
    of another loop, or of no loop)."""
    if main_id is None or entry is None or iteration is None or not seg.owns(main_id, entry):
        return None
    return seg.start <= iteration and (seg.end is None or iteration < seg.end)


def _part(seg: Segment, r: WorkerResult, first: bool, last: bool) -> list[LogEntry]:
    """The lines a worker contributes: before the loop (the first worker), its iterations,
    after the loop (the last worker)."""
    enter, leave = r.marks.get("enter"), r.marks.get("exit")
    out = []
    for e in r.logs:
        if enter is None or e.seq < enter:
            keep = first
        elif leave is not None and e.seq >= leave:
            keep = last
        else:
            keep = _owned(seg, e.main_id, e.main_inst, e.iteration) is not False
        if keep:
            out.append(e)
    return out


def _rows(
    seg: Segment, rows: list[Any], where: Callable[[Any], tuple[Any, Any, Any]], outer: bool
) -> list[Any]:
    """A worker's rows to keep: its own iterations', and (``outer``: the first and last
    workers) those of other loops."""
    keep = []
    for row in rows:
        owned = _owned(seg, *where(row))
        if owned or (owned is None and outer):
            keep.append(row)
    return keep


def _resume(seg: Segment, r: WorkerResult) -> str:
    """How the worker reached its segment, from the jumps it made before it."""
    if seg.start == 0:
        return "from the start"
    before = [j for j in r.jumps if seg.owns(j[0], j[1]) and j[2] < seg.start]
    resumed = max((j[3] for j in before), default=-1)
    if resumed == seg.start:
        return f"direct resume at iteration {seg.start}"
    how = (
        f"pseudoresume from the boundary at iteration {resumed}"
        if resumed > 0
        else "pseudoresume from the loop's start"
    )
    if r.forwarded:
        lines = ", ".join(str(line) for line in sorted(r.forwarded))
        left = sum(r.forwarded.values())
        how += f", fast-forward left out {left} statement(s) at line(s) {lines}"
    return how


class _Printer:
    """Prints the merged output in loop order as segments complete, and each worker's stderr
    once per distinct line (the setup every worker repeats warns once, not N times)."""

    def __init__(self, plan: SegmentPlan) -> None:
        self.plan = plan
        self.next = 0
        self.seen: set[str] = set()
        self.lines: list[LogEntry] = []

    def ready(self, outcomes: dict[int, Outcome], upto: int) -> None:
        n = len(self.plan.workers)
        while self.next <= upto and self.next in outcomes:
            k = self.next
            o = outcomes[k]
            if o.result is not None:
                part = _part(self.plan.workers[k].segment, o.result, k == 0, k == n - 1)
                self.lines.extend(part)
                unterminated = o.result.unterminated and k == n - 1
                text = "".join(e.text + "\n" for e in part)
                sys.stdout.write(text[:-1] if unterminated and text else text)
                sys.stdout.flush()
            if o.status != 0:
                sys.stderr.write(o.stderr)
            else:
                for line in o.stderr.splitlines(keepends=True):
                    if line not in self.seen:
                        self.seen.add(line)
                        sys.stderr.write(line)
            sys.stderr.flush()
            self.next += 1


def _run_workers(
    plan: SegmentPlan,
    tasks: list[WorkerTask],
    backend_name: str,
    warm: backends.LocalBackend | None,
) -> tuple[dict[int, Outcome], int | None, _Printer]:
    """Start every worker, collect their outcomes, print in order; the first failing segment
    (in loop order) ends the replay once the segments before it are in."""
    n = len(tasks)
    backend = backends.make(backend_name, warm)
    printer = _Printer(plan)
    outcomes: dict[int, Outcome] = {}
    failed: int | None = None
    try:
        t0 = time.perf_counter()
        for task, w in zip(tasks, plan.workers, strict=True):
            backend.submit(task)
            _say(f"worker {task.index + 1}/{n} started: {w.describe()}")
        while True:
            for o in backend.wait(1.0):
                outcomes[o.index] = o
                seg = plan.workers[o.index].segment
                if o.status == 0 and o.result is not None:
                    _say(
                        f"worker {o.index + 1}/{n} done at {time.perf_counter() - t0:.1f}s"
                        f" ({_resume(seg, o.result)}; its script ran {o.result.elapsed:.1f}s)"
                    )
                else:
                    _say(f"worker {o.index + 1}/{n} failed (exit {o.status})")
                    if failed is None or o.index < failed:
                        failed = o.index
            upto = n - 1 if failed is None else failed
            printer.ready(outcomes, upto)
            if printer.next > upto:
                break
    except KeyboardInterrupt:
        backend.cancel()
        raise
    finally:
        backend.close()
    return outcomes, failed, printer


def _merge(
    p: Prepared, run: int, plan: SegmentPlan, outcomes: dict[int, Outcome], printer: _Printer
) -> dict[str, int]:
    """Write the merged rows under the replay run; the block and jump counts."""
    store = p.store
    n = len(plan.workers)
    counts: dict[str, int] = {}
    store.put_logs(run, [dataclasses.replace(e, seq=i) for i, e in enumerate(printer.lines)])
    blocks: dict[str, Any] = {}  # by key: the first and last workers both ran the setup's loops
    jumps: dict[tuple[str, int, int], int] = {}
    for k, w in enumerate(plan.workers):
        r = outcomes[k].result if k in outcomes else None
        if r is None:
            continue
        seg, outer = w.segment, k in (0, n - 1)
        store.put_iterations(
            run, _rows(seg, r.iterations, lambda row: (row[0], row[1], row[2]), outer)
        )
        blocks.update(
            (row.key, row)
            for row in _rows(
                seg, r.blocks, lambda row: (row.main_id, row.main_inst, row.iteration), outer
            )
        )
        jumps.update(
            ((m, e, first), resumed)
            for m, e, first, resumed in _rows(
                seg, r.jumps, lambda row: (row[0], row[1], row[2]), outer
            )
        )
    store.put_blocks(run, blocks.values())
    for row in blocks.values():
        counts[row.state] = counts.get(row.state, 0) + 1
    for (m, e, first), resumed in jumps.items():
        store.put_jump(run, m, e, first, resumed)
        counts["jumped"] = counts.get("jumped", 0) + resumed - first
    return counts


def replay_parallel(
    p: Prepared,
    jobs: int,
    backend_name: str,
    blobs: str | None,
    warm: backends.LocalBackend | None = None,
) -> int | None:
    """Run the replay on ``jobs`` workers; None when it is better run serially (said why).
    ``warm``: local workers started before planning (:class:`backends.LocalBackend`); the
    caller closes them."""
    plan, why = plan_segments(p, jobs, backend_name)
    if plan is None:
        _say(f"replaying serially: {why}")
        return None
    n = len(plan.workers)
    slow = slowdown(p.record, plan.loop.main_id, n) if backend_name == "local" else 1.0
    _say(
        f"parallel replay: main loop {plan.loop.main_id} in {n} segments on {backend_name} workers,"
        f" estimated {plan.parallel * slow:.1f}s (serially {plan.serial:.1f}s)"
    )
    for k, w in enumerate(plan.workers):
        _say(f"  segment {k + 1}: {w.describe()}")
    left = p.rplan.fast_forward(plan.loop.main_id)
    if left is not None and any(w.resume == "pseudo" for w in plan.workers):
        if knobs.fast_forward() == "on":
            _say(f"  while pseudoresuming, a worker leaves out (fast-forward) {left}")
        else:
            _say(
                "  while pseudoresuming, a worker runs every statement (FLORTRAIN_FAST_FORWARD=off)"
            )
    location = blobs or str(p.store.blobs)
    if backend_name == "ray" and blobs is None:
        _say(
            f"  Ray workers read checkpoints from {location} (--blobs URL to use another location)"
        )
    run = open_run(
        p, {"jobs": jobs, "backend": backend_name, "segments": [w.describe() for w in plan.workers]}
    )
    tasks = _tasks(p, plan, location)
    t0 = time.perf_counter()
    if p.files is not None:  # every worker's prologue starts from the files the record started from
        begin_files(p.files, p.store, run)
    try:
        outcomes, failed, printer = _run_workers(plan, tasks, backend_name, warm)
    except FlortrainError:
        p.store.finish_run(run, RunStatus.FAILED, 2)
        raise
    finally:
        if p.files is not None:
            end_files(p.files)
    counts = _merge(p, run, plan, outcomes, printer)
    status = 0 if failed is None else max(outcomes[failed].status, 1)  # killed by a signal: 1
    return conclude(p, run, status, time.perf_counter() - t0, counts, f" on {n} workers")


__all__ = ["loop_costs", "plan_segments", "replay_parallel"]
