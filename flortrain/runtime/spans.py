"""Iteration spans at run time: boundary state at main-loop iteration starts, and jumps.

Record, at the start of every main-loop iteration (:class:`Boundary`):
- the carried plain scalars (``iter_num``, ``epoch``, ``best_val_loss`` while a float) go into
  the iteration's row: a few microseconds, so every iteration has them;
- at an adaptive period (the same Eq. 4 as blocks, with the iteration as the unit of compute), a
  *boundary checkpoint* of everything the iteration changes: the main loop's changeset, every
  live root module, optimizer and data loader, and the RNG streams.

Replay (:class:`SpanReplay`): at the start of iteration ``i``, if no probe can fire in it (each
probe's guard, evaluated on the recorded scalars of ``i`` and the live loop invariants, is false),
the replay restores the latest boundary checkpoint ``j`` with ``i < j <= f``, ``f`` the next
iteration where a probe fires (or the last recorded iteration), and continues at ``j``: iterations
``i..j-1`` are jumped over. A guard that cannot be evaluated (a value missing, an error) counts
as firing: the iteration runs. ``diff`` leaves jumped iterations out and checks the RNG streams at
``j`` against the record.

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
import json
import sys
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from flortrain.runtime import identity
from flortrain.runtime.skipblock import Checkpointable

if TYPE_CHECKING:
    from flortrain.runtime.session import Session

Getters = Mapping[str, Callable[[], Any]]

_SCALARS = (int, float, bool, str, type(None))


def scalars_json(getters: Getters) -> str | None:
    """The plain scalar values among ``getters`` as JSON (exact types only: a numpy scalar or a
    0-dim tensor is left out, and a guard reading it then counts as firing). Floats round-trip
    exactly through ``repr``; NaN and infinities are written as JSON's usual extensions."""
    out: dict[str, Any] = {}
    for name, get in getters.items():
        try:
            v = get()
        except (NameError, AttributeError):
            continue
        if type(v) in _SCALARS:
            out[name] = v
    return json.dumps(out, allow_nan=True) if out else None


class Boundary(Checkpointable):
    """The state at the start of one main-loop iteration."""

    def __init__(
        self, session: Session, main_id: str, detach_ok: tuple[str, ...], index: int = 0
    ) -> None:
        super().__init__(main_id, detach_ok, session.registry.count())
        self.jumped_to: int | None = None
        self.index = index  # the iteration whose start this is
        self.observed: identity.BoundaryMarks | None = None

    def marks(self, s: Session) -> identity.InstanceMarks | identity.BoundaryMarks | None:
        """Against the previous boundary this record captured (the loop's entry first)."""
        self.observed = identity.BoundaryMarks(s.identity_tables.get(self.id, {}), self.index)
        return self.observed

    def augment(self, s: Session, objs: list[Any]) -> list[tuple[str, int, Any]]:
        """Every live root module, optimizer and data loader, on top of the loop's own: an
        iteration is all of training, and a resumed replay needs all of it."""
        out = super().augment(s, objs)
        torch = sys.modules.get("torch")
        if torch is None:
            return out
        have = {i for _, i, _ in out} | {i for o in objs if (i := s.registry.id_of(o)) is not None}
        loaders = [
            (i, o) for i, o in s.registry.live() if isinstance(o, torch.utils.data.DataLoader)
        ]
        for i, obj in [*s.watchable(), *loaders]:
            if i not in have:
                have.add(i)
                kind = (
                    "module"
                    if isinstance(obj, torch.nn.Module)
                    else "optimizer"
                    if isinstance(obj, torch.optim.Optimizer)
                    else "loader"
                )
                out.append((kind, i, obj))
        return out

    def _registry_fits(self, recorded_start: int) -> bool:
        """The jumped iterations may have created modules, optimizers or loaders (a
        ``DataLoader`` built every epoch): their ids are reserved on restore."""
        return recorded_start >= self.registry_start

    def _may_drop(self, ref: str, obj: Any) -> bool:
        """A data loader the replay does not have, because a jumped iteration created it, is
        left out: nothing carried refers to it (a carried name would hold it), so it is never
        iterated again. A missing module or optimizer is training state: the jump is refused."""
        return ref.startswith("loader#") and (
            obj is None or int(ref.split("#", 1)[1]) >= self.registry_start
        )

    def restore(self, s: Session, objects: Getters, names: Getters | None = None) -> None:
        assert self.payload is not None
        s.registry.pad(self.payload["registry"]["start"] - s.registry.count())
        super().restore(s, objects, names)

    def jumped(self) -> bool:
        """Whether the replay restored a later iteration's boundary (the generated code then
        reassigns the rebound names)."""
        return self.jumped_to is not None


class NoBoundary:
    """What ``main_iteration`` returns with no session: nothing is ever restored."""

    def jumped(self) -> bool:
        return False


NO_BOUNDARY = NoBoundary()


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


__all__ = [
    "NO_BOUNDARY",
    "Boundary",
    "CompiledGuard",
    "Segment",
    "SegmentEnd",
    "SpanReplay",
    "compile_guard",
    "scalars_json",
]
