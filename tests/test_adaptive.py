"""Flor's Joint Invariant (Eq. 4) with injected costs: the decision must not depend on a clock."""

from __future__ import annotations

import itertools

import pytest

from flortrain.checkpoint.period import HEADROOM, AdaptivePeriod, BlockCosts, contention
from flortrain.errors import FlortrainError


def _checkpoint(
    period: AdaptivePeriod, block_id: str, blocked: float, background: float = 0.0
) -> float:
    """A checkpoint as the session accounts it: it held training ``blocked`` seconds (measured
    around the hook, ``Session.holding``), and the writer will take ``background``."""
    period.hold(blocked)
    return period.materialized(block_id, blocked, background)


def _run(period: AdaptivePeriod, instances: int, compute: float, materialize: float) -> list[bool]:
    """Drive one block through ``instances`` executions, each the whole of an iteration of the
    main loop it runs in (as every recorded block does: ``SkipBlock._record``); return which
    were materialized. The main loop's boundaries are not asked for."""
    decisions = []
    for _ in range(instances):
        period.executed("L1", compute, outer=False)
        take = period.should_materialize("L1", ongoing=compute)
        decisions.append(take)
        if take:
            _checkpoint(period, "L1", materialize)
        period.executed("M0", compute)  # the iteration: training time for the run's budget
    return decisions


def test_first_instance_is_always_materialized_even_when_costly() -> None:
    decisions = _run(
        AdaptivePeriod(epsilon=1 / 15, every=False), 10, compute=0.001, materialize=10.0
    )
    assert decisions[0] is True
    assert not any(decisions[1:])


def test_cheap_materialization_checkpoints_every_instance() -> None:
    # M/C = 0.001 is far below ε / (k+1) * n for every n: each instance is taken.
    decisions = _run(
        AdaptivePeriod(epsilon=1 / 15, every=False), 20, compute=1.0, materialize=0.001
    )
    assert all(decisions)


def test_period_spreads_checkpoints_so_overhead_stays_under_epsilon() -> None:
    # M/C = 0.2 with ε = 1/15: Eq. 4 takes instance n only while k+1 < n·ε/(M/C) = n/3.
    eps, compute, materialize = 1 / 15, 1.0, 0.2
    period = AdaptivePeriod(epsilon=eps, every=False)
    assert period.target == pytest.approx(eps * (1 - HEADROOM))  # it aims below ε
    decisions = _run(period, 300, compute=compute, materialize=materialize)
    taken = sum(decisions)
    assert 1 < taken < 300
    # The overhead bound the invariant promises, measured over the whole run (the forced first
    # checkpoint is the only excess allowed).
    assert (taken - 1) * materialize <= period.target * 300 * compute
    # And it is not needlessly sparse: close to the bound, within one checkpoint's worth.
    assert taken * materialize >= period.target * 300 * compute - materialize - 1e-9


def test_restore_ratio_caps_the_bound_when_epsilon_is_loose() -> None:
    # With ε = 10 the cap is 1/(1+c) = 0.5 for c = 1: M/C = 0.8 must still be spread out.
    period = AdaptivePeriod(epsilon=10.0, restore_ratio=1.0, every=False)
    n, compute, materialize = 100, 1.0, 0.8
    decisions = _run(period, n, compute=compute, materialize=materialize)
    taken, cap = sum(decisions), 1 / (1 + 1.0)
    assert period.target > cap  # ε alone would allow every instance: the cap is what binds
    # the capped overhead bound over the whole run (the forced first checkpoint the only excess),
    # and no sparser than one checkpoint's worth below it
    assert (taken - 1) * materialize <= cap * n * compute
    assert taken * materialize >= cap * n * compute - materialize - 1e-9


def test_every_mode_ignores_costs() -> None:
    decisions = _run(AdaptivePeriod(every=True), 5, compute=0.0, materialize=100.0)
    assert decisions == [True] * 5


def test_each_block_has_its_own_first_checkpoint() -> None:
    period = AdaptivePeriod(epsilon=1 / 15, every=False)
    _run(period, 5, compute=0.001, materialize=10.0)
    period.executed("L2", 1.0, outer=False)
    assert period.should_materialize("L2", ongoing=1.0) is True


def _iterations(
    period: AdaptivePeriod,
    n: int,
    block_m: float,
    boundary_m: float,
    block_c: float = 1.0,
    hooks: float = 0.0,
) -> tuple[int, int]:
    """A main loop of ``n`` iterations of 1 second of wall time, each a nested block of
    ``block_c`` seconds then the next iteration's boundary, with ``hooks`` seconds of
    flortrain's bookkeeping in each; (block checkpoints, boundary checkpoints)."""
    blocks = boundaries = 0
    for _ in range(n):
        period.hold(hooks)
        held = hooks
        period.executed("L2", block_c, outer=False)  # nested: its seconds are the iteration's
        if period.should_materialize("L2", ongoing=block_c):
            held += block_m
            _checkpoint(period, "L2", block_m)
            blocks += 1
        period.executed("M1", 1.0 - held)  # the iteration, net of what flortrain held in it
        if period.should_materialize("M1"):
            _checkpoint(period, "M1", boundary_m)
            boundaries += 1
    return blocks, boundaries


def test_a_nested_block_and_its_boundary_share_one_budget() -> None:
    """A block of half the iteration and the boundary after it each cost 3/4 of the period's
    target share of an iteration (ε less the headroom: 5%): Eq. 4 alone would take both every
    time; the run's budget holds their sum to the target."""
    eps, n = 1 / 15, 300
    m = 0.75 * eps * (1 - HEADROOM)
    alone = _iterations(AdaptivePeriod(epsilon=eps, every=False), 1, m, m, block_c=0.5)
    assert alone == (1, 1)
    period = AdaptivePeriod(epsilon=eps, every=False)
    blocks, boundaries = _iterations(period, n, m, m, block_c=0.5)
    spent = m * (blocks + boundaries)
    assert spent == pytest.approx(period.spent)
    # training: n seconds less the block checkpoints' blocked time inside them
    assert period.training == pytest.approx(n - m * blocks)
    assert spent <= period.target * period.training + 0.1  # within it; the two forced firsts aside
    assert spent >= period.target * period.training - 0.1  # and not needlessly sparse
    assert blocks > n / 4 and boundaries > n / 4  # neither starves the other


def test_a_boundary_after_a_checkpointed_block_is_worth_only_what_the_block_leaves() -> None:
    """The block is the whole iteration and cheap to checkpoint, so it is checkpointed every
    time, and a replay restores it (c · M) instead of computing it: a boundary after it spares
    almost nothing, and Eq. 4 does not take it, however much of the run's budget is free. Where
    the block is too dear to checkpoint often, its iterations stay uncovered, and boundaries
    are taken."""
    eps, n = 1 / 15, 200
    period = AdaptivePeriod(epsilon=eps, every=False, boundary_interval=1000.0)
    blocks, boundaries = _iterations(period, n, block_m=0.001, boundary_m=0.01)
    assert blocks == n
    assert boundaries == 1  # the forced first: its M was unknown
    assert period.spent < eps * period.training / 10  # the budget was there
    assert period.training == pytest.approx(n - 0.001 * n)  # training is still every second
    # the same boundary in a loop whose block is dear to checkpoint (M/C = 0.5: about 1 in 10)
    period = AdaptivePeriod(epsilon=eps, every=False)
    blocks, boundaries = _iterations(period, n, block_m=0.5, boundary_m=0.01)
    assert blocks < n / 5
    assert boundaries > n * 3 / 4


def test_compute_that_paid_for_boundaries_once_does_not_pay_for_a_burst_of_them_later() -> None:
    """A boundary spares a replay the compute since the latest one, so that is its Eq. 4 C. The
    run's average would let 20 uncovered iterations pay for a boundary after each of the next
    ~80, once the block in them was checkpointed every time (each sparing a replay nothing)."""
    period = AdaptivePeriod(epsilon=1 / 15, every=False, boundary_interval=1000.0)
    taken = []
    for i in range(120):
        period.executed("L2", 1.0, outer=False)
        held = 0.0
        if i >= 20:  # the budget let the block be checkpointed from here on
            _checkpoint(period, "L2", 0.001)
            held = 0.001
        period.executed("M1", 1.0 - held)
        if period.should_materialize("M1"):
            _checkpoint(period, "M1", 0.01)
            taken.append(i)
    assert taken == list(range(20))  # 1% each, and each spares a second of compute
    # what 100 covered iterations leave uncovered (c · M each) pays for none
    assert period.costs["M1"].uncovered < 0.01 / period.target
    # and with nothing uncovered since the latest boundary, not even a free one is due
    period.costs["M1"].uncovered = 0.0
    assert not period._eq4(period.costs["M1"], 0.0)


@pytest.mark.parametrize("every_s", [3.5, 2.5, 1.25])
def test_boundaries_without_nested_blocks_keep_eq4s_rate(every_s: float) -> None:
    """A main loop with nothing checkpointed inside: a boundary costing ``every_s`` iterations'
    worth of the target share is taken about once per ``every_s`` iterations, not once per
    whole iterations rounded up (the surplus carries over), and never twice in a row unless
    one iteration pays for it."""
    n = 400
    period = AdaptivePeriod(epsilon=1 / 15, every=False, boundary_interval=1000.0)
    m = every_s * period.target
    taken = []
    for i in range(n):
        period.executed("M1", 1.0)
        if period.should_materialize("M1"):
            _checkpoint(period, "M1", m)
            taken.append(i)
    assert abs(len(taken) - n / every_s) <= 2
    # the first boundary is forced, and the budget waits for training to earn it back: after that
    gaps = {b - a for a, b in itertools.pairwise(taken[2:])}
    assert gaps == {int(every_s), int(every_s) + 1}


#: nanoGPT's shape, per second of iteration: micro-steps that are 90% of it and whose checkpoint
#: costs 12% of it (dearer than ε, so the budget decides how many), a boundary costing 15%
NANOGPT = {"block_c": 0.9, "block_m": 0.12, "boundary_m": 0.15}


def test_bookkeeping_under_half_of_epsilon_is_left_room_so_all_flortrain_holds_stays_within_it() -> (
    None
):
    """Where flortrain's hooks hold less than ε/2, checkpoints get ε less what they held: the
    two together stay within ε of training, rather than checkpoints alone taking all of ε."""
    eps, n = 1 / 15, 400
    period = AdaptivePeriod(epsilon=eps, every=False, boundary_interval=1000.0)
    _iterations(period, n, hooks=0.02, **NANOGPT)
    assert period.bookkeeping == pytest.approx(0.02 * n)
    assert period.held <= period.target * period.training + 0.27  # within it; forced firsts aside
    assert period.held >= period.target * period.training - 0.5  # and the budget was used


def test_bookkeeping_beyond_half_of_epsilon_still_leaves_checkpoints_half() -> None:
    """Hooks that alone hold more than ε (a step loop of a few milliseconds) take no more than
    half of the budget: charged in full, they left a nanoGPT-shaped script no boundary at all."""
    eps, n = 1 / 15, 400
    period = AdaptivePeriod(epsilon=eps, every=False, boundary_interval=1000.0)
    blocks, boundaries = _iterations(period, n, hooks=0.1, **NANOGPT)
    assert period.allowance(period.training) == pytest.approx(period.target * period.training / 2)
    assert period.spent <= period.target * period.training / 2 + 0.27
    assert blocks >= n / 10 and boundaries >= n / 20


def test_a_boundary_waiting_for_the_budget_shares_it_with_a_nested_blocks_small_checkpoints() -> (
    None
):
    """Each of the micro-step loop's checkpoints fits as soon as the budget has room, and would
    leave the dearer boundary none (7 of 400, against 199 block checkpoints). A boundary Eq. 4
    wants and the budget refuses is reserved for once the block has spent as much since the
    latest boundary: a replay gets boundaries to jump to and block checkpoints to skip."""
    eps, n = 1 / 15, 400
    period = AdaptivePeriod(epsilon=eps, every=False, boundary_interval=1000.0)
    # nanoGPT's costs as a share of the target, as they were of ε before it had a headroom
    blocks, boundaries = _iterations(
        period,
        n,
        **{k: v * (1 - HEADROOM) for k, v in NANOGPT.items() if k != "block_c"},
        block_c=NANOGPT["block_c"],
    )
    assert boundaries >= n / 8 and blocks >= n / 4
    assert period.spent <= period.target * period.training + 0.27


def test_a_main_loop_that_ended_reserves_nothing_for_the_blocks_after_it() -> None:
    """A boundary its loop was waiting for will not come once the loop has exited: the blocks of
    whatever the script runs next get the whole budget again."""
    period = AdaptivePeriod(epsilon=1 / 15, every=False, boundary_interval=1000.0)
    _iterations(period, 400, **NANOGPT)
    period.costs["M1"].waiting = 0.5
    period.nested = 1.0
    assert period.reserved() == pytest.approx(0.5)
    period.loop_ended("M1")
    assert period.reserved() == 0.0


def test_a_main_loop_takes_a_boundary_every_interval_for_resume_within_the_budget() -> None:
    """Where Eq. 4 values boundaries at nothing (the block covers each iteration), a record
    still takes one per ``boundary_interval`` seconds of training, so ``record --resume`` has a
    recent one; never beyond the run's budget."""
    period = AdaptivePeriod(epsilon=1 / 15, every=False, boundary_interval=60.0)
    blocks, boundaries = _iterations(period, 200, block_m=0.001, boundary_m=0.01)
    assert (blocks, boundaries) == (200, 4)  # the first, then at 60, 120 and 180 s
    # a 4.5 s boundary a minute is more than ε of the minute: the budget, not the interval,
    # decides (the first, unpriced, then one once training has earned it: 2 of 4)
    period = AdaptivePeriod(epsilon=1 / 15, every=False, boundary_interval=60.0)
    _, boundaries = _iterations(period, 200, block_m=0.001, boundary_m=4.5)
    assert boundaries == 2
    assert period.spent <= period.epsilon * period.training + 4.5


def test_the_budget_is_charged_what_checkpoints_cost_not_flortrains_bookkeeping() -> None:
    """Time flortrain held training outside any checkpoint (block entries, RNG digests) is
    reported, and not charged to the budget: the period cannot make it cheaper, and charging it
    only gave up checkpoints (a nanoGPT-shaped step loop whose bookkeeping alone exceeded ε took
    no boundary at all)."""
    period = AdaptivePeriod(epsilon=0.05, every=False, boundary_interval=1000.0)
    period.executed("M1", 10.0)
    _checkpoint(period, "M1", 0.1)  # its first: 1% of training
    period.hold(5.0)  # hooks outside any checkpoint, far beyond ε
    period.executed("M1", 10.0)
    assert period.spent == pytest.approx(0.1) and period.held == pytest.approx(5.1)
    assert period.should_materialize("M1")  # Eq. 4 and the budget (0.2 of 1.0)
    period.hold(0.01)
    period.declined("M1", 0.85)  # a declined capture is a checkpoint's cost: charged
    assert period.spent == pytest.approx(0.95)
    assert not period.should_materialize("M1")  # it waits for the budget to take it again


def test_background_time_counts_in_the_budget_under_contention_only() -> None:
    period = AdaptivePeriod(epsilon=1 / 15, every=False, cores=2)
    period.executed("L1", 1.0, cpu_s=2.0)  # both cores busy
    assert _checkpoint(period, "L1", 0.01, background=0.04) == pytest.approx(0.05)
    period.executed("L1", 1.0, cpu_s=1.0)  # a core left idle
    assert _checkpoint(period, "L1", 0.01, background=0.04) == pytest.approx(0.01)
    assert period.writer == pytest.approx(0.04)
    assert period.spent == pytest.approx(0.06)


def test_ongoing_iteration_time_opens_the_budget() -> None:
    """A nested block whose main loop has not finished an iteration yet: the seconds of the
    iteration so far are training time too."""
    period = AdaptivePeriod(epsilon=1 / 15, every=False)
    period.executed("L2", 1.0, outer=False)
    assert period.costs["L2"].k == 0 and period.should_materialize("L2")  # its first instance
    _checkpoint(period, "L2", 0.01)
    assert period.costs["L2"].k == 1
    for _ in range(2):
        period.executed("L2", 1.0, outer=False)
    assert not period.should_materialize("L2")  # no training time accounted yet
    assert period.should_materialize("L2", ongoing=3.0)


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "nan"])
def test_epsilon_knob_rejects_non_positive(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLORTRAIN_EPSILON", raw)
    with pytest.raises(FlortrainError) as err:
        AdaptivePeriod()
    assert err.value.code == "FT050"


def test_contention_is_how_far_training_kept_every_core_busy() -> None:
    assert contention(1.0, 2.0, cores=2) == 1.0  # both cores busy: the writer takes from training
    assert contention(1.0, 1.0, cores=2) == 0.0  # a core left idle: the writer is free
    assert contention(1.0, 1.5, cores=2) == pytest.approx(0.5)
    assert contention(0.0, 1.0, cores=2) == 0.0


def test_background_writing_counts_in_m_only_under_contention() -> None:
    """The same cheap staging (1 ms) and costly background write (0.5 s) per 1 s instance: on a
    saturated machine M is 0.5 s, above ε, and checkpoints thin out; with a core idle it is 1 ms
    and every instance is checkpointed."""

    def drive(cpu_per_wall: float) -> list[int]:
        p = AdaptivePeriod(epsilon=1 / 15, every=False, cores=2)
        out = []
        for i in range(30):
            p.executed("L1", 1.0, cpu_per_wall)
            if p.should_materialize("L1"):
                out.append(i)
                _checkpoint(p, "L1", 0.001, background=0.5)
        return out

    assert drive(cpu_per_wall=1.0) == list(range(30))  # one of 2 cores busy
    # M/C = 0.501: after the first, the next is due when n/(k+1) times the target (ε less the
    # headroom, 0.05) exceeds it (n = 21)
    assert drive(cpu_per_wall=2.0) == [0, 20]


def _boundaries(period: AdaptivePeriod, n: int, capture: float, priced: float) -> tuple[int, int]:
    """``n`` one-second iterations whose boundary costs ``capture`` to capture and is priced at
    ``priced`` (as ``RecordSession._record_boundary`` drives it); returns (captures, checkpoints)."""
    captures = taken = 0
    for _ in range(n):
        period.executed("M1", 1.0)
        if not period.should_materialize("M1"):
            continue
        captures += 1
        if period.affords("M1", priced, 0.0):
            _checkpoint(period, "M1", capture + priced)
            taken += 1
        else:
            period.hold(capture)  # the capture held training all the same
            period.declined("M1", capture)
    return captures, taken


def test_a_declined_boundary_charges_its_capture_and_waits_for_the_budget() -> None:
    """A boundary priced beyond the budget is not captured again every iteration (it was, as
    long as none had been taken: no M yet, so Eq. 4 said yes); what the captures cost is spent."""
    eps = 1 / 15
    period = AdaptivePeriod(epsilon=eps, every=False)
    period.charged = 0.9  # the nested blocks used most of the budget of the first iterations
    period.training = 10.0
    captures, taken = _boundaries(period, 100, capture=0.002, priced=0.5)
    assert captures < 15, captures  # it was 100: one capture per iteration
    assert taken >= 1
    assert period.spent == pytest.approx(0.9 + 0.002 * (captures - taken) + 0.502 * taken)
    assert period.spent <= eps * period.training + 0.502  # within ε but for the last one


def test_a_boundary_that_never_fits_costs_a_few_captures_not_one_per_iteration() -> None:
    period = AdaptivePeriod(epsilon=1 / 15, every=False)
    captures, taken = _boundaries(period, 200, capture=0.002, priced=1000.0)
    assert taken == 0
    assert captures <= 2, captures
    assert period.spent == pytest.approx(0.002 * captures)


def test_a_block_cheaper_to_run_than_to_restore_is_futile_once_measured_and_watched() -> None:
    """``futile``: an instance whose checkpoint could only slow a replay (its compute below c
    times what its cheapest checkpoint held training) is not prepared for one; not before M is
    measured, nor during the alias watch's instances, nor in ``every`` mode, nor for a main
    loop; and one dear instance makes the block a candidate again at once."""
    period = AdaptivePeriod(epsilon=1 / 15, restore_ratio=1.38, every=False)
    assert not period.futile("L1")  # never seen
    period.executed("L1", 2e-6, outer=False)
    assert not period.futile("L1")  # no checkpoint yet: M unknown
    _checkpoint(period, "L1", 1e-3)
    assert not period.futile("L1")  # the alias watch's instances run in full
    period.executed("L1", 2e-6, outer=False)
    assert period.futile("L1")  # 2 µs to run, about 1.4 ms to restore
    period.executed("L1", 0.01, outer=False)  # one instance dearer than a restore
    assert not period.futile("L1")
    period.executed("L1", 2e-6, outer=False)  # cheap again, but the mean (2.5 ms) is not
    assert not period.futile("L1")
    # M is the cheapest checkpoint's blocked time: not the writer's share, not a dear first one
    edge = AdaptivePeriod(epsilon=1 / 15, restore_ratio=2.0, every=False)
    edge.costs.setdefault("L2", BlockCosts()).contention = 1.0
    _checkpoint(edge, "L2", 5e-3, background=0.05)  # held 5 ms, the writer 50 ms more
    _checkpoint(edge, "L2", 1e-3, background=0.05)  # held 1 ms: a restore about 2 ms
    for _ in range(2):
        edge.executed("L2", 1.9e-3, outer=False)
    assert edge.futile("L2")
    edge.executed("L2", 2.5e-3, outer=False)
    assert not edge.futile("L2")  # 2.5 ms to run against 2 ms to restore
    assert not AdaptivePeriod(every=True).futile("L1")
    main = AdaptivePeriod(epsilon=1 / 15, every=False)  # a main loop's boundaries are never futile
    for _ in range(3):
        main.executed("M0", 1e-6)
    _checkpoint(main, "M0", 1e-3)
    assert not main.futile("M0")
