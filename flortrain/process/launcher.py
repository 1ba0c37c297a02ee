"""The launcher: ``flortrain record`` forks the training process first thing and waits for it, so
that the checkpoint writer's last work overlaps the training process's exit instead of preceding it.

Why: a plain run of a torch script spends a noticeable time between its loop's last line and its
exit, most of it CPython's collector tearing down the heap on one thread while the other cores idle
(docs/benchmarks.md). Were the training process to commit what the writer wrote, the record would
wait for the writer's backlog *before* that teardown. Instead the training process hands what is
still in flight over (:meth:`~flortrain.runtime.session.Session.flush`) and goes on to exit at once;
the writer drains on the idle core meanwhile and sends its results here; this process commits them
to the store as soon as the writer is done (during the training process's teardown, where it can),
prints the record's last line once the training process has exited, and exits with its status. It
holds the store open from the run's start (:meth:`Launcher._open`), so that the training process's
close is not the last one, which copies SQLite's write-ahead log back.

This process:

- is forked before anything heavy is imported (the CLI, click) and never imports torch. It opens
  the store only to commit what was handed to it, in a process that never inherited an SQLite
  connection (SQLite forbids using one across a fork);
- forwards a signal another process sent it (``kill``, ``timeout``, a test's ``send_signal``) to
  the training process. One the terminal sends its foreground process group (Ctrl-C) reaches
  the training process directly and is not sent again: its ``si_code`` says so. Python would
  otherwise see a second SIGINT while it unwinds from the first. One ``kill(2)`` sent the whole
  group cannot be told from one sent to this process alone, so it is forwarded, and the training
  process takes the two for one (:mod:`flortrain.process.stopping`);
- ends with the training process's status: its exit code, or the signal that killed it, raised
  again on itself. A training process killed before it finished (the OOM killer, ``kill -9``)
  gets a line saying which run it leaves incomplete and how to resume it;
- killed itself with SIGKILL, takes the training process with it (``PR_SET_PDEATHSIG``), so that
  killing ``flortrain record`` kills the training. The writer is not the launcher's child: it
  outlives the training process only when it was handed work.

``FLORTRAIN_LAUNCHER=off`` runs the script in the CLI's own process, which then waits for the
writer before its exit."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flortrain import channel as link
from flortrain import knobs
from flortrain.channel import Channel

#: Whether this process may become a launcher: only the ``flortrain`` command's own process
#: (``cli.main``), never one that calls the CLI in-process (click's test runner, a notebook).
allowed = False

_FORWARDED = {
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
}
#: SIGIO: the training process sent something (``O_ASYNC`` on the launcher's end of its socket).
#: Read as it comes, so that a long message never fills the socket while the launcher waits.
_WAITED = {*_FORWARDED, signal.SIGCHLD, signal.SIGIO}
#: ``si_code`` of a signal sent by ``kill(2)`` (SI_USER), ``sigqueue(3)`` (SI_QUEUE) or
#: ``tgkill(2)`` (SI_TKILL); a terminal's are SI_KERNEL
_SENT = frozenset({0, -1, -6})
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Summary:
    """The record's last line on stderr, printed by whichever process commits last."""

    run_id: int
    outcome: str
    elapsed: float
    checkpointed: int
    instances: int
    held: float
    exit_wait: float
    #: why flortrain stopped the script (:mod:`flortrain.process.distributed`): the last line
    refusal: str | None = None

    def line(self, more: int = 0, after: float = 0.0) -> str:
        """``more``: checkpoints the launcher committed; ``after``: seconds it waited for the
        writer once the training process had exited (wall-clock time the run took that held
        does not count: training was over)."""
        # a share of a run shorter than a second says nothing (0.01 s of a 0.01 s script is "100%")
        share = (
            f" ({self.held / (self.elapsed - self.held):.1%})"
            if self.elapsed - self.held >= 1.0
            else ""
        )
        # where training kept every core busy, most of held is this wait: saying so points the user
        # at the writer's backlog, not at staging (docs/materializer.md, "The writer's pace")
        wait = (
            f", {self.exit_wait:.2f}s of it at exit for the checkpoint writer"
            if self.exit_wait >= 0.01
            else ""
        )
        late = (
            f"; then {after:.2f}s for the checkpoint writer after training exited"
            if after >= 0.01
            else ""
        )
        return (
            f"flortrain: record run {self.run_id} {self.outcome} in {self.elapsed:.2f}s:"
            f" {self.checkpointed + more} of {self.instances} block instances checkpointed;"
            f" flortrain held training up {self.held:.2f}s{share}{wait}{late}"
        ) + (f"\n{self.refusal}" if self.refusal is not None else "")


def tell(*msg: Any) -> None:
    """Send the launcher a message (nothing without one): ``("run", id, script, store root)``
    once the run exists, ``("finished",)`` once its last line is printed, or ``("handoff", spec)``."""
    if link.to_launcher is not None:
        with contextlib.suppress(OSError):
            link.to_launcher.send(msg)


def launch() -> None:
    """Fork the training process, which returns from here. This process waits for it and never
    returns. Outside the ``flortrain`` command's own process (:data:`allowed`), without
    ``os.fork``/``os.pidfd_open``, or with ``FLORTRAIN_LAUNCHER=off``, it returns at once and the
    script runs here."""
    if (
        not allowed
        or knobs.launcher() == "off"
        or not hasattr(os, "fork")
        or not hasattr(os, "pidfd_open")
    ):
        return
    to_training, training_end = socket.socketpair()
    from_writer, writer_sock = socket.socketpair()
    # an ignored SIGCHLD or SIGIO is discarded even while blocked, and an ignored SIGCHLD reaps
    # children unasked: the launcher needs both, the script gets the dispositions it was given
    inherited = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGCHLD, signal.SIGIO)}
    # blocked before the fork, so that none is lost before the launcher waits for them
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _restore(inherited)
        for s in (to_training, training_end, from_writer, writer_sock):
            s.close()
        return
    if pid == 0:
        to_training.close()
        from_writer.close()
        _die_with(parent)
        _restore(inherited)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        link.to_launcher, link.writer_end = Channel(training_end), writer_sock
        return
    training_end.close()
    writer_sock.close()
    with contextlib.suppress(OSError, AttributeError):  # without it, messages are read at the end
        fcntl.fcntl(to_training.fileno(), fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(
            to_training.fileno(),
            fcntl.F_SETFL,
            fcntl.fcntl(to_training.fileno(), fcntl.F_GETFL) | os.O_ASYNC,
        )
    launcher = Launcher(pid, Channel(to_training), Channel(from_writer))
    try:
        status = launcher.run()
    except BaseException as e:  # a bug here must not take training down with it (PDEATHSIG)
        _warn(f"the launcher failed ({type(e).__name__}: {e}); waiting for the training process")
        status = launcher.status if launcher.status is not None else os.waitpid(pid, 0)[1]
    _exit_as(status)


def _restore(dispositions: dict[signal.Signals, Any]) -> None:
    for sig, handler in dispositions.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when the launcher dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request was in place
        os._exit(1)


class Launcher:
    """The waiting side of :func:`launch`."""

    def __init__(self, pid: int, training: Channel, writer: Channel) -> None:
        self.pid = pid
        self.training = training
        self.writer = writer
        self.run_id: int | None = None
        self.script = ""
        self.finished = False
        self.spec: dict[str, Any] | None = None
        self.status: int | None = None  # the training process's wait status, once it has ended
        #: the store, opened when the run began (see :meth:`_open`); None once closed
        self.store: Any = None
        #: when the training process was seen to have exited (``time.monotonic()``)
        self.exited: float | None = None
        #: the record's last line, once what was handed over is committed
        self.last_line: str | None = None

    def run(self) -> int:
        """Wait for the training process, commit what it handed over; its wait status."""
        if knobs.injected("launcher-fail"):  # fault injection: a bug in the launcher
            raise RuntimeError("injected")
        try:
            status = self.status = self._wait()
            if self.exited is None:
                self.exited = time.monotonic()
            self._read_training()
            self._settle()
        finally:
            self._close()
        if self.last_line is not None:
            print(self.last_line, file=sys.stderr, flush=True)
        elif os.WIFSIGNALED(status) and not self.finished and self.run_id is not None:
            sig = os.WTERMSIG(status)
            _warn(
                f"the training process was killed by signal {sig} ({signal.Signals(sig).name}); record run"
                f" {self.run_id} is incomplete: `flortrain record --resume {self.run_id} {self.script}`"
                " continues it from its last committed main-loop boundary"
            )
        return status

    def _wait(self) -> int:
        while True:
            info = signal.sigwaitinfo(_WAITED)
            if info.si_signo == signal.SIGIO:
                self._read_training()
                self._settle()
            elif info.si_signo == signal.SIGCHLD:
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    return status
            elif info.si_code in _SENT and info.si_pid != self.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, info.si_signo)

    def _read_training(self) -> None:
        """What the training process sent so far (all of it, once it has exited)."""
        with contextlib.suppress(EOFError):
            while (msg := self.training.recv(0)) is not None:
                if msg[0] == "run":
                    self.run_id, self.script = msg[1], msg[2]
                    self._open(msg[3])
                elif msg[0] == "finished":
                    self.finished = True
                    self._close()
                elif msg[0] == "handoff":
                    self.spec = msg[1]

    def _open(self, root: str) -> None:
        """Open the store as the run begins, and hold it open until the training process has
        closed its own. SQLite's last connection to close copies the write-ahead log into the
        database and syncs it: in the training process, that would fall between the script's end
        and its exit, where nothing else overlaps it. Held here, that falls to this process, which
        closes the store (:meth:`_close`) while the training process's interpreter tears down its
        heap on the other core. A store that will not open here is opened again to commit
        (:meth:`_commit`); nothing depends on this one."""
        from flortrain.store.db import Store

        try:
            self.store = Store(Path(root), trust=True)  # the training process verified it
        except Exception:
            self.store = None

    def _close(self) -> None:
        if self.store is not None:
            store, self.store = self.store, None
            with contextlib.suppress(Exception):
                store.close()

    def _settle(self) -> None:
        """Commit what the training process handed over, once it has (the training process has
        closed its store by then): while it exits, or once it has."""
        if self.spec is None or self.last_line is not None:
            return
        replies = self._collect(self.spec)
        after = 0.0 if self.exited is None else time.monotonic() - self.exited
        self.last_line = self._commit(self.spec, replies, after)
        self._close()

    def _collect(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The writer's results for the keys handed over, until it says it is done, dies, or
        ``FLORTRAIN_FLUSH_TIMEOUT`` passes (it is then killed)."""
        replies: dict[str, Any] = {}
        try:
            pidfd: int | None = os.pidfd_open(spec["writer"])
        except OSError:  # gone already: what it sent is all there is
            pidfd = None
        training: int | None = None
        if self.exited is None:
            with contextlib.suppress(OSError):
                training = os.pidfd_open(self.pid)
        timeout = knobs.flush_timeout()
        t0 = time.monotonic()
        told = writer_gone = False
        try:
            # until it says it is done, or has exited and what it sent is read
            while not self._drain(replies) and pidfd is not None and not writer_gone:
                waited = time.monotonic() - t0
                if waited > timeout:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    _warn(
                        f"checkpoint writer did not finish within {timeout:.0f}s ({knobs.FLUSH_TIMEOUT_ENV}); killed"
                    )
                    break
                if not told and waited > 2:
                    told = True
                    _warn(
                        f"waiting for {len(spec['inflight']) - len(replies)} checkpoint(s) to be written"
                    )
                fds = [self.writer.sock.fileno(), pidfd] + (
                    [training] if training is not None else []
                )
                ready, _, _ = select.select(fds, [], [], min(1.0, timeout - waited))
                if training is not None and training in ready:  # "after" counts from here
                    self.exited = time.monotonic()
                    ready.remove(training)
                    os.close(training)
                    training = None
                writer_gone = ready == [pidfd]
        finally:
            for fd in (pidfd, training):
                if fd is not None:
                    os.close(fd)
        return replies

    def _drain(self, replies: dict[str, Any]) -> bool:
        """Take the writer's results sent so far into ``replies``; whether it can send no more
        (it said ``written``, or its end is closed)."""
        try:
            while (msg := self.writer.recv(0)) is not None:
                if msg[0] == "written":
                    return True
                replies[msg[1]] = msg[2]
        except EOFError:
            return True
        return False

    def _commit(self, spec: dict[str, Any], replies: dict[str, Any], after: float) -> str:
        """Commit each checkpoint the writer wrote, as the training process would have
        (``BackgroundMaterializer._take``); say which were lost; the record's last line."""
        from flortrain.store.db import Store
        from flortrain.store.records import BlockState

        run_id: int = spec["run_id"]
        pending: dict[str, str] = spec["pending"]
        more = 0
        try:
            store = self.store if self.store is not None else Store(Path(spec["root"]), trust=True)
            self.store = store
            store.hold_claims()
            for key in spec["inflight"]:
                reply, state = replies.get(key), pending.get(key)
                if reply is not None and reply[0] == "done":
                    _, _, rel, sha, nbytes, digests = reply
                    store.commit_checkpoint(run_id, key, rel, sha, nbytes)
                    if state is not None:
                        store.mark_checkpointed(run_id, key, digests)
                        more += state != BlockState.BOUNDARY
                    continue
                reason = (
                    reply[2]
                    if reply is not None
                    else "the checkpoint writer ended before writing it"
                )
                _warn(f"checkpoint {key} not written: {reason}")
                if state is not None:
                    store.note_block(run_id, key, f"checkpoint lost: {reason}")
            self.store = None
            store.close()
        except Exception as e:  # a store that fails now loses these checkpoints, never the run
            more = 0
            _warn(
                f"the checkpoints written after training ended could not be committed: {type(e).__name__}: {e}"
            )
        summary: Summary = spec["summary"]
        return summary.line(more, after)


def _warn(msg: str) -> None:
    print(f"flortrain: {msg}", file=sys.stderr, flush=True)


def _exit_as(status: int) -> None:
    """End this process as the training process ended: with its exit code, or killed by the same
    signal (a shell then reports it, and Python's own SIGINT exit is kept)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))
