"""Materialization: turning a captured checkpoint into a committed blob in the store.

The training thread only *stages* a checkpoint; a writer process forked once, before the script
runs, hashes and writes it (:mod:`flortrain.runtime.writer`), and the checkpoint is committed
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
import io
import mmap
import os
import pickle
import shutil
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flortrain import channel as link
from flortrain import knobs
from flortrain.channel import Channel
from flortrain.runtime import blobformat, signals, versions
from flortrain.runtime.arena import Warmer, resident_budget
from flortrain.runtime.digest import state_digests
from flortrain.runtime.writer import Objects, run_child
from flortrain.store import content, direct
from flortrain.store.checkpoints import write_durably
from flortrain.store.rows import RecordSink

#: Tensors at least this large are content-addressed objects, and skipped when unchanged: small
#: enough that an LSTM's 0.5 MB gate matrices are tracked (a boundary right after a block's
#: checkpoint then writes nothing again), large enough that the per-file cost stays small.
EXTERNAL_MIN = 1 << 16


@dataclass(frozen=True)
class WriterSpeed:
    """What a checkpoint costs, measured (:func:`writer_speed`): the writer takes ``per_item +
    per_object * objects + per_byte * bytes``; staging takes ``stage_per_byte * bytes`` of the
    training thread into arena pages touched for the first time (mostly page faults), and
    ``warm_stage_per_byte`` into pages already mapped (``runtime/arena.py``)."""

    per_item: float
    per_object: float
    per_byte: float
    stage_per_byte: float = 1e-9
    #: the tensor hash (``store/content.py``) on one thread: what naming a tensor kept from the
    #: loop's entry costs (``kept``)
    hash_per_byte: float = 1e-9
    warm_stage_per_byte: float = 1e-10

    def seconds(self, staged: int, objects: int = 0) -> float:
        return self.per_item + self.per_object * objects + self.per_byte * staged


class Declined(Exception):
    """A checkpoint whose estimated cost the caller would not afford: nothing was staged."""


#: tries of each of :func:`writer_speed`'s copies, the fastest kept (about 1.5 ms a try)
SPEED_TRIES = 6


def writer_speed(blobs: Path) -> WriterSpeed:
    """What a checkpoint will cost, timed before the script starts (10 to 20 ms). It is what the run
    waits for where training leaves the writer no CPU: its backlog is then written after training
    ends, on idle cores. A byte costs its hash (``store/content.py``), spread over the writer's
    threads, and its write, which goes around the page cache (``store.direct``) at the disk's pace
    whatever the threads; so a byte costs the larger of the two. A single-threaded copy into fresh
    pages stands in for the disk (single 2 MB direct writes are too noisy to time). Both are timed
    here on 2 MB, as are staging's copies into fresh and into warm arena pages, and a file's
    creation in a scratch directory beside the store's objects. Not learned from the writer's
    replies: on such a machine they come after training, and where they come sooner the writer ran
    on idle CPU and cost nothing (``adaptive.contention``). Measurements: docs/materializer.md.

    Each figure is the fastest of :data:`SPEED_TRIES` tries: one slow try is the machine, not the
    bytes, and an outlier would price checkpoints too high and halve them."""
    size = 2 << 20
    src = bytes(size)
    stage = warm = hashing = float("inf")
    for _ in range(SPEED_TRIES):
        with mmap.mmap(-1, size) as arena:
            t0 = time.perf_counter()
            arena[:] = src  # fresh pages, as staging beyond the warmed arena meets them
            t1 = time.perf_counter()
            content.name(arena)
            t2 = time.perf_counter()
            arena[:] = src  # pages mapped already
            t3 = time.perf_counter()
        stage, hashing = min(stage, (t1 - t0) / size), min(hashing, (t2 - t1) / size)
        warm = min(warm, (t3 - t2) / size)
    scratch = blobs / f".calibrate-{os.getpid()}"
    objects = Objects(scratch)
    try:
        t0 = time.perf_counter()
        write_durably(scratch, "blob", "calibration", [bytes(4096)])
        t1 = time.perf_counter()
        objects._one((memoryview(os.urandom(64)), False))  # its work, not a lane's thread start
        t2 = time.perf_counter()
        per_item, per_object = t1 - t0, t2 - t1
    except OSError:  # a store we cannot write to fails later, where it is reported
        per_item, per_object = 1e-3, 1e-3
    finally:
        objects.close()
        shutil.rmtree(scratch, ignore_errors=True)
    per_byte = max(hashing / objects.threads, stage)
    return WriterSpeed(per_item, per_object, per_byte, stage, hashing, warm)


_ALIGN = 64

Committed = Callable[[str, dict[str, str]], None]
#: whether a checkpoint is worth its estimated cost: (seconds staging holds training up, seconds
#: the writer will take)
Afford = Callable[[float, float], bool]
Lost = Callable[[str, str], None]


class Materializer(Protocol):
    def submit(
        self, key: str, block_id: str, payload: dict[str, Any], afford: Afford | None = None
    ) -> float:
        """Stage a checkpoint; when this returns, training may change anything the payload refers
        to. The checkpoint is committed later, or reported lost. Returns the seconds the writer
        will take for it (an estimate, :func:`writer_speed`; 0 when it was written here).
        ``afford``: asked with the estimated costs once the changed bytes are known, before
        anything is copied; :class:`Declined` is raised if it says no."""

    def poll(self) -> None:
        """Commit what the writer has finished (cheap: called at every main-loop iteration)."""

    def loop_entered(self, tensors: list[Any]) -> None:
        """The main loop begins with these module tensors (:meth:`ChangeTracker.enter`)."""

    def flush(self) -> None:
        """Wait for everything submitted, commit it, and stop."""

    def hand_off(self) -> tuple[int, list[str]] | None:
        """Stop without waiting: the writer sends what it still holds to the launcher, which
        commits it (``flortrain/process/launcher.py``). The writer's pid and the keys handed over; None
        where that cannot be (no launcher, no writer): :meth:`flush` then."""


@dataclass
class Callbacks:
    committed: Committed
    lost: Lost
    warn: Callable[[str], None]


def serialize(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """A self-contained blob of a payload and the digests of its parts.

    flortrain's own format when the script uses torch (:mod:`flortrain.runtime.blobformat`), else
    ``torch.save`` when the payload needs it, or plain pickle; the leading byte says which."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return blobformat.dumps(payload, torch)
        except blobformat.Unsupported:
            return _torch_save(payload, torch), state_digests(payload)
    return b"P" + blobformat.pickle_dumps(payload), state_digests(payload)


def digests(payload: dict[str, Any]) -> dict[str, str]:
    """The part digests the record stored for an equal payload (``diff`` compares them)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return blobformat.digests(payload, torch)
        except blobformat.Unsupported:
            pass
    return state_digests(payload)


def _torch_save(payload: dict[str, Any], torch: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf, pickle_module=blobformat.PICKLE_MODULE)
    return b"T" + buf.getvalue()


def deserialize(
    data: bytes,
    objects: Callable[[str], bytes | None] | None = None,
    live: Callable[[str, int], bytes | memoryview | None] | None = None,
) -> dict[str, Any]:
    """A payload back from its blob; ``objects`` reads the content-addressed tensors it refers to,
    ``live`` those the store does not have (``blobformat.loads``)."""
    if data[:1] == b"P":
        out: dict[str, Any] = pickle.loads(data[1:])
        return out
    import torch

    if data[:1] == blobformat.MAGIC:
        loaded: dict[str, Any] = blobformat.loads(data, torch, objects, live)
        return loaded
    # torch.save's format: tensors and plain containers load without running pickled code; a
    # payload holding other objects (the rare fallback) needs the full unpickler, and comes only
    # from the user's own store
    try:
        out = torch.load(io.BytesIO(data[1:]), weights_only=True, map_location="cpu")
    except Exception:
        out = torch.load(io.BytesIO(data[1:]), weights_only=False, map_location="cpu")
    return out


class SyncMaterializer:
    """Serialize, write, commit on the training thread: the blob first, the row last."""

    def __init__(self, store: RecordSink, run_id: int, callbacks: Callbacks) -> None:
        self.store = store
        self.run_id = run_id
        self.cb = callbacks

    def submit(
        self, key: str, block_id: str, payload: dict[str, Any], afford: Afford | None = None
    ) -> float:
        """``afford`` is not asked: only serializing would tell the size, and that is the cost."""
        data, dig = serialize(payload)
        self.write(key, data, dig)
        return 0.0

    def write(self, key: str, data: bytes, dig: dict[str, str]) -> None:
        try:
            rel, sha = self.store.write_blob(self.run_id, key, data)
        except OSError as e:
            self.cb.lost(key, f"{e.strerror or e}")
            return
        self.store.commit_checkpoint(self.run_id, key, rel, sha, len(data))
        self.cb.committed(key, dig)

    def poll(self) -> None:
        return None

    def loop_entered(self, tensors: list[Any]) -> None:
        pass  # every checkpoint holds all its bytes

    def flush(self) -> None:
        return None

    def hand_off(self) -> tuple[int, list[str]] | None:
        return None  # everything is committed already


class ChangeTracker:
    """Which large tensors are unchanged since they were last staged: same memory, same shape,
    and the same in-place version counter (``tensor._version``, bumped by every in-place op on
    the tensor or a view of it: ``opt.step()``, ``copy_``, ``load_state_dict``). One table for
    all blocks: a main-loop boundary checkpointed right after a block's end holds the same
    tensors, and stages none of them again. Tensors are kept referenced for the last
    :data:`KEEP` checkpoints, so their memory cannot be freed and handed to a new tensor that would
    look the same (a gradient re-allocated every step)."""

    KEEP = 4

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.seen: dict[
            tuple[Any, ...], tuple[Any, int, int, int]
        ] = {}  # where -> (t, version, token, when)
        self.next_token = 0
        self.checkpoints = 0
        #: module tensors at the main loop's entry: where -> (t, version, its name once hashed)
        self.entry: dict[tuple[Any, ...], tuple[Any, int, str | None]] = {}

    @staticmethod
    def _where(t: Any) -> tuple[Any, ...]:
        return (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            t.device,
        )

    def unchanged(self, t: Any) -> int | None:
        """The token of this tensor's bytes as last staged, if they cannot have changed since."""
        if not self.enabled or versions.untrusted(t):
            return None
        hit = self.seen.get(self._where(t))
        if hit is None:
            return None
        try:
            return hit[2] if t._version == hit[1] else None
        except RuntimeError:  # an inference tensor has no version counter
            return None

    def token(self) -> int:
        self.next_token += 1
        return self.next_token

    def enter(self, tensors: list[Any]) -> None:
        """The main loop begins with these module tensors: one still unchanged at a checkpoint
        is the prologue's, which every replay and resume executes again before it restores
        anything, so the checkpoint names it by the hash of its bytes (:meth:`kept`) instead of
        holding them, and a restore verifies the live tensor against that name. A frozen
        embedding table is then never copied or written, only hashed once. The tensors are
        kept referenced so that their memory cannot pass to a new tensor that would look the
        same."""
        self.entry = {}
        if not self.enabled:
            return
        for t in tensors:
            with contextlib.suppress(RuntimeError):  # an inference tensor has no version counter
                self.entry[self._where(t)] = (t, t._version, None)

    def since_entry(self, t: Any) -> tuple[Any, ...] | None:
        """Where this tensor is, if its bytes cannot have changed since the main loop's entry
        (the key :meth:`kept` and :meth:`unhashed` take); else None."""
        if not self.enabled or versions.untrusted(t):
            return None
        where = self._where(t)
        hit = self.entry.get(where)
        try:
            return where if hit is not None and t._version == hit[1] else None
        except RuntimeError:
            return None

    def kept(self, where: tuple[Any, ...], torch: Any) -> str:
        """The name of the tensor :meth:`since_entry` found there, hashed on first use."""
        ref, version, name = self.entry[where]
        if name is None:
            name = blobformat.tensor_name(ref, torch)
            self.entry[where] = (ref, version, name)
        return name

    def unhashed(self, where: tuple[Any, ...]) -> bool:
        return self.entry[where][2] is None

    def update(self, staged: list[tuple[Any, int]]) -> list[int]:
        """Note the large tensors of a checkpoint just staged (or referred to); returns the tokens
        no longer tracked (the writer forgets them)."""
        if not self.enabled:
            return []
        self.checkpoints += 1
        now = self.checkpoints
        replaced: list[int] = []
        for t, tok in staged:
            try:
                where, version = self._where(t), t._version
            except RuntimeError:
                continue
            old = self.seen.get(where)
            if old is not None and old[2] != tok:
                replaced.append(old[2])
            self.seen[where] = (t, version, tok, now)
        stale = [w for w, v in self.seen.items() if v[3] <= now - self.KEEP]
        return replaced + [self.seen.pop(w)[2] for w in stale]

    def clear(self) -> None:
        self.seen.clear()


@dataclass
class _Flight:
    key: str
    start: int
    end: int
    staged: int  # bytes the writer hashes and writes


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
        self.inflight: deque[_Flight] = deque()
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

    def submit(
        self, key: str, block_id: str, payload: dict[str, Any], afford: Afford | None = None
    ) -> float:
        torch = sys.modules.get("torch")
        if self.ch is None:
            self._start()
        self.poll()
        if torch is None:
            return self._submit_bytes(key, *serialize(payload))
        try:
            st = blobformat.stage(payload, torch)
        except blobformat.Unsupported:
            return self._submit_bytes(key, _torch_save(payload, torch), state_digests(payload))
        places: list[Any] = [None] * len(st.tensors)
        seen: list[tuple[Any, int]] = []
        layout: list[tuple[int, int]] = []  # (tensor, offset within the region) to copy
        kept: list[
            tuple[int, tuple[Any, ...]]
        ] = []  # unchanged since the loop's entry: named, not staged
        n = _up(len(st.parts))
        for g, t in enumerate(st.tensors):
            nbytes = st.metas[g][2]
            external = nbytes >= EXTERNAL_MIN
            if external:
                tok = self.tracker.unchanged(t)
                if tok is not None:
                    places[g] = ("t", tok)
                    seen.append((t, tok))
                    continue
                where = self.tracker.since_entry(t)
                if where is not None:
                    kept.append((g, where))
                    continue
                tok = self.tracker.token()
                seen.append((t, tok))
                n = direct.aligned(n)  # the writer hands its pages to the disk as they are
            else:
                tok = None
            places[g] = ("a", n, external, tok)
            layout.append((g, n))
            n += _up(nbytes)
        n = direct.aligned(n)  # the next region starts aligned too
        if n > self.size:
            if not self._too_big_warned:
                self._too_big_warned = True
                self.cb.warn(
                    f"a checkpoint of {n / 2**20:.0f} MB does not fit the {self.size / 2**20:.0f} MB staging"
                    f" buffer; such checkpoints are written on the training thread (raise {knobs.BUFFER_ENV})"
                )
            return self.sync.submit(key, block_id, payload)
        staged = sum(st.metas[g][2] for g, _ in layout)
        objects = sum(1 for g, _ in layout if places[g][2])
        hashed = sum(st.metas[g][2] for g, where in kept if self.tracker.unhashed(where))
        start = self._fit(n)
        warm = start is not None and self.warmer.covers(start + n)
        per_byte = self.speed.warm_stage_per_byte if warm else self.speed.stage_per_byte
        blocked = per_byte * staged + self.speed.hash_per_byte * hashed
        if afford is not None and not afford(blocked, self.speed.seconds(staged, objects)):
            raise Declined(f"{staged} bytes to stage and write, {hashed} to hash")
        for g, where in kept:
            places[g] = ("k", self.tracker.kept(where, torch))
        start = self._alloc(n)
        if self.ch is None:  # the writer died while we waited: start afresh
            self._start()
            return self.submit(key, block_id, payload, afford)
        self.view[start : start + len(st.parts)] = st.parts
        arena = self._arena_tensor(torch)
        for g, off in layout:
            t = st.tensors[g]
            nbytes = st.metas[g][2]
            if nbytes:
                dst = arena[start + off : start + off + nbytes].view(t.dtype).view(t.shape)
                dst.copy_(t)
            p = places[g]
            places[g] = (p[0], start + p[1], p[2], p[3])
        forget = self.tracker.update(seen)
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
        return self._send(key, item, start, start + n, staged, objects)

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
        self.inflight.append(_Flight(key, start, end, staged))
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


def ring_fit(inflight: deque[_Flight], size: int, n: int) -> int | None:
    """Where a region of ``n`` bytes fits in a ring of ``size`` bytes whose regions the writer
    has not finished are ``inflight``, oldest first, each of at least one byte; None where it
    does not fit before the writer frees some. Free space lies after the newest region's end
    (the tail) and before the oldest one's start (the head). With regions in flight, a tail
    equal to the head is a full ring that has wrapped, not an empty one: a region placed at the
    start that exactly fills the gap up to the head leaves it so, and reading it as empty put
    the next region on top of the oldest, whose bytes the writer had not yet read."""
    if not inflight:
        return 0
    head, tail = inflight[0].start, inflight[-1].end
    if tail > head:  # not wrapped: after the tail, else from the start up to the head
        if tail + n <= size:
            return tail
        if n <= head:
            return 0
    elif tail + n <= head:  # wrapped: between the tail and the head
        return tail
    return None


def _wait_for(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _up(n: int) -> int:
    return n + (-n % _ALIGN)


def make(
    store: RecordSink, run_id: int, callbacks: Callbacks, track_versions: bool = True
) -> Materializer:
    """The materializer ``FLORTRAIN_MATERIALIZER`` names (background by default)."""
    if knobs.materializer() == "sync":
        return SyncMaterializer(store, run_id, callbacks)
    return BackgroundMaterializer(store, run_id, callbacks, track_versions)
