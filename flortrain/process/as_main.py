"""Run compiled script code as ``__main__``, the way ``python SCRIPT ARGS`` would.

``sys.argv``, ``__file__``, ``sys.path[0]`` and ``sys.modules['__main__']`` are set as Python sets
them (so classes defined in the script pickle, and DataLoader workers find them). An uncaught
exception prints the traceback Python would print, starting at the user's frame, and exits 1.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import os
import signal
import sys
import types
from pathlib import Path
from types import CodeType, TracebackType

from flortrain.errors import FlortrainError
from flortrain.process.distributed import Refused
from flortrain.runtime.jumps import SegmentEnd

_PKG = str(Path(__file__).resolve().parent.parent)

#: Set when the script ended on Ctrl-C: the command then dies by SIGINT, as python does, once
#: the run is finalized (``flortrain.cli.main``).
interrupted = False
#: Set when flortrain refused to go on with the script (a distributed run): the command ends the
#: run as failed and prints it as its one-line error.
refusal: FlortrainError | None = None


#: what ``TracebackType`` takes for "the line of ``tb_lasti``", found when it is read
_LINE_OF_LASTI = -1


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without flortrain's frames: those above the script (the runner) and those
    the script's own calls pass through (the stdout tee a ``print`` writes to, a hook's
    ``contextlib`` frame), so the user sees what ``python`` would show. ``FLORTRAIN_DEBUG=1`` keeps them, for flortrain's own bugs.

    An entry's line is passed on as "the line of its instruction", not as its ``tb_lineno``: a
    signal handled at an instruction that has no line (the backward jump of ``for x in it: if x:
    ...``) leaves ``tb_lineno`` None, which ``TracebackType`` refuses, and a Ctrl-C landing
    there ended the run as an internal error instead of an interrupted one."""
    if os.environ.get("FLORTRAIN_DEBUG"):
        return tb
    frames: list[TracebackType] = []
    while tb is not None:
        if not _ours(tb) and not (_contextlib(tb) and tb.tb_next is not None and _ours(tb.tb_next)):
            frames.append(tb)  # (a ``with`` of flortrain's, as a hook raises what it deferred)
        tb = tb.tb_next
    out: TracebackType | None = None
    for t in reversed(frames):
        out = TracebackType(out, t.tb_frame, t.tb_lasti, _LINE_OF_LASTI)
    return out


def _ours(tb: TracebackType) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(_PKG)


def _contextlib(tb: TracebackType) -> bool:
    return tb.tb_frame.f_globals.get("__name__") == "contextlib"


def _print_exception(e: BaseException) -> None:
    """Print the traceback ``python`` would print, with the printer python uses for an uncaught
    exception (``sys.__excepthook__``: the ``traceback`` module shows a line-less entry as
    ``line None`` where python shows ``line -1``). Never raises: the run must still be finished
    (a traceback that cannot be trimmed is printed whole, flortrain's frames included)."""
    try:
        tb = _user_traceback(e.__traceback__)
    except Exception:
        tb = e.__traceback__
    with contextlib.suppress(Exception):
        sys.__excepthook__(type(e), e.with_traceback(tb), tb)


def exit_code(e: SystemExit) -> int:
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _script_done() -> None:
    """The script's signal handlers have no more business once it has finished. DataLoader's
    SIGCHLD handler re-raises a dead worker's error at every SIGCHLD, and under ``python`` nothing
    runs after the script to receive it; here flortrain still prints the traceback, flushes the
    checkpoint writer (whose exit is a SIGCHLD) and commits the run."""
    with contextlib.suppress(ValueError, OSError):  # not the main thread
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def run_as_main(code: CodeType, script: str, args: list[str]) -> int:
    """Execute; return the exit status Python would have exited with (2 for a refusal)."""
    global interrupted, refusal
    refusal = None
    module = types.ModuleType("__main__")
    # the globals CPython (3.11) gives `python SCRIPT`: __file__ and frames absolute, argv[0] as
    # given, the builtins module itself, a source loader, no spec and no cached bytecode
    path = os.path.abspath(script)
    module.__dict__.update(
        __file__=path,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __spec__=None,
        __cached__=None,
        __annotations__={},
    )
    saved_main = sys.modules.get("__main__")
    saved_argv = sys.argv[:]
    saved_path = sys.path[:]
    sys.modules["__main__"] = module
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        try:
            exec(code, module.__dict__)
        finally:
            _script_done()
        return 0
    except SystemExit as e:
        return exit_code(e)
    except SegmentEnd:  # a parallel-replay worker past its segment: its part of the run is done
        return 0
    except Refused as e:
        refusal = e.error
        return 2
    except KeyboardInterrupt as e:
        interrupted = True
        _print_exception(e)
        return 130
    except BaseException as e:
        _print_exception(e)
        return 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
