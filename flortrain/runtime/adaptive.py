"""Adaptive checkpoint period: Flor's Joint Invariant (Eq. 4).

Materialize instance n of block i only if ``M_i / C_i < n_i / (k_i + 1) * min(1 / (1 + c), eps)``
where M_i is the (mean) time to materialize, C_i the (mean) time to compute, n_i the executions so
far, k_i the checkpoints so far. It bounds record overhead by eps and keeps restore + replay
cheaper than re-running (c = R/M). The first instance of a block is always materialized: M_i is
unknown until measured once. Where eps appears below, the period uses eps less a headroom for
what its estimate misses (the section on aiming below ε).

M_i is the time the training thread was blocked, plus the background writer's time for the
checkpoint *to the extent training leaves no core idle for it* (:func:`contention`). On a GPU
machine the CPUs are mostly idle and the writer is free; on a CPU-only machine whose cores
training saturates (this project's 2-core CI), the low-priority writer gets nothing until
training ends, and its whole backlog is then time the run waits; a bound that ignored it would
not bound the overhead.

**One budget for the run.** Eq. 4 bounds each block's M_i / C_i by ε on its own. A block nested
in a main loop and the loop's iteration boundary share the same seconds of training (the
iteration's compute contains the block's), so two blocks each within ε could together cost 2ε:
measured on an LSTM, the batch loop's checkpoint took 6.3% of an epoch and the boundary's 1.8%.
So a checkpoint Eq. 4 allows is also held to the run's budget: what flortrain has cost
training so far, plus this block's mean M, must stay within ε of the training time so far.
Checkpoints of a block and of the boundary after it then share the budget in the order training
reaches them. A boundary is also priced before it is staged (:meth:`AdaptivePeriod.affords`):
its size varies the most of any checkpoint.

**The budget is charged what checkpoints cost, and gives way to bookkeeping down to half.**
The budget is ε of the training time, and spent on checkpoints: their blocked time (declined
captures included) and the writer's estimated share. Training time, and a boundary's C in Eq. 4,
are the compute of the main-loop iterations net of everything flortrain held during them
(``Session.holding``), so flortrain's own bookkeeping never counts as compute a checkpoint
spares. That bookkeeping (block entries and ends, the RNG digests at every boundary, the alias
watch's first looks) is what flortrain held outside checkpoints: :attr:`AdaptivePeriod.held`
less :attr:`AdaptivePeriod.charged`. The period cannot make it cheaper, but it can leave room
for it: checkpoints may spend ε of the training time less the bookkeeping, and never less than
half of ε (:meth:`AdaptivePeriod.allowance`). So where bookkeeping stays under ε/2, all that
flortrain holds stays under ε. On nanoGPT's shape at 64 dimensions (25 ms steps) bookkeeping
held about 2% and checkpoints the whole 6.7%: 8% in all (stop 31). Where bookkeeping alone
exceeds ε, half of ε still goes to checkpoints: charging it in full was built and dropped at
stop 22, when a nanoGPT-shaped script whose bookkeeping exceeded ε took no boundary at all.

**A boundary waiting for the budget shares it with nested blocks.** A boundary lets a replay jump
over iterations; a nested block's checkpoint spares only that block. But blocks come in small
bites, each as soon as the budget has room, and a boundary (the whole model and optimizer) is
priced higher than any of them: on nanoGPT's shape, once the budget was tight, the micro-step
loop took every bite and the main loop no boundary at all, and a guarded probe's replay went
from 0.40 of a plain run to 0.78. So a boundary that Eq. 4 wanted and the budget turned down
is reserved for, once nested blocks have spent as much as its price since the latest boundary:
a nested block's checkpoint must then leave room for it (:meth:`AdaptivePeriod.reserved`).
Where the two compete, they share the budget about equally: the boundaries serve a probe that
runs in some iterations (a replay jumps over the others), the blocks' checkpoints one that runs
in every iteration (a replay skips the block in each). Reserving from the first refusal was
measured first: the boundaries then took nearly all of it (80 to 98 boundaries of 401 iterations,
16 to 18 micro-step checkpoints). A boundary that Eq. 4 itself turned down (its blocks cover its
iterations: the fine-tuning shape's) reserves nothing.

**A declined checkpoint is not free.** Pricing a boundary needs its state captured first, and
the capture held training up. A boundary turned down for its price charges the capture to the
run's budget (:meth:`AdaptivePeriod.declined`), and is not captured again until the budget could
take that capture and the checkpoint it priced. Before this, a loop whose boundaries never fit
(no boundary yet, so Eq. 4 said yes every time) paid a capture per iteration for nothing: 1.4 ms
of a 0.1 s epoch in the fine-tuning benchmark, outside every bound.

**A boundary is worth the compute its blocks' checkpoints leave.** Eq. 4 weighs a checkpoint's
cost against the compute it spares a replay. A main-loop boundary spares the iterations before
it, but where a nested block was checkpointed in an iteration, a replay restores that block
instead of computing it, and the boundary spares only the rest: the iteration's compute outside
the checkpointed blocks, plus the estimated time to restore them (c · M). So the boundary's C_i
is that uncovered compute (:meth:`AdaptivePeriod.materialized` accumulates what each nested
checkpoint covers, :meth:`AdaptivePeriod.executed` takes it off the iteration), while the run's
training time still counts the whole iteration. In the fine-tuning benchmark the batch loop is
the whole epoch and is checkpointed every epoch: the boundary after it would spare a replay
about 3 ms per epoch and cost 1.8 ms (its first, 70 ms: hashing the frozen table), and it was
taken whenever the run's budget had room, half the epochs. With its own C_i it is not taken, and
the budget it held is not spent. A loop with no memoized block inside (nanoGPT's ``while
True``) is unchanged: its iterations are all uncovered.

**And only the compute since the latest boundary.** A replay jumps to the latest boundary before
the iteration it needs, so a boundary spares the uncovered compute since the one before it, not
a share of the run's. Eq. 4's amortized form (the mean C, times n / (k + 1)) let compute that
an earlier boundary had already spared pay again: in the fine-tuning shape, a few epochs
whose block the budget turned down early in the run paid for a boundary after nearly every
later epoch, though the block was checkpointed in each (up to 21 boundaries of 60 epochs, 17 in
a row, about 1 ms each; stop 44). So a boundary is due once its price is within Eq. 4's
share of the uncovered compute since the latest one. Where a boundary takes several iterations
to pay for, what the last of them paid beyond its price counts toward the next, so the period
keeps Eq. 4's rate rather than rounding it down to whole iterations. Blocks keep the amortized
form: each checkpoint of a block spares its own instance, whatever came before.

**The period aims below ε, not at it** (:data:`HEADROOM`). ε is the user's ceiling, and what
the period counts is an estimate: the blocked time it measures, the writer's share it prices,
and the bookkeeping it allows for. What it cannot see is the training thread running slower
*after* a hook: the first step after a block's entry took 0.12 ms longer than in a plain run of
the fine-tuning shape with no checkpoint at all (its caches refilled after the hook's Python;
spinning OpenMP workers, ``OMP_WAIT_POLICY=ACTIVE``, did not change it), about 0.4 ms an epoch
in all, and the wall-clock overhead ran 2 to 3 points above the estimate on 31 ms epochs (stop 40).
A period that spent exactly ε landed on ε: the fine-tuning benchmark measured 6.8% against ε =
6.67% (stop 39). So Eq. 4 and the budget use ``(1 - HEADROOM)`` of ε: the estimate stays a
quarter below the ceiling. On the benchmark's shapes what it misses fits in that quarter; on
epochs of 31 ms it does not (docs/benchmarks.md, stop 40).

**A block whose instances cost less than a restore is not prepared for.** Eq. 4 bounds M/C by
``1 / (1 + c)``, but amortized over the instances since the last checkpoint: a loop of a few
microseconds (nanoGPT's ``for g in optimizer.param_groups: g['lr'] = lr``, whose changeset
reaches the whole model and optimizer) would still be checkpointed every few thousand
instances, and each such checkpoint makes a replay restore a model where running the loop takes
microseconds. Worse, every instance pays to be ready for one: the walk of the objects below its
changeset (``identity``) and the light alias watch. Without them, the median time to open and to
close a memoized loop on nanoGPT's shape fell from 150 and 187 µs to 61 and 105 µs, and the
record's held from 6.4% to 5.6% (stop 50). So once a block's compute is below ``c`` times what its
cheapest checkpoint held training, its instances are :meth:`AdaptivePeriod.futile`: they run as
recorded, not checkpointed and not prepared, with their compute still measured, so that a loop
whose instances grow dearer becomes a candidate again at once. The first instance is
checkpointed as before (M is unknown until then), and the alias watch's instances are watched
in full.

**A boundary at least every minute of training.** ``record --resume`` restarts a killed record
from a boundary checkpoint only; block checkpoints do not serve it. So a main loop whose latest
boundary is ``FLORTRAIN_BOUNDARY_INTERVAL`` seconds of training old (60 by default) takes one
even where Eq. 4 would not, within the run's budget: a few milliseconds a minute.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from flortrain import knobs


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

    def executed(self, block_id: str, compute_s: float, cpu_s: float | None = None, outer: bool = True) -> None:
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
        return max(c.compute / c.n, c.last) < self.restore_ratio * c.least

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
        if c.outer:  # a boundary with nothing uncovered since the last spares nothing, however cheap
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
            self.covered += max(c.last - self.restore_ratio * m, 0.0)
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
