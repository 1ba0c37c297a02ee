"""A signal that arrives while a hook holds the training thread is handled when the hook returns.

CPython runs a Python-level signal handler in the main thread between two bytecodes, wherever
that thread happens to be. A handler that raises (DataLoader's SIGCHLD handler when a worker
dies, a script's SIGALRM time limit, ``KeyboardInterrupt``) therefore raises inside flortrain's
code when its signal falls into a hook, about 2% of a recorded run's time. There the exception
either unwinds flortrain half-way through staging a checkpoint, or is taken for a failure of the
checkpoint by one of the broad ``except Exception`` that keep training from ever crashing
because of flortrain, and turned into a warning: the script then goes on where under ``python``
it would have stopped. (Found at stop 41, looking for why a DataLoader crash test once reported
its dead worker through torch's 5 s status check instead of its SIGCHLD handler.)

So for a hook's duration (:meth:`Session.holding`) each Python-level handler is replaced by one
that only notes its signal; when the hook is over the script's handlers are put back and called
for the signals that arrived, in order. The exception then reaches the script's code at the
hook's call, the nearest point where it could have arrived under ``python``, and the hook has
finished what it started. Blocking the signals (``pthread_sigmask``) would not do: it is per
thread, and a signal delivered to any other thread (torch's OpenMP workers, flortrain's own)
still has its Python handler run in the main thread at the next bytecode.

The cost is reading the handler table (about 6 µs for 62 signals, through ``_signal``: the
``signal`` module's wrappers turn every number into an enum and take ten times as long) and two
``sigaction`` calls per handler the script has (SIGINT's, by default), per hook.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals()))
#: the C functions under ``signal.getsignal``/``signal.signal``, without their enum wrappers
#: (``_signal`` has no type stub)
_raw: Any = importlib.import_module("_signal")
_getsignal: Callable[[int], Any] = _raw.getsignal
_setsignal: Callable[[int, Any], Any] = _raw.signal

Handler = Callable[[int, FrameType | None], Any]


class Deferred:
    """The handlers a hook set aside, and the signals that arrived meanwhile."""

    __slots__ = ("arrived", "note", "saved")

    def __init__(self) -> None:
        self.saved: list[tuple[int, Handler]] = []
        self.arrived: list[int] = []
        self.note: Handler = lambda signum, frame: self.arrived.append(signum)


def defer() -> Deferred | None:
    """Set the script's Python-level handlers aside until :func:`resume`; None outside the main
    thread, where Python runs no handler and may set none."""
    if threading.get_ident() != threading.main_thread().ident:  # read now: a fork may change it
        return None
    d = Deferred()
    try:
        for s in _SIGNALS:
            h = _getsignal(s)
            if callable(h):
                _setsignal(s, d.note)
                d.saved.append((s, h))
    except (ValueError, OSError):  # cannot set it after all: leave every handler as it was
        _put_back(d)
        return None
    return d


def resume(d: Deferred | None) -> None:
    """Put the script's handlers back, then run them for the signals that arrived, in order
    (once each: the OS does not queue a second instance of a pending standard signal either).
    What a handler raises propagates to the caller."""
    if d is None:
        return
    _put_back(d)
    if not d.arrived:
        return
    frame = _script_frame()
    for s in dict.fromkeys(d.arrived):
        h = _getsignal(s)
        if callable(h):
            h(s, frame)


def _put_back(d: Deferred) -> None:
    for s, h in d.saved:
        if _getsignal(s) is d.note:  # unless something in the hook set its own since
            _setsignal(s, h)


def _script_frame() -> FrameType | None:
    """The innermost frame outside flortrain (and ``contextlib``): where the handler would have
    interrupted the script."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if not (name == "contextlib" or name == "flortrain" or name.startswith("flortrain.")):
            return f
        f = f.f_back
    return None
