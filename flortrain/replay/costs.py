"""The replay's cost model: what a skipped block, a restored boundary and a main-loop iteration
cost, priced from the record's own measurements.

Every estimate a replay makes (the plan's block time, the division of a main loop among
workers, whether dividing can pay at all) starts from these figures, so they are computed once:

- a checkpoint restored costs ``c`` times the time it held the record materializing it
  (:func:`restore_price`, Flor's restore/materialize ratio, Eq. 3);
- a block instance skipped costs its restore; one without a checkpoint executes and costs its
  compute (:class:`BlockCost`);
- a main-loop iteration costs its wall time at record, less what restoring its checkpointed
  blocks saves (:func:`loop_costs`).

A leaf: it reads rows already fetched and imports nothing from the runtime; the restore price is
the record period's own (``checkpoint/cost.py``).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from flortrain.checkpoint.cost import restore_price
from flortrain.store.records import BlockRow, BlockState

#: a parallel plan must beat the serial estimate by this much to be worth the extra processes
WORTHWHILE = 0.9
#: seconds a worker process takes to start before the script runs (interpreter, flortrain's
#: imports, reading the task) and to hand its result back
WORKER_STARTUP_S = 0.5


class BlockCost(NamedTuple):
    """One block's instances at record, what they computed and what restoring them costs."""

    instances: int
    checkpoints: int
    compute: float  # seconds, every instance
    restore: float  # seconds to restore the checkpointed instances

    def replayed(self, executes: bool) -> float:
        """Estimated seconds of this block in a replay: all its compute when it executes;
        otherwise its restores plus the compute of the instances that have no checkpoint."""
        if executes:
            return self.compute
        return self.restore + self.compute * (self.instances - self.checkpoints) / max(
            self.instances, 1
        )


NO_COST = BlockCost(0, 0, 0.0, 0.0)


def block_costs(blocks: Iterable[BlockRow], ratio: float) -> dict[str, BlockCost]:
    """Per block id, its :class:`BlockCost` from the record's block rows (main-loop boundary
    rows are not block instances and are left out)."""
    out: dict[str, BlockCost] = {}
    for b in blocks:
        if b.state == BlockState.BOUNDARY:
            continue
        n, k, c, r = out.get(b.block_id, NO_COST)
        ck = b.state == BlockState.CHECKPOINTED
        out[b.block_id] = BlockCost(
            n + 1,
            k + int(ck),
            c + (b.compute_s or 0.0),
            r + (restore_price(ratio, b.materialize_s) if ck else 0.0),
        )
    return out


@dataclass(frozen=True)
class LoopCosts:
    """What the record says one main-loop entry costs, iteration by iteration (all lists are
    indexed by iteration number, iterations 0..n-1)."""

    main_id: str
    entry: int
    pre: float  # seconds from the start of the run to the loop's first iteration
    run: list[float]  # an iteration's replay cost inside a segment (probed blocks execute)
    pseudo: list[float]  # its cost before a segment (every checkpointed block restored)
    restore: dict[int, float]  # iteration -> cost of restoring its boundary checkpoint
    after: float = 0.0  # seconds after the loop (only the last worker runs them)
    #: a worker process's own start-up (interpreter, flortrain, the task): a serial replay runs
    #: in the process that planned it and does not pay it
    startup: float = 0.0

    @property
    def n(self) -> int:
        return len(self.run)


Where = tuple[str, int, int]  # main id, entry, iteration


def iteration_seconds(starts: list[float], end: float | None) -> list[float]:
    """Each iteration's wall seconds at record, from two or more iterations' start times: the
    last runs to the record's ``end``, or, for a record that did not complete, takes the median."""
    full = [b - a for a, b in itertools.pairwise(starts)]
    full.append(
        end - starts[-1] if end is not None and end > starts[-1] else statistics.median(full)
    )
    return [max(f, 0.0) for f in full]


def loop_costs(
    times: Mapping[tuple[str, int], list[tuple[int, float]]],
    blocks: Iterable[BlockRow],
    checkpoints: Collection[str],
    execute: Collection[str],
    ratio: float,
    end: float | None,
) -> list[LoopCosts]:
    """Per main-loop entry the record ran for two iterations or more, what each iteration cost
    it, from the iterations' start times (``times``) and the block instances in them. Blocks in
    ``execute`` run inside a worker's segment; every checkpointed block is restored before it.
    ``end``: when the record ended (None for one that did not complete)."""
    run_saving: dict[Where, float] = {}
    pseudo_saving: dict[Where, float] = {}
    restore: dict[tuple[str, int], dict[int, float]] = {}
    for b in blocks:
        if b.key not in checkpoints:
            continue
        where = (b.main_id, b.main_inst, b.iteration)
        restored = restore_price(ratio, b.materialize_s)
        if b.state == BlockState.BOUNDARY:
            restore.setdefault(where[:2], {})[where[2]] = restored
            continue
        saving = (b.compute_s or 0.0) - restored
        pseudo_saving[where] = pseudo_saving.get(where, 0.0) + saving
        if b.block_id not in execute:
            run_saving[where] = run_saving.get(where, 0.0) + saving
    out = []
    for (m, e), rows in times.items():
        its = [it for it, _ in rows]
        if len(rows) < 2 or its != list(range(len(rows))):
            continue  # one iteration, or a gap (a killed record): nothing to divide
        starts = [t for _, t in rows]
        full = iteration_seconds(starts, end)
        run = _less(full, run_saving, m, e)
        pseudo = _less(full, pseudo_saving, m, e)
        out.append(
            LoopCosts(
                m, e, starts[0], run, pseudo, restore.get((m, e), {}), startup=WORKER_STARTUP_S
            )
        )
    return out


def _less(full: list[float], saving: Mapping[Where, float], m: str, e: int) -> list[float]:
    """Iteration costs less what restoring blocks saves, with a floor: nested blocks' savings
    can count twice, and an iteration is never free."""
    return [max(f - saving.get((m, e, i), 0.0), 0.05 * f) for i, f in enumerate(full)]


__all__ = [
    "NO_COST",
    "WORKER_STARTUP_S",
    "WORTHWHILE",
    "BlockCost",
    "LoopCosts",
    "block_costs",
    "iteration_seconds",
    "loop_costs",
    "restore_price",
]
