"""Materialization: turning a captured checkpoint into a committed blob in the store.

The training thread only *stages* a checkpoint; a writer process forked once, before the script
runs, hashes and writes it (:mod:`flortrain.checkpoint.writer`), and the checkpoint is committed
(its row written) when the writer reports its bytes durable. Flor's thesis (Chapter 4) forks a
child per batch of staged checkpoints. A fork while the model is alive makes training pay
copy-on-write faults on every page it writes while the child lives (benchmarks/materializers.py,
docs/materializer.md). A writer
forked before the model exists shares none of those pages. Staging copies tensors into a
shared-memory arena the writer reads:

- **What the training thread pays** (the M_i of Eq. 4): capturing the state, pickling its
  skeletons, and one memory copy of each tensor that changed into the arena. A large tensor
  (:data:`EXTERNAL_MIN`) whose in-place version counter says it is unchanged since the block's
  last checkpoint is not copied at all: the writer refers to the object it already wrote (a
  frozen embedding table is written once per run). ``x.data.add_()`` writes do not bump that
  counter; a script that has them gets this skipping turned off (``static/untracked.py``).
- **Bounded memory**: the arena holds at most ``FLORTRAIN_BUFFER_MB``; staging waits for the
  writer when it is full (that wait counts in M_i, so the adaptive period widens), and a single
  checkpoint larger than the arena is written on the training thread instead.
- **Failures**: an item the writer cannot write (disk full) is reported and lost; a writer that
  dies (killed) loses what it held; each loss is a warning on stderr and no checkpoint row. The
  next checkpoint forks a new writer. Training never fails because of either.
- **SIGCHLD** is left alone (DataLoader installs its own handler for its workers): the writer is
  reaped by pid.
- **CUDA** tensors are copied to the host by staging (``copy_`` into the arena) before the writer
  ever sees them; the writer has no CUDA context. Not covered by the CPU-only test suite.

``FLORTRAIN_MATERIALIZER=sync`` serializes and writes on the training thread instead.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

from flortrain import channel as link
from flortrain import knobs, signals
from flortrain.channel import Channel
from flortrain.checkpoint import skeleton
from flortrain.checkpoint.arena import Warmer, resident_budget
from flortrain.checkpoint.blob import serialize, torch_save
from flortrain.checkpoint.digest import state_digests
from flortrain.checkpoint.interface import Callbacks, Materializer, Prepared
from flortrain.checkpoint.speed import writer_speed
from flortrain.checkpoint.staging import (
    EXTERNAL_MIN,
    ChangeTracker,
    Estimate,
    Flight,
    lay_out,
    ring_fit,
)
from flortrain.checkpoint.sync import SyncMaterializer
from flortrain.checkpoint.writer import run_child
from flortrain.store import direct
from flortrain.store.rows import RecordSink


class BackgroundMaterializer:
    """Stage on the training thread, write in the forked writer (see the module docstring)."""

    def __init__(
        self, store: RecordSink, run_id: int, callbacks: Callbacks, track_versions: bool = True
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.cb = callbacks
        self.size = knobs.buffer_bytes()
        self.flush_timeout = knobs.flush_timeout()
        self.delay = knobs.injected("writer-delay")
        self.backlog = knobs.writer_backlog()
        self.tracker = ChangeTracker(track_versions)
        self.sync = SyncMaterializer(store, run_id, callbacks)
        self.inflight: deque[Flight] = deque()
        self.arena = mmap.mmap(-1, max(self.size, mmap.PAGESIZE))  # MAP_SHARED | MAP_ANONYMOUS
        self.view = memoryview(self.arena)
        self._tensor_view: Any = None
        self.pid: int | None = None
        self.ch: Channel | None = None
        self._too_big_warned = False
        self._bye = False
        self._forks = 0
        self.speed = writer_speed(store.blobs)
        #: the arena's first pages, mapped on a thread while the script imports (``arena``)
        self.warmer = Warmer(self.arena, resident_budget(knobs.arena_warm(), self.size))
        self._start()
        self.warmer.start()  # after the fork: the writer maps its own

    # -- the writer process ------------------------------------------------------------------------
    def _start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the writer
            parent_sock.close()
            # a writer forked again mid-run (the first one died) does not compete to warm pages
            warm = 0 if self._forks else self.warmer.nbytes
            run_child(
                child_sock,
                self.view,
                self.store.blobs,
                parent,
                self.delay,
                self.backlog,
                warm,
                link.writer_end,
            )
        self._forks += 1
        child_sock.close()
        self.pid = pid
        self.ch = Channel(parent_sock)

    def _died(self, why: str) -> None:
        """The writer is gone: what it held is lost; the next checkpoint starts a new one."""
        status = self._reap(block=True)
        lost = [f.key for f in self.inflight]
        self.inflight.clear()
        self.tracker.clear()  # the new writer knows none of the old one's objects
        if self.ch is not None:
            with contextlib.suppress(OSError):
                self.ch.sock.close()
        self.ch = None
        self.cb.warn(
            f"checkpoint writer {why}{status}; {len(lost)} checkpoint(s) lost"
            + (f" ({', '.join(lost[:5])}{', ...' if len(lost) > 5 else ''})" if lost else "")
            + "; training goes on"
        )
        for key in lost:
            self.cb.lost(key, f"checkpoint writer {why}")

    def _reap(self, block: bool) -> str:
        if self.pid is None:
            return ""
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.pid = None
            return ""
        if pid == 0:
            return ""
        self.pid = None
        if os.WIFSIGNALED(status):
            return f" (killed by signal {os.WTERMSIG(status)})"
        return f" (exit {os.WEXITSTATUS(status)})" if os.WEXITSTATUS(status) else ""

    # -- results -----------------------------------------------------------------------------------
    def _take(self, timeout: float | None) -> bool:
        """Handle one message from the writer; False if none came within ``timeout``."""
        assert self.ch is not None
        try:
            if timeout == 0:
                msg = self.ch.recv(0)
            else:  # a wait: a Ctrl-C cuts it short (``signals.waiting``)
                with signals.waiting():
                    msg = self.ch.recv(timeout)
        except EOFError:
            self._died("died")
            return True
        if msg is None:
            return False
        if msg[0] == "bye":
            self._bye = True
            return True
        f = self.inflight.popleft()
        assert f.key == msg[1], (f.key, msg[1])
        if msg[0] == "done":
            _, key, rel, sha, nbytes, dig = msg
            self.store.commit_checkpoint(self.run_id, key, rel, sha, nbytes)
            self.cb.committed(key, dig)
        else:
            self.tracker.clear()  # its objects may be among those not written
            self.cb.warn(f"checkpoint {msg[1]} not written: {msg[2]}; training goes on")
            self.cb.lost(msg[1], msg[2])
        return True

    def poll(self) -> None:
        while self.ch is not None and self.inflight and self._take(0):
            pass

    def loop_entered(self, tensors: list[Any]) -> None:
        self.warmer.stop()  # training begins: no more competing with it
        self.tracker.enter([t for t in tensors if t.nbytes >= EXTERNAL_MIN])

    # -- staging -----------------------------------------------------------------------------------
    def _fit(self, n: int) -> int | None:
        """Where a region of ``n`` bytes fits in the arena now; None: not before the writer
        frees space."""
        return ring_fit(self.inflight, self.size, n)

    def _alloc(self, n: int) -> int:
        """A region of ``n`` bytes in the arena, waiting for the writer to free space."""
        while (start := self._fit(n)) is None:
            if self.ch is None:
                return 0
            self._take(None)
        return start

    def submit(self, key: str, block_id: str, payload: dict[str, Any]) -> float:
        return self.stage(self.prepare(key, block_id, payload))

    def prepare(self, key: str, block_id: str, payload: dict[str, Any]) -> Prepared:
        """Lay the checkpoint out in the arena without copying anything: which tensors are
        unchanged since staged or since the loop's entry, how many bytes staging copies and
        hashes, and what that and the writer will cost (:class:`Estimate`)."""
        torch = sys.modules.get("torch")
        if self.ch is None:
            self._start()
        self.poll()
        if torch is None:
            return Prepared(key, block_id, payload)
        try:
            st = skeleton.stage(payload, torch)
        except skeleton.Unsupported:
            return Prepared(key, block_id, payload, fallback=True)
        lay = lay_out(self.tracker, st)
        if lay.n > self.size:
            return Prepared(key, block_id, payload, layout=lay)
        staged = sum(st.metas[g][2] for g, _ in lay.copies)
        objects = sum(1 for g, _ in lay.copies if lay.places[g][2])
        hashed = sum(st.metas[g][2] for g, where in lay.kept if self.tracker.unhashed(where))
        start = self._fit(lay.n)
        warm = start is not None and self.warmer.covers(start + lay.n)
        per_byte = self.speed.warm_stage_per_byte if warm else self.speed.stage_per_byte
        blocked = per_byte * staged + self.speed.hash_per_byte * hashed
        writer = self.speed.seconds(staged, objects)
        estimate = Estimate(staged, hashed, blocked, writer)
        return Prepared(key, block_id, payload, estimate, layout=lay)

    def stage(self, prepared: Prepared) -> float:
        key, block_id, payload, lay = (
            prepared.key,
            prepared.block_id,
            prepared.payload,
            prepared.layout,
        )
        torch = sys.modules.get("torch")
        if lay is None or torch is None:
            if prepared.fallback and torch is not None:
                return self._submit_bytes(key, torch_save(payload, torch), state_digests(payload))
            return self._submit_bytes(key, *serialize(payload))
        if lay.n > self.size:
            if not self._too_big_warned:
                self._too_big_warned = True
                self.cb.warn(
                    f"a checkpoint of {lay.n / 2**20:.0f} MB does not fit the {self.size / 2**20:.0f} MB staging"
                    f" buffer; such checkpoints are written on the training thread (raise {knobs.BUFFER_ENV})"
                )
            return self.sync.submit(key, block_id, payload)
        st, places = lay.st, lay.places
        for g, where in lay.kept:
            places[g] = ("k", self.tracker.kept(where, torch))
        start = self._alloc(lay.n)
        if self.ch is None:  # the writer died while we waited: start afresh, laid out anew
            self._start()
            return self.submit(key, block_id, payload)
        self.view[start : start + len(st.parts)] = st.parts
        arena = self._arena_tensor(torch)
        for g, off in lay.copies:
            t = st.tensors[g]
            nbytes = st.metas[g][2]
            if nbytes:
                dst = arena[start + off : start + off + nbytes].view(t.dtype).view(t.shape)
                dst.copy_(t)
            p = places[g]
            places[g] = (p[0], start + p[1], p[2], p[3])
        forget = self.tracker.update(lay.seen)
        item = {
            "key": key,
            "kind": "blob",
            "rel": self.store.blob_rel(self.run_id, key),
            "parts": (start, len(st.parts)),
            "metas": st.metas,
            "skeletons": st.skeletons,
            "places": places,
            "forget": forget,
        }
        staged = prepared.estimate.staged if prepared.estimate is not None else 0
        objects = sum(1 for g, _ in lay.copies if places[g][2])
        return self._send(key, item, start, start + lay.n, staged, objects)

    def _submit_bytes(self, key: str, data: bytes, dig: dict[str, str]) -> float:
        n = direct.aligned(len(data))
        if n > self.size:
            self.sync.write(key, data, dig)
            return 0.0
        start = self._alloc(n)
        if self.ch is None:
            self.sync.write(key, data, dig)
            return 0.0
        self.view[start : start + len(data)] = data
        item = {
            "key": key,
            "kind": "bytes",
            "rel": self.store.blob_rel(self.run_id, key),
            "region": (start, len(data)),
            "digests": dig,
        }
        return self._send(key, item, start, start + n, len(data))

    def _send(
        self, key: str, item: dict[str, Any], start: int, end: int, staged: int, objects: int = 0
    ) -> float:
        """Hand an item to the writer; the seconds it will take there (:func:`writer_speed`)."""
        assert self.ch is not None
        self.inflight.append(Flight(key, start, end, staged))
        item["staged"] = staged  # the writer's pace follows its backlog in bytes
        try:
            self.ch.send(("item", item))
        except OSError:
            self._died("died")
            return 0.0
        return self.speed.seconds(staged, objects)

    def _arena_tensor(self, torch: Any) -> Any:
        if self._tensor_view is None:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._tensor_view = torch.frombuffer(self.arena, dtype=torch.uint8)
        return self._tensor_view

    # -- the end -----------------------------------------------------------------------------------
    def hand_off(self) -> tuple[int, list[str]] | None:
        """Tell the writer to send the launcher its results for what it still holds, and leave
        it: this process unmaps the arena and goes on to exit while the writer drains. Results
        the writer sent here and this process did not read are among those keys: the writer sends
        them again (``writer.Desk``)."""
        if link.to_launcher is None or self.ch is None or self.pid is None:
            return None
        self.warmer.stop()
        self.poll()
        if self.ch is None:  # it died: what it held is reported lost; flush reaps it
            return None
        keys = [f.key for f in self.inflight]
        try:
            self.ch.send(("handoff", keys))
        except OSError:
            self._died("died")
            return None
        self._unmap()
        self.ch.sock.close()
        self.ch = None
        self.inflight.clear()
        pid, self.pid = self.pid, None
        return pid, keys

    def flush(self) -> None:
        """Wait for the writer to finish (``FLORTRAIN_FLUSH_TIMEOUT``), commit, and stop it."""
        self.warmer.stop()  # a script with no main loop ends here: stop warming what nobody stages
        if self.ch is None:
            self._reap(block=True)
            return
        pending = len(self.inflight)
        t0 = time.monotonic()
        told = False
        try:
            self.ch.send(("stop",))
        except OSError:
            self._died("died")
            return
        while self.ch is not None:
            waited = time.monotonic() - t0
            if waited > self.flush_timeout:
                if self.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, 9)
                self._died(
                    f"did not finish within {self.flush_timeout:.0f}s ({knobs.FLUSH_TIMEOUT_ENV})"
                )
                return
            if not told and waited > 2 and self.inflight:
                told = True
                self.cb.warn(
                    f"waiting for {len(self.inflight)} of {pending} checkpoint(s) to be written"
                )
            try:
                self._take(1.0)
            except KeyboardInterrupt:  # Ctrl-C: the run is finished without what is not written
                if self.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, 9)
                self._died("stopped by Ctrl-C")
                return
            if self._bye:
                break  # everything before "bye" was handled
        if self.ch is not None:
            if self._bye:
                self._unmap()  # while the writer lingers (``writer.linger``): its exit frees the pages
            self.ch.sock.close()
            self.ch = None
        if self._bye:
            self._reap_in_background()
        else:
            self._reap(block=True)

    def _unmap(self) -> None:
        """Unmap the arena from this process now that nothing will be staged: the writer still
        maps it, so this only drops page-table entries, and the pages are freed when the writer
        exits, in the background. Left mapped, the training process's own exit would free them,
        several times slower. Anything still holding a view of the arena (a warmer thread
        inside ``madvise``) leaves it mapped.

        On the training thread, not a thread of its own: ``munmap`` releases the GIL, but it
        holds the address space's lock, so the next ``mmap`` or ``munmap`` of the exit path
        (SQLite's close unmapping its shared index, the heap's teardown) would wait for it
        instead, and the time to exit would not fall."""
        self.warmer.join(1.0)  # stopped when the flush began
        self._tensor_view = None
        with contextlib.suppress(BufferError, ValueError):
            self.view.release()
            self.arena.close()

    def _reap_in_background(self) -> None:
        """Reap a writer that said goodbye without waiting for it to exit. Everything it wrote
        is committed by then, and what is left of it is the kernel tearing down its address
        space, a copy of the training process's page tables: time the run would spend waiting
        at exit for nothing. A daemon thread waits for that pid alone (never ``-1``: the
        script's own children are not ours to reap); if the interpreter exits first, init reaps
        it."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        threading.Thread(target=_wait_for, args=(pid,), name="flortrain-reap", daemon=True).start()


def _wait_for(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def make(
    store: RecordSink, run_id: int, callbacks: Callbacks, track_versions: bool = True
) -> Materializer:
    """The materializer ``FLORTRAIN_MATERIALIZER`` names (background by default)."""
    if knobs.materializer() == "sync":
        return SyncMaterializer(store, run_id, callbacks)
    return BackgroundMaterializer(store, run_id, callbacks, track_versions)
