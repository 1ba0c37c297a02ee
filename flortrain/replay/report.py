"""What a replay says on stderr before it runs: the record it replays, what it executes, and
the replay plan with its estimate (block instances skipped or executed, main-loop iterations
jumped over), so a user can tell what the replay will and will not run before it does."""

from __future__ import annotations

from collections.abc import Mapping

from flortrain.replay.costs import BlockCost
from flortrain.replay.plan import ReplayPlan
from flortrain.static.plan import Plan
from flortrain.store.db import Store
from flortrain.store.records import BlockRow, BlockState, Run


def stopped(store: Store, record: Run) -> str:
    """Where an unfinished record stopped, for the user reading a replay of it."""
    last = store.last_iteration(record.id)
    if last is None:
        return "it stopped before any main-loop iteration was committed; the whole script executes"
    m, entry, it = last
    where = f"main loop {m}" + (f" (entry {entry})" if entry else "")
    return (
        f"it stopped in {where} at iteration {it}: what it recorded up to there is restored where"
        " it can be, and the rest executes"
    )


def _executed_source(script: str, record: Run, probes: tuple[tuple[int, str], ...]) -> list[str]:
    """What this replay will execute, shown before it does: the only code a replay runs is the
    user's script, which must be the recorded source (named by its hash) plus these probes."""
    out = [
        f"  executes {script}: the source of record run {record.id} (sha256 {record.source_sha[:12]}) plus:"
    ]
    out += [f"    line {line}: {code.splitlines()[0]}" for line, code in probes] or [
        "    no probes"
    ]
    return out


def _why_not(blocks: list[BlockRow]) -> dict[str, str]:
    """Per block, the reason its first instance that could not be checkpointed gives (a tensor
    carrying an autograd graph, an object that cannot be captured), for the replay plan."""
    out: dict[str, str] = {}
    for b in blocks:
        if b.state == BlockState.RECORDED and b.note and b.block_id not in out:
            out[b.block_id] = b.note
    return out


def _module_blocks(costs: Mapping[str, BlockCost]) -> list[str]:
    """Replay-plan lines for the blocks of project modules (ids ``module:L<line>``): never probed,
    so each instance with a checkpoint is skipped."""
    return [
        f"  {bid}: skip {c.checkpoints} of {c.instances} instance(s), restoring checkpoints"
        " (project module, unchanged)"
        for bid, c in costs.items()
        if ":" in bid
    ]


def plan_report(
    script: str,
    record: Run,
    plan: Plan,
    rplan: ReplayPlan,
    probes: tuple[tuple[int, str], ...],
    blocks: list[BlockRow],
    costs: dict[str, BlockCost],
    measured: tuple[float, int] | None,
) -> list[str]:
    """The lines a replay prints before it runs. ``measured``: the restore/materialize ratio the
    estimate used and the replay that measured it (None: the default, before any replay)."""
    lines = rplan.describe(plan, costs, _why_not(blocks))
    lines[-1:-1] = _module_blocks(costs)
    if measured is not None:  # before the estimate it went into
        lines.insert(
            -1,
            f"restore/materialize ratio c = {measured[0]:.2f} (measured by replay run {measured[1]})",
        )
    lines[1:1] = _executed_source(script, record, probes)
    return lines


__all__ = ["plan_report", "stopped"]
