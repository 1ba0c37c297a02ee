"""A replay's session: skip the block instances a probe does not need, restoring their
checkpoints, and jump over main-loop iterations in which no probe fires (``jumps``); in a
parallel-replay worker, own one segment of the main loop and stop at its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from flortrain.runtime.blobformat import object_refs
from flortrain.runtime.boundaries import MainBoundary
from flortrain.runtime.checkpointable import Getters
from flortrain.runtime.jumps import Segment, SegmentEnd
from flortrain.runtime.session import IterationStart, Session, Step


@dataclass
class ReplaySession(Session):
    #: a parallel-replay worker's output positions (captured-line numbers) where its segment's
    #: main loop was entered ("enter") and where it left it or stopped ("exit")
    marks: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replay is not None:
            # the checkpoints of blocks it does not re-execute, read ahead of their restores
            # (a boundary's key begins with its main loop's id, never among them)
            execute = self.replay.execute
            self.store.read_ahead(
                [
                    ck
                    for key, ck in self.replay.checkpoints.items()
                    if key.partition("@")[0] not in execute
                ],
                object_refs,
            )

    # -- the main loop ---------------------------------------------------------------------------
    def _entered(self, main_id: str, entry: int) -> None:
        seg = self._segment()
        if seg is not None and seg.owns(main_id, entry):
            self._mark("enter")

    def _before_iteration(self, main_id: str, entry: int, i: int) -> None:
        self._end_segment(main_id, entry, i)

    def _iteration(self, at: IterationStart) -> Step:
        if at.objects is None or at.names is None:
            return None, None, True
        return self._jump(at.main_id, at.i, at.objects, at.names, at.values, at.frame), None, True

    def _exited(self, main_id: str) -> None:
        if self._segment_here() is not None:
            self._mark("exit")

    def main_items(self, main_id: str, iterable: Iterable[Any], frame: FrameType) -> Iterable[Any]:
        if self.replay is None or self.replay.spans is None:
            return iterable
        return self._iterate_main(main_id, iterable, frame)

    def _iterate_main(
        self, main_id: str, iterable: Iterable[Any], frame: FrameType
    ) -> Iterator[Any]:
        """A replay's main ``for`` loop, run in ``frame``: the jump is decided before an item is
        taken, so the iterator skips the items of the iterations jumped over (``main_iteration``
        restores)."""
        self._driven.add(main_id)
        it = iter(iterable)
        while True:
            skip = 0
            spans = self.replay.spans if self.replay is not None else None
            if (
                spans is not None
                and not self.probe_depth
                and self.main is not None
                and self.main[0] == main_id
            ):
                _, entry, last = self.main
                i = last + 1
                self._end_segment(main_id, entry, i)
                j = spans.target(main_id, entry, i, frame)
                self._end_segment(main_id, entry, i, j)
                b = self._load_boundary(main_id, entry, j, i) if j > i else None
                if b is not None:
                    self._jump_pending, skip = (main_id, j, b), j - i
            try:
                for _ in range(skip):
                    next(it)
                item = next(it)
            except StopIteration:
                self._jump_pending = None
                return
            yield item

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
        b.restore(self, objects, names)
        self.restore_files(f"{main_id}@{main_id}.{entry}.{j}#0")
        b.jumped_to = j
        self.main[2] = j
        self.store.put_jump(self.run_id, main_id, entry, i, j)
        self.counts["jumped"] = self.counts.get("jumped", 0) + j - i
        return b

    def _segment(self) -> Segment | None:
        """The iterations this process owns, in a parallel-replay worker."""
        spans = self.replay.spans if self.replay is not None else None
        return spans.segment if spans is not None else None

    def _segment_here(self) -> Segment | None:
        """A worker's segment, when the current main-loop iteration is of the loop it divides."""
        seg = self._segment()
        return (
            seg
            if seg is not None and self.main is not None and seg.owns(self.main[0], self.main[1])
            else None
        )

    def _mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = self.tee.seq if self.tee is not None else 0

    def _end_segment(self, main_id: str, entry: int, i: int, target: int | None = None) -> None:
        """Stop this worker at iteration ``i`` of its segment's loop when ``i`` (or the
        iteration the replay would continue at) is past the segment; iterations from ``i`` to
        the segment's end are then jumped over: no probe fires in them."""
        seg = self._segment()
        reached = i if target is None else target
        if (
            seg is None
            or seg.end is None
            or not seg.owns(main_id, entry)
            or i < seg.start
            or reached < seg.end
        ):
            return
        if i < seg.end:
            self.store.put_jump(self.run_id, main_id, entry, i, seg.end)
            self.counts["jumped"] = self.counts.get("jumped", 0) + seg.end - i
        self._mark("exit")
        raise SegmentEnd

    def before_segment(self) -> bool:
        """In a worker, whether the current iteration precedes its segment (its output is not
        wanted, and the blocks probes need execute only in the segment)."""
        seg = self._segment_here()
        return seg is not None and self.main is not None and self.main[2] < seg.start
