"""What instrumented scripts call. Five names, no torch import at load time.

With no active session (instrumented code run by plain ``python``) every hook is a no-op and the
script behaves exactly as written.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from flortrain.runtime import session as _session
from flortrain.runtime.probe import isolated
from flortrain.runtime.skipblock import SkipBlock

__all__ = ["block", "main_enter", "main_exit", "main_iteration", "probe"]


def block(block_id: str, first_line: int = 0, last_line: int = 0, values: tuple[str, ...] = ()) -> SkipBlock:
    """Open the SkipBlock of one memoized loop instance, whose loop spans these lines of the
    script (how the runtime notices an exception carrying control out of the loop). ``values``
    are rebound names read after the loop only as numbers: stored detached if they carry a graph."""
    return SkipBlock(_session.current, block_id, (first_line, last_line), values)


def main_enter(main_id: str) -> None:
    if _session.current is not None:
        _session.current.main_enter(main_id)


def main_iteration(main_id: str) -> None:
    if _session.current is not None:
        _session.current.main_iteration(main_id)


def main_exit(main_id: str) -> None:
    if _session.current is not None:
        _session.current.main_exit(main_id)


def probe(number: int) -> AbstractContextManager[None]:
    """Run a hindsight statement isolated from the training it observes."""
    return isolated(_session.current)
