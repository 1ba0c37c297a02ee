"""Jumps over main-loop iterations on replay: which iteration to continue at, and segments.

At the start of iteration ``i``, if no probe can fire in it (each probe's guard, evaluated on
the recorded scalars of ``i`` and the live loop invariants, is false), the replay restores the
latest boundary checkpoint ``j`` with ``i < j <= f``, ``f`` the next iteration where a probe
fires (or the last recorded iteration), and continues at ``j``: iterations ``i..j-1`` are jumped
over (:class:`SpanReplay` decides; the replay session restores). A guard that cannot be
evaluated (a value missing, an error) counts as firing: the iteration runs. ``diff`` leaves
jumped iterations out and checks the RNG streams at ``j`` against the record.

A parallel replay's worker (:mod:`flortrain.replay.parallel`) owns one :class:`Segment` of the
main loop. Before its segment the same jump takes it to the latest boundary checkpoint at or
before the segment's start (direct resume when there is one at the start itself; otherwise it
runs on from there, its blocks restored from their checkpoints: Flor's pseudoresume). At the
segment's end it stops (:class:`SegmentEnd`), and it stops early when no probe fires in the rest
of its segment.
"""

from __future__ import annotations

import argparse
import builtins
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

_SCALARS = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class Segment:
    """The main-loop iterations one parallel-replay worker owns: ``start`` up to ``end``
    (exclusive; None for the last segment, which also runs the code after the loop)."""

    main_id: str
    entry: int
    start: int
    end: int | None

    def owns(self, main_id: str, entry: int) -> bool:
        return main_id == self.main_id and entry == self.entry


class SegmentEnd(BaseException):
    """Raised at the start of the first iteration past a worker's segment. A BaseException so
    that the script's own ``except Exception`` does not catch it; the runner treats it as the
    script's normal end."""


@dataclass(frozen=True)
class CompiledGuard:
    source: str
    code: CodeType
    recorded: tuple[str, ...]
    live: tuple[str, ...]
    through: tuple[str, ...] = ()


@dataclass
class SpanReplay:
    """What a replay knows to jump over main-loop iterations."""

    #: main id -> the guards of the probes in its body; a main id missing here is never jumped
    guards: dict[str, list[CompiledGuard]]
    #: (main id, entry, iteration) -> the recorded scalars at its start (None: none recorded)
    scalars: dict[tuple[str, int, int], dict[str, Any] | None]
    #: (main id, entry) -> sorted iterations with a boundary checkpoint
    boundaries: dict[tuple[str, int], list[int]]
    last: dict[tuple[str, int], int] = field(default_factory=dict)
    #: how an untrusted guard is reported (once per message; the session's stderr)
    warn: Callable[[str], None] = field(default=lambda msg: None)
    #: the iterations a parallel-replay worker owns (None: the whole run)
    segment: Segment | None = None
    _fires: dict[tuple[str, int, int], bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for m, e, it in self.scalars:
            self.last[(m, e)] = max(self.last.get((m, e), -1), it)

    def fires(self, main: str, entry: int, it: int, frame: FrameType | None) -> bool:
        key = (main, entry, it)
        hit = self._fires.get(key)
        if hit is None:
            hit = self._fires[key] = self._evaluate(main, key, frame)
        return hit

    def _evaluate(self, main: str, key: tuple[str, int, int], frame: FrameType | None) -> bool:
        guards = self.guards[main]
        if not guards:
            return False
        if key not in self.scalars:
            return True  # the record never reached it: run it and see
        scalars = self.scalars[key] or {}
        for g in guards:
            ns: dict[str, Any] = {}
            for name in g.recorded:
                if name not in scalars:
                    return True
                ns[name] = scalars[name]
            for name in g.live:
                found, v = _lookup(frame, name)
                # a loop invariant only if nothing can change it behind the static pass's back:
                # an immutable scalar, or an argparse namespace read through an attribute
                trusted = (
                    type(v) is argparse.Namespace if name in g.through else type(v) in _SCALARS
                )
                if not found or not trusted:
                    self.warn(
                        f"guard `{g.source}`: `{name}` is not a plain value"
                        + (" or an argparse namespace" if name in g.through else "")
                        + "; iterations run where it is read"
                    )
                    return True
                ns[name] = v
            try:
                if eval(
                    g.code, {"__builtins__": {}}, ns
                ):  # the user's own guard, on recorded values
                    return True
            except Exception:
                return True
        return False

    def target(self, main: str, entry: int, i: int, frame: FrameType | None) -> int:
        """The iteration to continue at from ``i``: ``i`` itself, or a later boundary; in a
        worker, its segment's end when no probe fires in the rest of the segment (it stops)."""
        marks = self.boundaries.get((main, entry), [])
        seg = self.segment
        end = None
        if seg is not None and seg.owns(main, entry):
            if i < seg.start:  # not ours: resume as close to our start as a checkpoint allows
                k = bisect_right(marks, seg.start)
                return marks[k - 1] if k and marks[k - 1] > i else i
            end = seg.end
        if main not in self.guards or self.fires(main, entry, i, frame):
            return i
        last = self.last.get((main, entry))
        if last is None:
            return i
        horizon = last if end is None else end - 1
        f = next(
            (it for it in range(i + 1, horizon + 1) if self.fires(main, entry, it, frame)), None
        )
        if f is None and end is not None:
            return end
        k = bisect_right(marks, last if f is None else f)
        return marks[k - 1] if k and marks[k - 1] > i else i


def _lookup(frame: FrameType | None, name: str) -> tuple[bool, Any]:
    if frame is None:
        return False, None
    for ns in (frame.f_locals, frame.f_globals):
        if name in ns:
            return True, ns[name]
    if hasattr(builtins, name):
        return True, getattr(builtins, name)
    return False, None


def compile_guard(
    source: str, recorded: tuple[str, ...], live: tuple[str, ...], through: tuple[str, ...] = ()
) -> CompiledGuard:
    return CompiledGuard(source, compile(source, "<probe guard>", "eval"), recorded, live, through)


__all__ = ["CompiledGuard", "Segment", "SegmentEnd", "SpanReplay", "compile_guard"]
