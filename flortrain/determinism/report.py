"""What the per-example rewrite changed: plain data, so that record's static pass can hand it
from its forked child to a training process that never imports libcst."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rewritten:
    """The rewritten text, how many draw sites and pool submissions it changed, and the draws
    left as written (``line:col: why``)."""

    text: str
    draws: int = 0
    pools: int = 0
    left: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        return (
            f"{self.draws} draw(s) in data-parallel regions rewritten to per-example generators,"
            f" {self.pools} pool submission(s) keyed"
        )
