"""Where parallel-replay workers run: local processes, or tasks on a Ray cluster.

Either way a worker is ``python -m flortrain.replay.worker`` in a fresh process, given a pickled
task and returning a pickled result (:mod:`flortrain.replay.worker`). A backend only decides
where that process starts and how its result and stderr come back:

- :class:`LocalBackend` starts them on this machine, each in its own session (so a cancelled
  worker's DataLoader processes go with it);
- :class:`RayBackend` submits one Ray task per segment; the task starts the worker process on
  its node and returns the result and stderr as bytes through Ray's object store. The node must
  have flortrain, the script's project and its data at the same paths (a shared filesystem, or
  Ray's ``runtime_env``), and must reach the blob store through the URL the task names.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flortrain.errors import FlortrainError
from flortrain.replay.worker import WorkerResult, WorkerTask


@dataclass
class Outcome:
    """A finished worker: its result (None when it died before writing one) and its stderr."""

    index: int
    status: int
    result: WorkerResult | None
    stderr: str


class Backend(Protocol):
    def submit(self, task: WorkerTask) -> None: ...

    def wait(self, timeout: float) -> list[Outcome]:
        """The workers that finished since the last call (none after ``timeout`` seconds)."""
        ...

    def cancel(self) -> None:
        """Stop every worker still running."""
        ...


def _command(task_path: str, result_path: str) -> list[str]:
    return [sys.executable, "-m", "flortrain.replay.worker", task_path, result_path]


def _warm_command(uses_torch: bool) -> list[str]:
    """A worker that imports what it will need, then waits on stdin for its task (see
    :class:`LocalBackend`)."""
    return [
        sys.executable,
        "-m",
        "flortrain.replay.worker",
        "--wait",
        "torch" if uses_torch else "plain",
    ]


def _env() -> dict[str, str]:
    """The worker's environment. Each worker keeps the record's intra-op thread count (float
    reductions depend on it), so workers sharing a machine oversubscribe its cores, and OpenMP's
    default of spinning while it waits for work then makes them fight: measured here, two
    2-thread trainings side by side took 57 s against 9 s for one. Passive waiting (threads
    sleep) changes scheduling, never results: the same pair took 15 s."""
    return {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


def _outcome(index: int, status: int, data: bytes | None, stderr: str) -> Outcome:
    """A finished worker process's outcome, from its exit status, result pickle (None when it
    wrote none) and stderr, the same wherever it ran."""
    result: WorkerResult | None = (
        pickle.loads(data) if data is not None else None
    )  # our own worker's
    if status < 0:
        stderr += f"flortrain: worker {index + 1} was killed by signal {-status}\n"
    elif result is None and status == 0:
        status = 1
        stderr += f"flortrain: worker {index + 1} ended without a result\n"
    return Outcome(index, status, result, stderr)


class LocalBackend:
    """Workers as processes on this machine.

    ``warm`` workers are started at once, before the driver has planned: each imports the
    interpreter's share of a worker (flortrain's runtime, and torch when the script uses it) and
    then waits on its stdin for a task. Planning (parsing and analysing the script) takes the
    driver about a second, and importing torch takes a worker longer than that: started together,
    they overlap, instead of every worker's start-up following the plan. A warm worker that is
    never given a task sees its stdin close and exits; :meth:`close` kills any still waiting.
    The process is as fresh as a cold one: it has run no script code when its task arrives."""

    def __init__(self, warm: int = 0, uses_torch: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="flortrain-replay-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.errs: dict[int, Path] = {}
        self.idle: list[tuple[subprocess.Popen[bytes], Path]] = []
        for k in range(warm):
            err_path = self.dir / f"warm{k}.err"
            with open(err_path, "wb") as err:
                proc = subprocess.Popen(
                    _warm_command(uses_torch),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=_env(),
                    start_new_session=True,
                )
            self.idle.append((proc, err_path))

    def _paths(self, index: int) -> tuple[Path, Path]:
        return self.dir / f"task{index}", self.dir / f"result{index}"

    def submit(self, task: WorkerTask) -> None:
        task_path, result_path = self._paths(task.index)
        task_path.write_bytes(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))
        while self.idle:
            proc, err_path = self.idle.pop(0)
            assert proc.stdin is not None
            try:
                proc.stdin.write(f"{task_path}\0{result_path}\n".encode())
                proc.stdin.close()
            except OSError:  # it died waiting (its stderr says why): start another
                proc.wait()
                continue
            self.procs[task.index], self.errs[task.index] = proc, err_path
            return
        err_path = self.dir / f"stderr{task.index}"
        with open(err_path, "wb") as err:
            self.procs[task.index] = subprocess.Popen(
                _command(str(task_path), str(result_path)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=task.cwd,
                env=_env(),
                start_new_session=True,
            )
        self.errs[task.index] = err_path

    def wait(self, timeout: float) -> list[Outcome]:
        deadline = time.monotonic() + timeout
        while True:
            done = [(i, p.returncode) for i, p in self.procs.items() if p.poll() is not None]
            if done or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        out = []
        for i, code in done:
            del self.procs[i]
            _, result_path = self._paths(i)
            data = result_path.read_bytes() if result_path.exists() else None
            out.append(_outcome(i, code, data, self.errs[i].read_text(errors="replace")))
        return out

    def cancel(self) -> None:
        procs = [*self.procs.values(), *(p for p, _ in self.idle)]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()
            p.wait()
        self.procs.clear()
        self.idle.clear()

    def close(self) -> None:
        """Kill what still runs and remove the task files; closing twice is harmless."""
        self.cancel()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_segment(task_bytes: bytes, cwd: str) -> tuple[int, bytes | None, str]:
    """A Ray task: the worker process on this node; (exit status, result pickle, stderr)."""
    with tempfile.TemporaryDirectory(prefix="flortrain-worker-") as d:
        task_path, result_path = os.path.join(d, "task"), os.path.join(d, "result")
        with open(task_path, "wb") as f:
            f.write(task_bytes)
        p = subprocess.run(
            _command(task_path, result_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=_env(),
            check=False,
        )
        data = Path(result_path).read_bytes() if os.path.exists(result_path) else None
        return p.returncode, data, p.stderr.decode(errors="replace")


class RayBackend:
    """Workers as Ray tasks: on the cluster ``RAY_ADDRESS`` names, the one this process is
    already connected to, or else a local one started for this replay."""

    def __init__(self) -> None:
        try:
            import ray
        except ImportError:
            raise FlortrainError(
                "--backend ray needs Ray: pip install 'flortrain[ray]'", code="FT041"
            ) from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            ray.init(
                address=os.environ.get("RAY_ADDRESS") or None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            self.started = True
        self.remote = ray.remote(num_cpus=1, max_retries=0)(run_segment)
        self.refs: dict[Any, int] = {}

    def submit(self, task: WorkerTask) -> None:
        ref = self.remote.remote(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL), task.cwd)
        self.refs[ref] = task.index

    def wait(self, timeout: float) -> list[Outcome]:
        if not self.refs:
            return []
        ready, _ = self.ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        out = []
        for ref in ready:
            index = self.refs.pop(ref)
            try:
                status, data, stderr = self.ray.get(ref)
            except Exception as e:  # the task itself failed (its node died): the replay fails
                out.append(
                    Outcome(
                        index, 1, None, f"flortrain: Ray task of worker {index + 1} failed: {e}\n"
                    )
                )
                continue
            out.append(_outcome(index, status, data, stderr))
        return out

    def cancel(self) -> None:
        for ref in self.refs:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
        self.refs.clear()

    def close(self) -> None:
        self.cancel()
        if self.started:
            self.ray.shutdown()


def make(name: str, warm: LocalBackend | None = None) -> LocalBackend | RayBackend:
    """The backend named; for ``local``, the pool already started (``warm``) when there is one."""
    if name == "ray":
        return RayBackend()
    return warm if warm is not None else LocalBackend()


__all__ = ["Backend", "LocalBackend", "Outcome", "RayBackend", "make", "run_segment"]
