"""What a materializer reported, collected for tests that drive one directly (test_materializer,
test_arena, test_read_ahead): checkpoints committed with their digests, checkpoints lost with
the reason, and the warnings it printed."""

from __future__ import annotations

from flortrain.checkpoint.interface import Callbacks


class Outcomes:
    def __init__(self) -> None:
        self.committed: dict[str, dict[str, str]] = {}
        self.lost: dict[str, str] = {}
        self.warnings: list[str] = []

    def callbacks(self) -> Callbacks:
        return Callbacks(
            lambda k, d: self.committed.__setitem__(k, d),
            lambda k, r: self.lost.__setitem__(k, r),
            self.warnings.append,
        )
