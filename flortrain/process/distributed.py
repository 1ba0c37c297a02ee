"""Record and replay refuse to run under ``torch.distributed`` with more than one process.

Each rank of a distributed run is a process of its own: under ``torchrun -m flortrain record``
every rank recorded a run, nothing tied the runs of one launch together, and every rank of a
replay replayed the store's latest record, whichever rank had made it (wrong probe values, and
"0 output lines compared" on the others). Until runs are grouped per launch and a rank replays
its own rank's record, flortrain refuses, in one line, exit 2:

- before the script runs, when the environment says the process is one rank of several
  (``WORLD_SIZE`` > 1: torchrun, ``torch.distributed.launch``, and launchers that follow them);
- when the script calls ``torch.distributed.init_process_group`` for a world of more than one
  process that the environment did not announce (ranks and world size passed as arguments,
  ranks started by ``torch.multiprocessing.spawn``). The call raises :class:`Refused`, a
  ``BaseException`` so that a script's ``except Exception`` (a fallback to one process) cannot
  swallow it; the runner ends the run as failed and the command prints the refusal.

Processes that ``torch.multiprocessing.start_processes`` (and ``spawn``) starts are fresh
interpreters flortrain never runs in, so their function is wrapped (:class:`_Ranked`): in the
child it installs the same check and, on a refusal, writes it to a file and exits; the parent
raises it from the ``spawn`` call once the processes have ended.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlparse

from flortrain.errors import FlortrainError, Located

CODE = "FT060"
#: the exit status of a spawned rank that refused
_REFUSED_EXIT = 2


class Refused(BaseException):
    """Raised by the guarded ``init_process_group``; carries the one-line error."""

    def __init__(self, error: FlortrainError) -> None:
        super().__init__(error.one_line())
        self.error = error


def _reason(what: str, world: int) -> str:
    return (
        f"{what} a torch.distributed run of {world} processes, which flortrain does not support yet"
        " (each rank would record a run of its own, and no replay could tell them apart); run the"
        " script as a single process"
    )


def check_environment(script: str, command: str) -> None:
    """Refuse ``command`` (record or replay) in a process the environment makes one rank of
    several, before anything runs."""
    raw = os.environ.get("WORLD_SIZE", "")
    try:
        world = int(raw)
    except ValueError:
        return
    if world > 1:
        rank = os.environ.get("RANK", "?")
        raise FlortrainError(
            _reason(f"cannot {command} rank {rank} of", world), Located(script), CODE
        )


def _world_size(bound: inspect.BoundArguments) -> int:
    """The world size an ``init_process_group`` call asks for: its argument, else its
    ``init_method``'s ``world_size=`` query, else ``WORLD_SIZE`` (``env://``)."""
    world = bound.arguments.get("world_size", -1)
    if isinstance(world, int) and world > 0:
        return world
    method = bound.arguments.get("init_method")
    if isinstance(method, str):
        query = parse_qs(urlparse(method).query).get("world_size")
        if query and query[0].isdigit():
            return int(query[0])
    raw = os.environ.get("WORLD_SIZE", "")
    return int(raw) if raw.isdigit() else 1


def _caller(frame: FrameType) -> Located:
    """Where the script called ``init_process_group``: ``frame`` (the guard's caller), or the
    first frame above it outside flortrain and torch (a call through a torch helper)."""
    f = frame
    while f.f_back is not None and f.f_globals.get("__name__", "").startswith(
        ("flortrain.", "torch.")
    ):
        f = f.f_back
    path = f.f_code.co_filename
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return Located(path if rel.startswith("..") else rel, f.f_lineno, 1)


def _guarded(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, refusing a world of more than one process. In a process forked from the
    one that installed it (a ``multiprocessing.Process``), nothing would take the exception to
    the user as one line: that process says it and exits."""
    signature = inspect.signature(original)
    owner = os.getpid()

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        frame = sys._getframe(1)  # the caller's, taken at the entry as the runtime's hooks do
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch says what is wrong with the call
        world = _world_size(bound)
        if world > 1:
            error = FlortrainError(
                _reason("init_process_group starts", world), _caller(frame), CODE
            )
            if os.getpid() != owner:
                print(error.one_line(), file=sys.stderr, flush=True)
                os._exit(_REFUSED_EXIT)
            raise Refused(error)
        return original(*args, **kwargs)

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    return init_process_group


def _patch(undo: list[Callable[[], None]], owner: Any, name: str, new: Callable[..., Any]) -> None:
    old = getattr(owner, name)
    setattr(owner, name, new)
    undo.append(lambda: setattr(owner, name, old))


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """While the script runs: ``init_process_group`` refuses a world of more than one process,
    here and in the processes ``torch.multiprocessing`` starts. Nothing without torch."""
    undo: list[Callable[[], None]] = []
    if "torch" in sys.modules:
        with contextlib.suppress(ImportError, AttributeError):
            _install(undo)
    try:
        yield
    finally:
        while undo:
            undo.pop()()


def _install(undo: list[Callable[[], None]]) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    original = c10d.init_process_group
    guard = _guarded(original)
    _patch(undo, c10d, "init_process_group", guard)
    if getattr(dist, "init_process_group", None) is original:
        _patch(undo, dist, "init_process_group", guard)
    mesh = sys.modules.get("torch.distributed.device_mesh")
    if mesh is not None and getattr(mesh, "init_process_group", None) is original:
        _patch(undo, mesh, "init_process_group", guard)
    import torch.multiprocessing as tmp

    spawn = sys.modules["torch.multiprocessing.spawn"]
    start = _starting(spawn.start_processes)
    _patch(undo, spawn, "start_processes", start)
    _patch(undo, tmp, "start_processes", start)


class _Ranked:
    """A function ``torch.multiprocessing`` runs in each process it starts, with the check in
    place there. Pickled by reference to this module, which the child imports."""

    def __init__(self, fn: Callable[..., Any], report: str) -> None:
        self.fn = fn
        self.report = report

    def __call__(self, *args: Any) -> Any:
        undo: list[Callable[[], None]] = []
        with contextlib.suppress(ImportError, AttributeError, KeyError):
            _install(undo)
        try:
            return self.fn(*args)
        except Refused as r:
            e = r.error
            where = e.where or Located("")
            with open(self.report, "w") as f:
                json.dump(
                    {
                        "message": e.message,
                        "path": where.path,
                        "line": where.line,
                        "col": where.col,
                    },
                    f,
                )
            os._exit(_REFUSED_EXIT)


def _refusal(report: str) -> Refused | None:
    try:
        with open(report) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    return Refused(
        FlortrainError(got["message"], Located(got["path"], got["line"], got["col"]), CODE)
    )


def _starting(original: Callable[..., Any]) -> Callable[..., Any]:
    def start_processes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        fd, report = tempfile.mkstemp(prefix="flortrain-rank-", suffix=".json")
        os.close(fd)
        os.unlink(report)  # a rank that refuses creates it
        joined = True
        try:
            context = original(_Ranked(fn, report), *args, **kwargs)
            if context is not None and hasattr(context, "join"):  # join=False: the script joins
                joined = False
                context.join = _joining(context.join, report)
            return context
        except Exception as e:
            refused = _refusal(report)
            if refused is not None:
                raise refused from e
            raise
        finally:
            if joined:
                with contextlib.suppress(OSError):
                    os.unlink(report)

    return start_processes


def _joining(join: Callable[..., Any], report: str) -> Callable[..., Any]:
    def joined(*args: Any, **kwargs: Any) -> Any:
        try:
            return join(*args, **kwargs)
        except Exception as e:
            refused = _refusal(report)
            if refused is not None:
                with contextlib.suppress(OSError):
                    os.unlink(report)
                raise refused from e
            raise

    return joined
