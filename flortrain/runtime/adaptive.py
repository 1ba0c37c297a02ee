"""Adaptive checkpoint period: Flor's Joint Invariant (Eq. 4).

Materialize instance n of block i only if ``M_i / C_i < n_i / (k_i + 1) * min(1 / (1 + c), eps)``
where M_i is the (mean) time to materialize, C_i the (mean) time to compute, n_i the executions so
far, k_i the checkpoints so far. It bounds record overhead by eps and keeps restore + replay
cheaper than re-running (c = R/M). The first instance of a block is always materialized: M_i is
unknown until measured once.

M_i is the time the training thread was blocked, plus the background writer's CPU time *to the
extent training leaves no core idle for it* (:func:`contention`). On a GPU machine the CPUs are
mostly idle and the writer is free; on a CPU-only machine whose cores training saturates (this
project's 2-core CI), hashing and writing a checkpoint takes CPU from training just as if it
were done on the training thread, and a bound that ignored it would not bound the overhead.
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


@dataclass
class BlockCosts:
    n: int = 0  # executions
    k: int = 0  # checkpoints
    compute: float = 0.0  # total C
    materialize: float = 0.0  # total M over the k checkpoints
    contention: float = 0.0  # of the latest instance (see `contention`)


@dataclass
class AdaptivePeriod:
    epsilon: float = field(default_factory=knobs.epsilon)
    restore_ratio: float = knobs.DEFAULT_RESTORE_RATIO
    every: bool = field(default_factory=lambda: knobs.period() == "every")
    costs: dict[str, BlockCosts] = field(default_factory=dict)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    def executed(self, block_id: str, compute_s: float, cpu_s: float | None = None) -> None:
        c = self.costs.setdefault(block_id, BlockCosts())
        c.n += 1
        c.compute += compute_s
        if cpu_s is not None:
            c.contention = contention(compute_s, cpu_s, self.cores)

    def should_materialize(self, block_id: str) -> bool:
        c = self.costs.setdefault(block_id, BlockCosts())
        if self.every or c.k == 0:
            return True
        m = c.materialize / c.k
        cc = c.compute / max(c.n, 1)
        if cc <= 0:
            return False
        bound = c.n / (c.k + 1) * min(1.0 / (1.0 + self.restore_ratio), self.epsilon)
        return m / cc < bound

    def materialized(self, block_id: str, blocked_s: float, background_s: float = 0.0) -> float:
        """Account a checkpoint; returns its M: the time training was blocked plus the writer's
        CPU time as far as it competes with training."""
        c = self.costs.setdefault(block_id, BlockCosts())
        c.k += 1
        m = blocked_s + c.contention * background_s
        c.materialize += m
        return m
