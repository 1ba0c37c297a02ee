"""The static pass in a forked child, while the parent imports torch.

Before a recorded script's first line runs, ``flortrain record`` pays for two things ``python``
does not: importing libcst and the analyses (``import libcst`` alone is a quarter of a second
here, the pass 0.4-0.6 s in all), and then, like ``python``, importing torch (1.5-1.8 s). Both
are CPU work in one interpreter, one after the other, while a second core waits. Threads would
not help: both hold the GIL for most of their time. ``flortrain replay`` is the same, with a
larger pass (the probes found, the recorded script analysed, the replay planned).

So the parent forks before it has imported anything heavy (the CLI, click and flortrain's light
modules: a fork of so small a process takes about a millisecond, and no thread exists yet to be
caught mid-lock). The child imports libcst, runs the pass, sends its result back through a
pipe (frozen dataclasses and strings, pickled: a few KB, every class defined in a module that
does not import libcst, so that unpickling does not import it in the parent) and leaves with
``os._exit``, running no atexit handler and flushing none of the parent's buffers.
The parent meanwhile imports torch, then reads the result. On two cores the pass then costs
the run almost no wall time; its CPU is unchanged. For record, the child also instruments the
project modules the script imports directly (:func:`module_passes`), which the import hook
would otherwise do in the training process, and runs ``flortrain check`` on the script
(:mod:`flortrain.check.before_record`), whose findings record prints before training.

It is only done where it pays: the script (or a project module it imports) uses torch, torch
is installed, the process may run on two CPUs or more, and ``os.fork`` exists. Otherwise, or
with ``FLORTRAIN_STATIC_OVERLAP=off``, the pass runs in the process first.

Nothing is lost when the child fails. A :class:`FlortrainError` it raises (a syntax error, a
refused file) is raised in the parent unchanged, one located line. Any other failure (a crash,
a kill, a bug, a result that does not unpickle, a fork refused) makes the parent run the pass
itself, as it would have without the child (the modules left to the import hook), which then
succeeds or fails exactly as it would have. A module whose pass fails in the child is left to
the hook too: it may never be imported. The child is reaped by its pid, never by a handler on
SIGCHLD, so a DataLoader's own handler is left alone; where SIGCHLD is ignored (inherited
through ``exec``) the kernel reaps it, and its result alone is judged.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from flortrain import knobs
from flortrain.errors import FlortrainError
from flortrain.static.plan import Instrumented, ModulePass, ModulePasses
from flortrain.static.text import (
    loop_count,
    project_imports,
    project_uses_torch,
    read_text,
    torch_available,
)

if TYPE_CHECKING:
    from flortrain.check.before_record import Checked
    from flortrain.determinism.report import Rewritten

T = TypeVar("T")


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads() -> int:
    """How many threads this process runs, native ones included (1 where /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def worth_overlapping(imports_torch: bool) -> bool:
    """Whether forking the pass off can save wall time, safely: something to overlap it with
    (torch's import), a second CPU to run it on, a fork to run it in, and no other thread, whose
    locks the child could inherit held (an import added to the CLI that starts one would
    otherwise make the fork unsafe without a sign)."""
    return (
        imports_torch
        and knobs.static_overlap() == "on"
        and hasattr(os, "fork")
        and _cpus() >= 2
        and "torch" not in sys.modules  # already imported: nothing left to overlap with
        and _threads() == 1
    )


class Overlapped(Generic[T]):
    """``compute()``, run in a forked child; or ``fallback()`` (by default ``compute``), what this
    process does without a child, run at once here, or when the child gives nothing.

    :meth:`result` returns it (waiting for the child if there is one) or raises its
    :class:`FlortrainError`; :meth:`close` reaps a child not waited for. ``compute`` must be a
    pure function of what it closes over: the child's effects on its own memory are lost, and it
    must not touch the store (its connection is the parent's)."""

    def __init__(
        self,
        compute: Callable[[], T],
        kind: type[T],
        fork: bool,
        fallback: Callable[[], T] | None = None,
    ) -> None:
        self._compute = compute
        self._fallback = fallback or compute  # what this process runs when the child gives nothing
        self._kind = kind
        self._pid: int | None = None
        self._read: int | None = None
        self._done: T | None = None
        #: why the child's result was not used, when it was not (the command says so on stderr)
        self.fell_back: str = ""
        if fork:
            self._fork()
        else:
            self._done = self._fallback()

    @property
    def forked(self) -> bool:
        return self._pid is not None

    def _fork(self) -> None:
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is left for the child to repeat
            with contextlib.suppress(Exception):
                stream.flush()
        kill = knobs.injected("static-child-kill")  # fault injection: read before the fork
        try:
            r, w = os.pipe()
        except OSError as e:  # out of file descriptors: no child, the pass runs here
            self._run_here(f"the static pass's child could not be started ({e.strerror})")
            return
        try:
            pid = os.fork()
        except OSError as e:  # out of processes (a container's pids limit)
            os.close(r)
            os.close(w)
            self._run_here(f"the static pass's child could not be started ({e.strerror})")
            return
        if pid == 0:  # the child: never returns
            code = 0
            try:
                os.close(r)
                if kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                try:
                    payload: tuple[str, object] = ("ok", self._compute())
                except FlortrainError as e:
                    payload = ("error", e)
                data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
                with open(w, "wb") as f:
                    f.write(data)
            except BaseException:  # the parent runs the pass itself and reports what it finds
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self._pid, self._read = pid, r

    def _run_here(self, why: str) -> None:
        self.fell_back = f"{why}; the static pass ran in this process instead"
        self._done = self._fallback()

    def result(self) -> T:
        if self._done is None:
            self._done = self._collect()
        return self._done

    def _collect(self) -> T:
        """The child's result, or the pass run here when the child gave none."""
        if self._read is None or self._pid is None:  # closed before its result was asked for
            return self._fallback()
        chunks: list[bytes] = []
        try:
            with open(self._read, "rb") as f:
                while chunk := f.read(1 << 16):
                    chunks.append(chunk)
        finally:
            self._read = None
            code: int | None = None
            # SIGCHLD ignored (inherited through exec): the kernel reaped it, no status is left
            with contextlib.suppress(ChildProcessError):
                code = os.waitstatus_to_exitcode(os.waitpid(self._pid, 0)[1])
            self._pid = None
        payload: object = None
        if code in (0, None):  # with no status, the payload alone says whether it finished
            try:
                payload = pickle.loads(b"".join(chunks))
            except Exception:  # a truncated or damaged result: treated as no result
                payload = None
        match payload:
            case ("ok", done) if isinstance(done, self._kind):
                return done
            case ("error", FlortrainError() as error):
                raise error
        how = (
            "sent no result"
            if not code
            else f"was killed by signal {-code}"
            if code < 0
            else f"exited {code}"
        )
        self.fell_back = (
            f"the static pass's child {how}; the static pass ran in this process instead"
        )
        return self._fallback()

    def close(self) -> None:
        """Stop and reap a child whose result is no longer wanted (the run failed before it)."""
        if self._pid is None:
            return
        with contextlib.suppress(OSError):
            os.kill(self._pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            if self._read is not None:
                os.close(self._read)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self._pid, 0)
        self._pid = self._read = None


@dataclass(frozen=True)
class ScriptPass:
    """What record's static pass hands the runtime: the script's instrumentation and, when the
    pass ran in a child, that of the project modules the script imports directly (so that the
    training process need not import libcst for them either)."""

    script: Instrumented
    modules: ModulePasses = field(default_factory=dict)
    #: ``flortrain check``'s findings on the script, which record prints as warnings (None: not run)
    checked: Checked | None = None
    #: ``--deterministic``: what the per-example rewrite changed (what was instrumented and
    #: checked is the rewritten text)
    rewritten: Rewritten | None = None


class StaticPass(Overlapped[ScriptPass]):
    """A script's text and its static pass for record (:func:`start_static_pass`), with ``flortrain check``'s
    findings on it unless ``check`` is off."""

    def __init__(
        self, script: str, text: str, fork: bool, check: bool = True, deterministic: bool = False
    ) -> None:
        self.script, self.text = script, text
        super().__init__(
            lambda: _script_pass(script, text, check, module_passes(script, text), deterministic),
            ScriptPass,
            fork,
            # modules: the import hook's, at import
            fallback=lambda: _script_pass(script, text, check, {}, deterministic),
        )


def _script_pass(
    script: str, text: str, check: bool, modules: ModulePasses, deterministic: bool = False
) -> ScriptPass:
    """The script instrumented and, when ``check``, ``flortrain check`` run on the same parse and
    plan (after the instrumentation, so that a file the pass refuses is refused as it is). With
    ``deterministic``, what is instrumented and checked is the script's per-example rewrite
    (:mod:`flortrain.determinism.rewrite`), so the check reports what the rewrite leaves."""
    # libcst is imported here, in whichever process runs the pass
    from flortrain.instrument import for_record
    from flortrain.static.source import parse

    rewritten = None
    if deterministic:
        from flortrain.determinism.rewrite import determinize

        rewritten = determinize(script, text)
        text = rewritten.text
    source = parse(script, text)
    inst = for_record(source)
    if not check:
        return ScriptPass(inst, modules, None, rewritten)
    from flortrain.check.before_record import check as check_script

    return ScriptPass(inst, modules, check_script(script, text, (source, inst.plan)), rewritten)


def module_passes(
    script: str, text: str, only: Container[str] | None = None
) -> dict[tuple[str, str], ModulePass]:
    """The pass of each project module ``script`` imports directly that may hold a main loop
    (two loops or more; the import hook settles the others without libcst), limited to the files
    in ``only`` when given. Done in the child, so that the import hook finds them ready."""
    from flortrain.instrument import instrument_module

    out: dict[tuple[str, str], ModulePass] = {}
    for name, rel in project_imports(script, text):
        path = os.path.abspath(rel)
        if only is not None and path not in only:
            continue
        try:
            mtext = read_text(path)
            if loop_count(mtext, path) < 2:
                continue
        except Exception:  # the hook reads it again at import, and says what is wrong with it
            continue
        try:
            out[(path, name)] = ModulePass(mtext, instrument_module(path, mtext, name))
        except FlortrainError as e:
            out[(path, name)] = ModulePass(mtext, None, e)
        except Exception:  # it may never be imported: a failure is the hook's to meet, at import
            continue
    return out


def start_static_pass(script: str, check: bool = True, deterministic: bool = False) -> StaticPass:
    """The static pass of ``script`` for record, forked off when that can save wall time
    (:func:`worth_overlapping`), else run at once; with ``flortrain check``'s findings unless
    ``check`` is off. A missing or undecodable script fails here, in one line, before anything
    is forked."""
    text = read_text(script)
    return StaticPass(
        script,
        text,
        worth_overlapping(project_uses_torch(script, text) and torch_available()),
        check,
        deterministic,
    )
