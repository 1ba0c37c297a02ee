"""Adaptive checkpoint period: Flor's Joint Invariant (Eq. 4).

Materialize instance n of block i only if ``M_i / C_i < n_i / (k_i + 1) * min(1 / (1 + c), eps)``
where M_i is the (mean) time to materialize, C_i the (mean) time to compute, n_i the executions so
far, k_i the checkpoints so far. It bounds record overhead by eps and keeps restore + replay
cheaper than re-running (c = R/M). The first instance of a block is always materialized: M_i is
unknown until measured once.

M_i is the time the training thread was blocked, plus the background writer's time for the
checkpoint *to the extent training leaves no core idle for it* (:func:`contention`): on a machine
whose cores training saturates, the writer's backlog is time the run waits.

Beyond Eq. 4 the period keeps these rules (measurements in docs/benchmarks.md):

* **One budget for the run.** Nested blocks and the main loop's boundary share the same seconds
  of training, so every checkpoint Eq. 4 allows is also held to the run's budget: what flortrain
  has cost so far, plus this block's mean M, must stay within ε of the training time so far.
* **Bookkeeping gets room, down to half.** Training time and a boundary's C are net of
  everything flortrain held (``Session.holding``). Checkpoints may spend ε less the bookkeeping
  held outside them, never less than ε/2 (:meth:`AdaptivePeriod.allowance`).
* **A waiting boundary shares the budget with nested blocks.** A boundary Eq. 4 wanted and the
  budget turned down is reserved for once nested blocks have spent its price since the latest
  boundary (:meth:`AdaptivePeriod.reserved`), so the two share the budget about equally.
* **A declined checkpoint is not free.** Its capture is charged to the budget
  (:meth:`AdaptivePeriod.declined`), and the boundary is not captured again until the budget
  could take that capture and the checkpoint.
* **A boundary is worth the compute its blocks' checkpoints leave**, since the latest boundary:
  its C is the iteration's compute outside checkpointed blocks plus the time to restore them
  (:meth:`AdaptivePeriod.materialized`, :meth:`AdaptivePeriod.executed`). What a boundary paid
  beyond its price counts toward the next, keeping Eq. 4's rate.
* **The period aims below ε** (:data:`HEADROOM`): its estimate misses the training thread running
  slower after a hook, so Eq. 4 and the budget use ``(1 - HEADROOM)`` of ε.
* **A block cheaper than a restore is not prepared for.** Once a block's compute is below ``c``
  times its cheapest checkpoint's held time, its instances are :meth:`AdaptivePeriod.futile`:
  run as recorded, neither checkpointed nor prepared, their compute still measured so a block
  that grows dearer becomes a candidate again.
* **A boundary at least every minute of training.** ``record --resume`` restarts only from a
  boundary, so a main loop whose latest boundary is ``FLORTRAIN_BOUNDARY_INTERVAL`` seconds old
  (60 by default) takes one even where Eq. 4 would not, within the run's budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from flortrain import knobs
from flortrain.checkpoint.cost import restore_price


def contention(wall_s: float, cpu_s: float, cores: int | None = None) -> float:
    """How much of the background writer's CPU time comes out of training, 0 to 1, from the
    process's CPU time over the wall time of the block it just ran: a process that kept every
    core busy leaves the writer nothing idle (1); one that left a core free does not feel it (0)."""
    n = cores or os.cpu_count() or 1
    if wall_s <= 0:
        return 0.0
    return min(1.0, max(0.0, cpu_s / wall_s - (n - 1)))


#: The share of ε the period keeps for what its estimate misses (see the module docstring):
#: checkpoints and bookkeeping are budgeted to ``(1 - HEADROOM) * epsilon`` of training.
HEADROOM = 0.25


@dataclass
class BlockCosts:
    n: int = 0  # executions
    k: int = 0  # checkpoints
    #: total C: for a main loop, of its iterations' compute outside nested checkpointed blocks
    compute: float = 0.0
    #: for a main loop, that compute since its latest boundary checkpoint: what the next boundary
    #: would spare a replay (Eq. 4's C for a boundary, see the module docstring), and the
    #: latest iteration's share of it
    uncovered: float = 0.0
    left: float = 0.0
    last: float = 0.0  # C of the latest instance
    since: float = 0.0  # training seconds of an outer unit since its latest checkpoint
    materialize: float = 0.0  # total M over the k checkpoints
    #: the least time one of its checkpoints held training (:meth:`AdaptivePeriod.futile`)
    least: float = float("inf")
    contention: float = 0.0  # of the latest instance (see `contention`)
    outer: bool = True  # its compute is training time of its own, not part of an enclosing unit's
    priced: float = 0.0  # M of the latest checkpoint :meth:`AdaptivePeriod.affords` turned down
    #: what the latest declined attempt would cost again (its capture and its M); 0: none since
    #: the last checkpoint
    declined: float = 0.0
    #: for a main loop, the price of a boundary Eq. 4 wanted and the budget turned down (0:
    #: none): nested blocks leave room for it (:meth:`AdaptivePeriod.reserved`)
    waiting: float = 0.0


@dataclass
class AdaptivePeriod:
    epsilon: float = field(default_factory=knobs.epsilon)
    restore_ratio: float = knobs.DEFAULT_RESTORE_RATIO
    every: bool = field(default_factory=lambda: knobs.period() == "every")
    boundary_interval: float = field(default_factory=knobs.boundary_interval)
    costs: dict[str, BlockCosts] = field(default_factory=dict)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: the run's budget (:attr:`spent` within ε of :attr:`training`): seconds checkpoints held
    #: the training thread (their staging, and the captures of declined ones); the writer's
    #: estimated seconds that came out of training (its time under contention, summed over
    #: checkpoints); training time of the outermost units, net of what flortrain held inside them
    charged: float = 0.0
    writer: float = 0.0
    training: float = 0.0
    #: all the time flortrain's code held the training thread, measured (``Session.holding``):
    #: reported, and taken out of the iterations' compute; not charged to the budget (see the
    #: module docstring)
    held: float = 0.0
    #: compute of the outer unit in progress that nested checkpoints already memoize (the
    #: blocks' compute and checkpoint time, less the estimated time to restore them)
    covered: float = 0.0
    #: M of nested blocks' checkpoints since the latest boundary checkpoint (:meth:`reserved`)
    nested: float = 0.0

    @property
    def target(self) -> float:
        """The overhead the period aims at: ε less its :data:`HEADROOM`."""
        return self.epsilon * (1.0 - HEADROOM)

    @property
    def spent(self) -> float:
        """What checkpoints have cost training so far: the time they held the training thread
        (declined captures included) and the writer's share."""
        return self.charged + self.writer

    def executed(
        self, block_id: str, compute_s: float, cpu_s: float | None = None, outer: bool = True
    ) -> None:
        """Account an instance of a block. ``outer``: no other accounted unit encloses it (a
        main-loop iteration; not a block, which runs inside one), so its compute is the run's;
        it is given net of the time flortrain held training during it."""
        c = self.costs.setdefault(block_id, BlockCosts())
        c.n += 1
        c.outer = outer
        c.last = compute_s
        if outer:
            self.training += compute_s
            # Eq. 4's C for a boundary: what a replay would compute without it
            c.left = max(compute_s - self.covered, 0.0)
            c.compute += c.left
            c.uncovered += c.left
            self.covered = 0.0
            c.since += compute_s
        else:
            c.compute += compute_s
        if cpu_s is not None:
            c.contention = contention(compute_s, cpu_s, self.cores)

    def should_materialize(self, block_id: str, ongoing: float = 0.0) -> bool:
        """Eq. 4 for this block, and the run's budget. ``ongoing``: seconds of the outer unit in
        progress (the main-loop iteration a nested block is part of), not accounted yet."""
        c = self.costs.setdefault(block_id, BlockCosts())
        if self.every:
            return True
        if c.declined and not self._affordable(c, c.declined, ongoing):
            return False
        if c.k == 0:
            return True
        return self._affordable(c, c.materialize / c.k, ongoing)

    def futile(self, block_id: str) -> bool:
        """Whether a checkpoint of this block's next instance could only slow a replay down: the
        instances compute in less time than a restore takes (``c`` times M, Eq. 3), so skipping
        one costs more than running it. Asked as an instance opens, once M is measured and the
        alias watch's instances are past: a futile instance is not prepared for a checkpoint
        (see the module docstring). Never in ``FLORTRAIN_PERIOD=every``.

        Judged cautiously, since a futile block is never checkpointed again to correct it: M is
        the least time one of its checkpoints held training (not the mean M, which counts the
        writer's share and a first checkpoint's one-off hashing), and C the larger of its mean
        and its latest instance, so that one dear instance makes the next a candidate again."""
        c = self.costs.get(block_id)
        if self.every or c is None or c.outer or c.k == 0 or c.n < knobs.ALIAS_WATCH_INSTANCES:
            return False
        return max(c.compute / c.n, c.last) < restore_price(self.restore_ratio, c.least)

    def _affordable(self, c: BlockCosts, m: float, ongoing: float = 0.0) -> bool:
        """Eq. 4 and the run's budget for a checkpoint of ``m`` seconds. A nested block's must
        leave room for the boundaries waiting; a boundary Eq. 4 wants and the budget refuses
        starts waiting."""
        due = self._due(c, m)
        fits = self._fits(m + (0.0 if c.outer else self.reserved()), ongoing)
        if c.outer:
            c.waiting = m if due and not fits else 0.0
        return due and fits

    def loop_ended(self, block_id: str) -> None:
        """A main loop has exited: a boundary it was waiting for will not come."""
        c = self.costs.get(block_id)
        if c is not None:
            c.waiting = 0.0

    def reserved(self) -> float:
        """What the boundaries waiting for the budget will cost, once nested blocks have spent as
        much since the latest boundary (see the module docstring); 0 until then."""
        waiting = sum(c.waiting for c in self.costs.values() if c.outer)
        return waiting if self.nested >= waiting else 0.0

    def _due(self, c: BlockCosts, m: float) -> bool:
        """Eq. 4 for one more checkpoint of mean cost ``m``; for a main loop, also its latest
        boundary being ``boundary_interval`` seconds of training old (``record --resume``)."""
        return self._eq4(c, m) or (c.outer and c.since >= self.boundary_interval)

    def _eq4(self, c: BlockCosts, m: float) -> bool:
        """Eq. 4 for one more checkpoint of mean cost ``m``. A main loop's boundary is weighed
        against the compute it spares, the uncovered compute since the latest boundary, not the
        run's average (see the module docstring)."""
        if (
            c.outer
        ):  # a boundary with nothing uncovered since the last spares nothing, however cheap
            return c.uncovered > 0 and m <= c.uncovered * self._share()
        cc = c.compute / max(c.n, 1)
        if cc <= 0:
            return False
        return m / cc < c.n / (c.k + 1) * self._share()

    def _share(self) -> float:
        """Eq. 4's bound on M / C: ε's target, or less where restoring would cost more than
        recomputing (c = R / M)."""
        return min(1.0 / (1.0 + self.restore_ratio), self.target)

    def affords(self, block_id: str, blocked_s: float, background_s: float) -> bool:
        """Whether a checkpoint of these estimated costs (before it is staged) fits the run's
        budget: its M would be the blocked time plus the writer's time under contention. Asked
        of iteration boundaries, whose cost varies most (a boundary holds every live module: the
        first one writes a frozen table that blocks never do)."""
        if self.every:
            return True
        c = self.costs.setdefault(block_id, BlockCosts())
        c.priced = blocked_s + c.contention * background_s
        return self._affordable(c, c.priced)

    def declined(self, block_id: str, capture_s: float) -> None:
        """Account a checkpoint :meth:`affords` turned down after ``capture_s`` seconds spent
        capturing it: training was held that long, so the run's budget pays it, and the block is
        not tried again until the budget could pay the capture and the checkpoint."""
        c = self.costs.setdefault(block_id, BlockCosts())
        self.charged += capture_s
        c.declined = capture_s + c.priced

    @property
    def bookkeeping(self) -> float:
        """Seconds flortrain held the training thread outside checkpoints (hooks, digests, the
        alias watch): everything held less what checkpoints and declined captures held."""
        return max(self.held - self.charged, 0.0)

    def allowance(self, training: float) -> float:
        """What checkpoints may cost over ``training`` seconds of training: the :attr:`target`
        share of it less the bookkeeping, and never less than half of that (see the module
        docstring)."""
        budget = self.target * training
        return max(budget - self.bookkeeping, budget / 2)

    def _fits(self, m: float, ongoing: float = 0.0) -> bool:
        """The run's budget: everything spent, plus a checkpoint costing ``m``, within the
        allowance of the training time so far (``ongoing``: of the outer unit in progress, not
        accounted yet)."""
        return self.spent + m <= self.allowance(self.training + ongoing)

    def materialized(self, block_id: str, blocked_s: float, background_s: float = 0.0) -> float:
        """Account a checkpoint; returns its M: the time training was blocked plus the writer's
        time for it as far as training leaves the writer no idle core."""
        c = self.costs.setdefault(block_id, BlockCosts())
        c.k += 1
        c.declined = 0.0
        c.waiting = 0.0
        c.since = 0.0
        share = c.contention * background_s
        m = blocked_s + share
        c.materialize += m
        c.least = min(c.least, blocked_s)
        self.charged += blocked_s
        self.writer += share
        if not c.outer:  # a replay restores this instance rather than computing it
            self.covered += max(c.last - restore_price(self.restore_ratio, m), 0.0)
            self.nested += m
        else:
            self.nested = 0.0
            # where a boundary takes several iterations to pay for, what its compute paid beyond
            # its price carries over, up to one iteration's worth: the period keeps Eq. 4's rate
            # instead of rounding it down to whole iterations, and compute the budget refused
            # for longer buys no burst of boundaries
            price = m / self._share()
            c.uncovered = min(max(c.uncovered - price, 0.0), c.left) if c.left < price else 0.0
        return m

    def hold(self, seconds: float) -> None:
        """Account time flortrain's code held the training thread (``Session.holding``)."""
        self.held += seconds
