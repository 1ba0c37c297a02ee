"""A record stopped by SIGINT or SIGTERM ends as an interrupted run that ``record --resume`` continues.

These are how people stop training: Ctrl-C, ``kill``, a scheduler's SIGTERM before its SIGKILL.
A record that died of one lost what it had not committed yet (the checkpoints in the writer's
hands, the rows held for the next commit), and a Ctrl-C left the run ``failed``, which cannot
be resumed. So in a record's training process:

- **SIGINT** is Python's ``KeyboardInterrupt``, raised once per Ctrl-C
  (:class:`~flortrain.signals.Interrupt`: a signal sent to the process group reaches this
  process directly and through the launcher). The script unwinds as under ``python``; the run is
  finished as ``interrupted`` and the command dies of SIGINT (``flortrain.cli.main``). One that
  falls in a hook is raised as the hook returns (or from its wait for the writer:
  :mod:`~flortrain.signals`); one that comes once the script has ended only cuts the
  wait for the writer short, and the run is finished as the script ended it.
- **SIGTERM**, whose default is to die at once, runs no more of the script either: the handler
  (:class:`Terminate`) ends the run where the script stands, as the script's end would (the
  checkpoints handed to the writer go to the launcher to commit, or are waited for; the held
  rows and captured output are written), marks it ``interrupted``, and then dies of SIGTERM.
  Python runs the handler between two bytecodes of the main thread: one that falls inside
  flortrain's own code (a hook defers it to its end; outside one, the tee) is sent again 10 ms
  later, until it falls in the script's. One that comes once the script has ended waits until
  the run is finished. A main thread stuck in one long C call dies when the call returns.

Either way, the run's last committed boundary is the start of the iteration the signal
interrupted, or an earlier one. A script that set a handler of its own keeps it, and its
handler decides (an exit status other than 0 is then a failed run, as without a signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from flortrain import signals
from flortrain.process.as_main import run_as_main

_RUNNER = run_as_main.__code__
#: how long a SIGTERM that fell in flortrain's code waits to be sent again
RETRY = 0.01


def _in_script(frame: FrameType | None) -> bool:
    """Whether the main thread, interrupted at ``frame``, is in the script's code (or the
    libraries it calls), with no frame of flortrain's between it and the runner. A signal a hook
    deferred is delivered from flortrain's code (``signals.delivering``), never the script's."""
    if signals.delivering:
        return False
    f = frame
    while f is not None:
        if f.f_code is _RUNNER:
            return True
        if f.f_globals.get("__name__", "").startswith("flortrain"):
            return False
        f = f.f_back
    return False  # the script is over: the run is finishing


class Terminate:
    """The SIGTERM handler of a record's training process: ``stop(signum)`` ends the run, then
    the process dies of the signal. In a process forked from it (a DataLoader worker), the
    signal's default."""

    def __init__(self, stop: Callable[[int], None]) -> None:
        self.stop = stop
        self.owner = os.getpid()
        self.stopping = False
        #: the script has ended: a SIGTERM waits until the run is finished (:meth:`Stoppable.close`)
        self.over = False
        self.noted: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.owner:
            die(signum)
        if self.stopping:  # the same SIGTERM, forwarded by the launcher as well
            return
        if self.over:
            self.noted = signum
            return
        if not _in_script(frame):
            retry = threading.Timer(RETRY, _send, (self.owner, signum))
            retry.daemon = True
            retry.start()
            return
        self.stopping = True
        # no other handler of the script's runs in what follows (DataLoader's SIGCHLD, as its
        # workers die of the same signal), nor a second Ctrl-C: the process is ending
        signals.defer(self.owner)
        _set(signal.SIGINT, signal.SIG_IGN)
        _set(signal.SIGCHLD, signal.SIG_DFL)
        try:
            self.stop(signum)
        finally:
            die(signum)


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def _set(signum: int, handler: object) -> None:
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signum, handler)  # type: ignore[arg-type]


def die(signum: int) -> None:
    """End this process by ``signum``'s default action, as the script would have ended."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


class Stoppable:
    """The handlers :func:`install` set, and what they replaced."""

    def __init__(self) -> None:
        self.saved: dict[int, object] = {}
        self.terminate: Terminate | None = None

    def script_over(self) -> None:
        """The script has ended and the run is being finished: a SIGTERM is noted, not acted on,
        and a Ctrl-C only cuts a wait for the writer short (:class:`~signals.Interrupt`)."""
        if self.terminate is not None:
            self.terminate.over = True
        interrupt = signal.getsignal(signal.SIGINT)
        if isinstance(interrupt, signals.Interrupt):
            interrupt.over = True

    def close(self) -> None:
        """The run is finished: put back the handlers replaced (unless the script set its own
        since), and die of a SIGTERM that came while it was being finished."""
        for signum, old in self.saved.items():
            current = signal.getsignal(signum)
            if isinstance(current, (Terminate, signals.Interrupt)):
                _set(signum, old)
        self.saved.clear()
        if self.terminate is not None and self.terminate.noted is not None:
            die(self.terminate.noted)


def install(stop: Callable[[int], None]) -> Stoppable:
    """Where the script has the default handling of SIGINT (Python's) and SIGTERM (none), take
    them over as the module says. Only in the main thread."""
    done = Stoppable()
    if threading.current_thread() is not threading.main_thread():
        return done
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        done.saved[signal.SIGINT] = signal.default_int_handler
        signal.signal(signal.SIGINT, signals.Interrupt())
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        done.saved[signal.SIGTERM] = signal.SIG_DFL
        done.terminate = Terminate(stop)
        signal.signal(signal.SIGTERM, done.terminate)
    return done


#: the handlers of the record running in this process, until :func:`close`
current: Stoppable | None = None


def close() -> None:
    """The run is finished (:meth:`Stoppable.close`)."""
    global current
    done, current = current, None
    if done is not None:
        done.close()
