"""A signal that arrives while a hook holds the training thread is handled when the hook returns.

CPython runs a Python-level signal handler in the main thread between two bytecodes, wherever
that thread happens to be. A handler that raises (DataLoader's SIGCHLD handler when a worker
dies, a script's time limit on SIGALRM or SLURM's SIGUSR1) would therefore raise inside
flortrain's code when its signal fell into a hook. There the exception would either unwind
flortrain half-way through staging a checkpoint, or be taken for a failure of the checkpoint by
one of the broad ``except Exception`` that keep training from ever crashing because of
flortrain, and turned into a warning: the script would then go on where under ``python`` it
would have stopped.

So for a hook's duration (:meth:`Session.holding`) each Python-level handler is replaced by a
:class:`Note` that only notes its signal; when the hook is over the script's handlers are put
back and called for the signals that arrived, in order. The exception then reaches the script's
code at the hook's call, the nearest point where it could have arrived under ``python``, and the
hook has finished what it started. Blocking the signals (``pthread_sigmask``) would not do: the
mask is per thread, and a signal delivered to any other thread (torch's OpenMP workers) still
has its Python handler run in the main thread at the next bytecode.

SIGINT is deferred too, whoever handles it (Python's own handler, a record's :class:`Interrupt`,
the script's): a ``KeyboardInterrupt`` is no ``Exception`` and passes every guard of
flortrain's, so raised half-way through a hook it left the hook's work half done (a checkpoint
staged and never handed to the writer, rows held and never written). Except while the hook
*waits* (:func:`waiting`: for a writer that has not freed the staging buffer, for the writer's
last results at the end): there a Ctrl-C must cut the wait short, and does, from the wait,
where nothing is half done.

Setting a handler runs the pending ones first, and a loop runs them at every turn, so a signal
can still reach a script's handler inside :func:`defer` or :func:`resume`. Nothing is lost then:
what that handler raises propagates (from the hook's entry or its return), and a note that an
interrupted put-back left installed is *closed*: the next signal to reach it puts the script's
handlers back and hands the signal to the script's own (:meth:`Note.__call__`). A fork inherits
no note (:func:`_heal`, at fork).

The cost is reading the handler table (about 6 µs for 62 signals, through ``_signal``: the
``signal`` module's wrappers turn every number into an enum and take ten times as long) and two
``sigaction`` calls per handler the script has, per hook.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

_SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals()))
#: the C functions under ``signal.getsignal``/``signal.signal``, without their enum wrappers
#: (``_signal`` has no type stub)
_raw: Any = importlib.import_module("_signal")
_getsignal: Callable[[int], Any] = _raw.getsignal
_setsignal: Callable[[int, Any], Any] = _raw.signal
_SIGINT = int(signal.SIGINT)


class Interrupt:
    """A record's SIGINT handler in place of Python's own (:mod:`flortrain.process.stopping`):
    ``KeyboardInterrupt`` as Python raises it, once per Ctrl-C. The launcher forwards a SIGINT
    that ``kill`` sent it, and a signal sent to the whole process group reaches the training
    process as well: a second one within :attr:`WINDOW` seconds of the first is that same
    Ctrl-C, which Python would not have seen twice. Deferred in hooks like any handler. Once
    the script is over (:attr:`over`) and the run is being finished, a Ctrl-C only cuts a wait
    for the writer short (:func:`waiting`); anywhere else it is noted (:attr:`noted`): the run
    is finished as the script ended it."""

    WINDOW = 1.0

    __slots__ = ("last", "noted", "over")

    def __init__(self) -> None:
        self.last: float | None = None
        self.over = False
        self.noted = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.last is not None and now - self.last < self.WINDOW:
            return
        self.last = now
        if self.over and not waiting_now:
            self.noted = True
            return
        raise KeyboardInterrupt


class Note:
    """The handler a hook installs in place of the script's: while the hook is open it notes the
    signal; once closed, a signal that still reaches it (its put-back was interrupted) puts the
    script's handlers back and goes to the script's own handler."""

    __slots__ = ("arrived", "open", "saved")

    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}  # signal -> the script's handler
        self.arrived: list[int] = []
        self.open = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.open and not (waiting_now and self.interrupts(signum)):
            self.arrived.append(signum)
            return
        if self.open:  # a Ctrl-C while the hook waits: it cuts the wait short
            _call(self.saved.get(signum), signum, frame)
            return
        _put_back(self)
        _call(self.saved.get(signum), signum, frame)

    def interrupts(self, signum: int) -> bool:
        """Whether ``signum`` is a Ctrl-C that raises ``KeyboardInterrupt`` (Python's handler or
        a record's): a wait lets it through. A script's own SIGINT handler waits for the hook's
        end like any other (it may raise what a guard of flortrain's would catch)."""
        h = self.saved.get(signum)
        return signum == _SIGINT and (h is signal.default_int_handler or type(h) is Interrupt)


def _call(handler: Any, signum: int, frame: FrameType | None) -> None:
    if callable(handler):
        handler(signum, frame)


def defer(owner: int) -> Note | None:
    """Set the script's Python-level handlers aside until :func:`resume`. None outside the main
    thread of the process ``owner`` (the training process): Python runs no handler on another
    thread and may set none there, and a forked child (a DataLoader worker) has handlers of its
    own that setting one would replace."""
    global _open
    if os.getpid() != owner or threading.get_ident() != threading.main_thread().ident:
        return None
    note = Note()
    try:
        for s in _SIGNALS:
            h = _getsignal(s)
            if not callable(h):
                continue
            if type(h) is Note:  # left by an interrupted put-back: the script's is behind it
                h = h.saved.get(s)
                if not callable(h):
                    continue
            note.saved[s] = h
            _setsignal(s, note)
    except BaseException:  # a script's handler ran here and raised: the hook has not begun
        note.open = False
        _put_back(note)
        raise
    _open = note
    return note


def resume(note: Note | None) -> None:
    """Put the script's handlers back, then run them for the signals that arrived, in order. A
    handler that raises does not keep the others from running; the first exception propagates
    once they have."""
    global _open
    if note is None:
        return
    note.open = False
    if _open is note:
        _open = None
    arrived = list(dict.fromkeys(note.arrived))  # once each: the OS does not queue a second either
    try:
        _put_back(note)
    finally:
        _deliver(arrived)


def _put_back(note: Note) -> None:
    for s, h in note.saved.items():
        if _getsignal(s) is note:  # unless something in the hook set a handler of its own since
            _setsignal(s, h)


#: the note of the hook in progress (None: no hook holds the thread)
_open: Note | None = None
#: True while flortrain's code waits (:func:`waiting`): a Ctrl-C is raised there, not deferred
waiting_now = False


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """flortrain's code waits here (for the writer): a Ctrl-C that arrives meanwhile, or that
    arrived earlier in the hook, raises ``KeyboardInterrupt`` from here, as it would have from
    the wait without flortrain's hook around it."""
    global waiting_now
    if waiting_now:  # within a wait already
        yield
        return
    waiting_now = True
    try:
        note = _open
        if note is not None and note.open and _SIGINT in note.arrived and note.interrupts(_SIGINT):
            note.arrived = [s for s in note.arrived if s != _SIGINT]
            _call(note.saved.get(_SIGINT), _SIGINT, _script_frame())
        yield
    finally:
        waiting_now = False


#: True while :func:`_deliver` runs the script's handlers from flortrain's code (a handler that
#: must know where the signal found the main thread: ``stopping.Terminate``)
delivering = False


def _deliver(arrived: list[int]) -> None:
    global delivering
    if not arrived:
        return
    frame = _script_frame()
    raised: list[BaseException] = []
    delivering = True
    try:
        for s in arrived:
            h = _getsignal(s)  # the script's, or a closed note that hands the signal to it
            if callable(h):
                try:
                    h(s, frame)
                except BaseException as e:
                    raised.append(e)
    finally:
        delivering = False
    if raised:
        for other in raised[
            1:
        ]:  # each handler ran; the first exception propagates, naming the others
            raised[0].add_note(
                f"(a handler of another signal that arrived meanwhile raised {other!r})"
            )
        raise raised[0]


def _script_frame() -> FrameType | None:
    """The innermost frame outside flortrain (and ``contextlib``): where the handler would have
    interrupted the script."""
    f: FrameType | None = sys._getframe()
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if not (name == "contextlib" or name == "flortrain" or name.startswith("flortrain.")):
            return f
        f = f.f_back
    return None


def _heal() -> None:
    """In a child forked during a hook (a writer started again mid-run): the script's handlers,
    not a note no hook will ever resume."""
    for s in _SIGNALS:
        h = _getsignal(s)
        if isinstance(h, Note):
            _put_back(h)


os.register_at_fork(after_in_child=_heal)
