"""Dividing a main loop among parallel-replay workers (Flor Sections 3.3.2 and 4.3).

Each worker re-runs the script's setup, resumes at its segment's first iteration and runs the
segment; the last one also runs the code after the loop. What a worker pays before its segment
depends on how it resumes:

- **direct resume**: a boundary checkpoint at the segment's first iteration holds the main
  loop's carried state (modules, optimizers, loaders, RNG streams and the carried names:
  ``lr``, ``best_val_loss``, ``global_step``...): restoring it is all it takes;
- **pseudoresume** (Flor 2.2.1): no such checkpoint, so the worker runs the iterations before
  its segment from the latest boundary checkpoint before it (or from the loop's start), with
  every memoized block restored from its checkpoint instead of executed, and its output unused.

The costs are the record's, priced by :mod:`flortrain.replay.costs` (:class:`LoopCosts`). The
division minimizes the slowest worker's estimated time: a bisection on that time, each step
asking which segment starts can be reached by ``k`` workers none of which takes longer.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from flortrain.replay.costs import LoopCosts
from flortrain.runtime.jumps import Segment


@dataclass(frozen=True)
class Planned:
    segment: Segment
    resume: str  # "start" | "direct" | "pseudo"
    resume_from: int  # the boundary restored before the segment (pseudo: -1 for the loop's start)
    estimate: float  # seconds

    def describe(self) -> str:
        s = self.segment
        last = "the end" if s.end is None else str(s.end - 1)
        what = f"iterations {s.start}..{last}" + (
            " and the code after the loop" if s.end is None else ""
        )
        if self.resume == "start":
            how = "from the start"
        elif self.resume == "direct":
            how = f"direct resume at boundary {s.start}"
        elif self.resume_from >= 0:
            how = f"pseudoresume: boundary {self.resume_from}, then iterations {self.resume_from}..{s.start - 1} with blocks restored"
        else:
            how = f"pseudoresume: iterations 0..{s.start - 1} with blocks restored"
        return f"{what} ({how}), about {self.estimate:.1f}s"


@dataclass(frozen=True)
class SegmentPlan:
    loop: LoopCosts
    workers: list[Planned]
    serial: float  # estimated seconds of a serial replay of the same plan

    @property
    def parallel(self) -> float:
        return max(w.estimate for w in self.workers)


class _Costs:
    """Prefix sums over one loop's iteration costs, and the cost of one worker's segment."""

    def __init__(self, loop: LoopCosts, boundaries: list[int]) -> None:
        self.loop = loop
        self.run = [0.0, *accumulate(loop.run)]
        self.pseudo = [0.0, *accumulate(loop.pseudo)]
        self.marks = sorted(b for b in boundaries if 0 < b < loop.n)

    def resume(self, a: int) -> tuple[str, int, float]:
        """How a worker starting at iteration ``a`` gets there, and what it costs."""
        if a == 0:
            return "start", -1, 0.0
        k = bisect_right(self.marks, a)
        if k:
            b = self.marks[k - 1]
            cost = self.loop.restore.get(b, 0.0) + self.pseudo[a] - self.pseudo[b]
            return ("direct" if b == a else "pseudo"), b, cost
        return "pseudo", -1, self.pseudo[a]

    def before(self, a: int) -> float:
        """What a worker starting at iteration ``a`` pays before it: start-up, the setup before
        the loop, and its resume."""
        return self.loop.startup + self.loop.pre + self.resume(a)[2]

    def worker(self, a: int, b: int) -> float:
        """Estimated seconds of a worker owning iterations ``a..b-1`` (``b == n``: to the end)."""
        cost = self.before(a) + self.run[b] - self.run[a]
        return cost + (self.loop.after if b == self.loop.n else 0.0)

    def farthest(self, a: int, limit: float) -> int:
        """The largest ``b > a`` with ``worker(a, b) <= limit`` (``a`` when even one iteration
        exceeds it). ``worker(a, b)`` grows with ``b`` except at ``n``, checked on its own."""
        fixed = self.before(a) - self.run[a]
        b = bisect_right(self.run, limit - fixed, a + 1, self.loop.n) - 1
        b = max(b, a)
        if b == self.loop.n - 1 and self.worker(a, self.loop.n) <= limit:
            return self.loop.n
        return b


def _reachable(costs: _Costs, workers: int, limit: float) -> list[int] | None:
    """Segment starts for at most ``workers`` workers none of which is estimated above
    ``limit``, or None. Level by level, the iterations the next segment may start at: each
    start ``a`` reaches every ``b`` up to ``farthest(a)``, and one such ``a`` is remembered."""
    n = costs.loop.n
    levels: list[dict[int, int]] = [{0: -1}]
    while not any(costs.worker(a, n) <= limit for a in levels[-1]):
        if len(levels) == workers:
            return None
        nxt: dict[int, int] = {}
        reach = 0
        for a in sorted(levels[-1]):
            top = min(costs.farthest(a, limit), n - 1)
            for b in range(max(a, reach) + 1, top + 1):
                nxt[b] = a
            reach = max(reach, top)
        if not nxt:
            return None
        levels.append(nxt)
    start = min(a for a in levels[-1] if costs.worker(a, n) <= limit)
    out = [start]
    for level in reversed(levels[1:]):
        out.append(level[out[-1]])
    return out[::-1]


def divide(
    loop: LoopCosts, boundaries: list[int], workers: int, shape: LoopCosts | None = None
) -> SegmentPlan:
    """The division of ``loop`` among at most ``workers`` workers with the smallest estimated
    slowest worker (a single worker when the loop cannot be divided usefully). ``shape``, when
    given, is the cost model the division minimizes instead (:func:`even`); the estimates are
    still ``loop``'s."""
    costs = _Costs(loop, boundaries)
    n = loop.n
    serial = costs.worker(0, n) - loop.startup
    starts = [0]
    if workers > 1 and n > 1:
        model = costs if shape is None else _Costs(shape, boundaries)
        lo, hi = 0.0, model.worker(0, n)
        for _ in range(48):
            mid = (lo + hi) / 2
            found = _reachable(model, workers, mid)
            if found is None:
                lo = mid
            else:
                hi, starts = mid, found
            if hi - lo <= 1e-3 * max(hi, 1e-9):
                break
    planned = []
    for k, a in enumerate(starts):
        b = starts[k + 1] if k + 1 < len(starts) else n
        kind, frm, _ = costs.resume(a)
        seg = Segment(loop.main_id, loop.entry, a, None if b == n else b)
        planned.append(Planned(seg, kind, frm, costs.worker(a, b)))
    return SegmentPlan(loop, planned, serial)


def even(loop: LoopCosts) -> LoopCosts:
    """The same loop with every iteration costing the same and resuming almost free: dividing
    it gives segments of about equal iteration counts (``FLORTRAIN_SEGMENTS=even``)."""
    n = loop.n
    return LoopCosts(
        loop.main_id, loop.entry, 0.0, [1.0] * n, [1e-3] * n, dict.fromkeys(range(n), 1e-3)
    )


__all__ = ["Planned", "SegmentPlan", "divide", "even"]
