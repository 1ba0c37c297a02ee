"""Jumping over main-loop iterations at run time, shared by a replay and a resumed record.

A replay jumps over the iterations in which no probe fires; a resumed record (``record
--resume``) jumps to the iteration it resumes at; a parallel-replay worker jumps to its segment
and stops at its end. Where to go is :mod:`flortrain.runtime.jumps`' decision
(``SpanReplay.target``); this session takes the main ``for`` loop's items of the iterations
jumped over and keeps the worker's segment and output marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from flortrain.runtime.jumps import Segment, SegmentEnd
from flortrain.runtime.session import Session


@dataclass
class JumpingSession(Session):
    """A session that can jump over main-loop iterations (the replay source has spans)."""

    #: a parallel-replay worker's output positions (captured-line numbers) where its segment's
    #: main loop was entered ("enter") and where it left it or stopped ("exit")
    marks: dict[str, int] = field(default_factory=dict)

    def _entered(self, main_id: str, entry: int) -> None:
        seg = self._segment()
        if seg is not None and seg.owns(main_id, entry):
            self._mark("enter")

    def _before_iteration(self, main_id: str, entry: int, i: int) -> None:
        self._end_segment(main_id, entry, i)

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
        """A main ``for`` loop that may jump, run in ``frame``: the jump is decided before an item is
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

    def restores_probed_blocks(self) -> bool:
        """In a worker, whether the current iteration is one before its segment whose instances
        of the blocks probes make execute are restored from their checkpoints: every one but
        the last. The last's execute, since a probe in the segment's first iteration may read
        what they bound in it (``x if epoch else 0`` before the batch loop), which no checkpoint
        holds."""
        seg = self._segment_here()
        return seg is not None and self.main is not None and self.main[2] < seg.start - 1
