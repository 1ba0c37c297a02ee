"""Adaptive checkpoint period: Flor's Joint Invariant (Eq. 4).

Materialize instance n of block i only if ``M_i / C_i < n_i / (k_i + 1) * min(1 / (1 + c), eps)``
where M_i is the (mean) time to materialize, C_i the (mean) time to compute, n_i the executions so
far, k_i the checkpoints so far. It bounds record overhead by eps and keeps restore + replay
cheaper than re-running (c = R/M). The first instance of a block is always materialized: M_i is
unknown until measured once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flortrain import knobs


@dataclass
class BlockCosts:
    n: int = 0  # executions
    k: int = 0  # checkpoints
    compute: float = 0.0  # total C
    materialize: float = 0.0  # total M over the k checkpoints


@dataclass
class AdaptivePeriod:
    epsilon: float = field(default_factory=knobs.epsilon)
    restore_ratio: float = knobs.DEFAULT_RESTORE_RATIO
    every: bool = field(default_factory=lambda: knobs.period() == "every")
    costs: dict[str, BlockCosts] = field(default_factory=dict)

    def executed(self, block_id: str, compute_s: float) -> None:
        c = self.costs.setdefault(block_id, BlockCosts())
        c.n += 1
        c.compute += compute_s

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

    def materialized(self, block_id: str, seconds: float) -> None:
        c = self.costs.setdefault(block_id, BlockCosts())
        c.k += 1
        c.materialize += seconds
