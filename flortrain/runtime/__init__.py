"""What instrumented scripts call. Seven names, no torch import at load time.

With no active session (instrumented code run by plain ``python``) every hook is a no-op and the
script behaves exactly as written. A hook that needs the user's frame (the one running the loop)
takes its caller's, once, at its entry, and passes it down: nothing below counts frames.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TypeVar

from flortrain.runtime import session as _session
from flortrain.runtime.boundaries import NO_BOUNDARY, MainBoundary, NoBoundary
from flortrain.runtime.checkpointable import Getters
from flortrain.runtime.probe import isolated
from flortrain.runtime.skipblock import SkipBlock

T = TypeVar("T")

__all__ = [
    "block",
    "forward",
    "main_enter",
    "main_exit",
    "main_iter",
    "main_iteration",
    "probe",
    "probing",
]


def block(
    block_id: str,
    first_line: int = 0,
    last_line: int = 0,
    values: tuple[str, ...] = (),
    objects: Getters | None = None,
    names: Getters | None = None,
    unchecked: tuple[str, ...] = (),
) -> SkipBlock:
    """Open the SkipBlock of one memoized loop instance, whose loop spans these lines of the
    script (how the runtime notices an exception carrying control out of the loop). ``values``
    are rebound names read after the loop only as numbers: stored detached if they carry a graph.
    ``objects`` are the changeset's objects restored in place and ``names`` its rebound names,
    read as the instance starts (which objects the loop replaces, ``identity``). ``unchecked``
    are rebound names restored but not compared with the record's checkpoint (clock readings)."""
    s = _session.current
    if s is None:
        return SkipBlock(None, block_id, (first_line, last_line), values)
    frame = sys._getframe(1)  # the instrumented code's, which runs the loop
    with s.holding():
        return SkipBlock(
            s,
            block_id,
            (first_line, last_line),
            values,
            objects if objects is not None else {},
            names,
            unchecked,
            frame,
        )


def main_enter(main_id: str) -> None:
    if _session.current is not None:
        _session.current.main_enter(main_id)


def main_iteration(
    main_id: str,
    objects: Getters | None = None,
    names: Getters | None = None,
    values: tuple[str, ...] = (),
) -> MainBoundary | NoBoundary:
    """The start of a main-loop iteration; with the loop's boundary state (getters of what an
    iteration changes), what a replay restored when it jumped here (see ``jumped()``)."""
    s = _session.current
    if s is None:
        return NO_BOUNDARY
    frame = sys._getframe(1)  # the instrumented code's, which runs the main loop
    with s.holding():
        b = s.main_iteration(main_id, objects, names, values, frame)
    return NO_BOUNDARY if b is None else b


def main_iter(main_id: str, iterable: Iterable[T]) -> Iterable[T]:
    """A main ``for`` loop's iterable; on a replay that can jump iterations, a generator that
    skips the items of the iterations jumped over."""
    s = _session.current
    if s is None:
        return iterable
    return s.main_items(main_id, iterable, sys._getframe(1))


def main_exit(main_id: str) -> None:
    if _session.current is not None:
        _session.current.main_exit(main_id)


def forward(
    main_id: str, line: int, modules: tuple[str, ...] = (), containers: tuple[str, ...] = ()
) -> bool:
    """Whether to run the main-loop statement at ``line``: always, except while a pseudoresume
    fast-forwards through iterations nobody reports and the run-time check of what the static
    pass assumed passes (:mod:`flortrain.runtime.fastforward`)."""
    s = _session.current
    if s is None or not s.fast_forwarding(main_id):
        return True
    with s.holding():
        return not s.leave_out(line, modules, containers, sys._getframe(1))


def probing() -> bool:
    """Whether a probe statement runs: always, except in a worker's iterations before its
    segment, whose output nobody wants and whose blocks restored their checkpoints instead of
    binding what only they bind."""
    s = _session.current
    return s is None or not s.before_segment()


def probe(number: int) -> AbstractContextManager[None]:
    """Run a hindsight statement isolated from the training it observes."""
    return isolated(_session.current)
