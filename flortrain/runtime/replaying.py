"""A replay's session: skip the block instances a probe does not need, restoring their
checkpoints, and jump over main-loop iterations in which no probe fires (``jumping``); in a
parallel-replay worker, own one segment of the main loop and stop at its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import FrameType

from flortrain.checkpoint.codec import object_refs
from flortrain.checkpoint.key import CheckpointKey, block_of
from flortrain.runtime.boundaries import MainBoundary
from flortrain.runtime.checkpointable import Getters
from flortrain.runtime.jumping import JumpingSession
from flortrain.runtime.session import IterationStart, Step


@dataclass
class ReplaySession(JumpingSession):
    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replay is not None:
            # the checkpoints of blocks it does not re-execute, read ahead of their restores
            # (a boundary's key begins with its main loop's id, never among them)
            execute = self.replay.execute
            self.store.read_ahead(
                [ck for key, ck in self.replay.checkpoints.items() if block_of(key) not in execute],
                object_refs,
            )

    # -- the main loop ---------------------------------------------------------------------------
    def _iteration(self, at: IterationStart) -> Step:
        if at.objects is None or at.names is None:
            return None, None, True
        return self._jump(at.main_id, at.i, at.objects, at.names, at.values, at.frame), None, True

    def _jump(
        self,
        main_id: str,
        i: int,
        objects: Getters,
        names: Getters,
        values: tuple[str, ...],
        frame: FrameType | None,
    ) -> MainBoundary | None:
        assert self.main is not None and self.replay is not None
        spans = self.replay.spans
        if spans is None:
            return None
        entry = self.main[1]
        pending, self._jump_pending = self._jump_pending, None
        if pending is not None and pending[0] == main_id:
            j, b = pending[1], pending[2]
        elif main_id in self._driven:
            return None  # the generator decided not to jump
        else:
            j = spans.target(main_id, entry, i, frame)
            self._end_segment(main_id, entry, i, j)
            found = self._load_boundary(main_id, entry, j, i) if j > i else None
            if found is None:
                return None
            b = found
        self.note_streams_before_restore()
        b.restore(self, objects, names)
        self.restore_files(str(CheckpointKey.boundary(main_id, entry, j)))
        b.jumped_to = j
        self.main[2] = j
        self.store.put_jump(self.run_id, main_id, entry, i, j)
        self.counts["jumped"] = self.counts.get("jumped", 0) + j - i
        return b
