"""The materializer's writer: a process forked once, before the script runs, that hashes and
writes the checkpoints the training thread staged (Flor thesis, Chapter 4).

It reads staged bytes from the shared arena (an anonymous shared mapping the parent created
before forking it) and messages from a socket; it never imports torch and never touches the
store's SQLite connection: the parent commits a checkpoint only when the writer reports its bytes
durable, with their hashes. Its pace is set by its backlog (:class:`Pace`): while it holds
little, it hashes and writes on CPU time training leaves idle; once it holds more than
``FLORTRAIN_WRITER_BACKLOG_MB``, it competes for the CPU at a low priority until it has written
all it holds, so that the staging buffer drains and its pages are reused warm. One item at a time,
in order:

- every staged tensor is named by the hash of its bytes (XXH3-128,
  :mod:`flortrain.store.content`); a large one is written as a content-addressed object
  (``objects/ab/<name>``) unless that object exists already, bypassing the page cache where
  the filesystem allows (:mod:`flortrain.store.direct`), and remembered by the token the parent
  gave it, so a later checkpoint holding the same unchanged tensor refers to it by token and
  nothing is copied or written again. The objects of an item are hashed and written on a few
  threads (:class:`Objects`): where training leaves the writer no CPU, everything it holds is
  written after training ends, on cores that are then idle, and that wait is the run's;
- the blob (header, small tensors inline) is written through a temporary file with a streaming
  hash and renamed into place;
- the reply carries the blob's sha256 and each part's digest, or why the item was lost.

An item that fails (disk full, a token whose data was lost) is reported and skipped; the writer
goes on with the next.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from flortrain import knobs
from flortrain.channel import Channel
from flortrain.checkpoint import codec
from flortrain.checkpoint.arena import MADV_POPULATE_READ, populate_chunks
from flortrain.checkpoint.pace import IDLE_LOOK, NICE, IdleCores, Pace, may_start_idle
from flortrain.store import content, direct
from flortrain.store.blobs import object_rel
from flortrain.store.checkpoints import object_path, write_durably


def _idle_thread() -> None:
    """Make the calling thread run only on CPU time no normal thread wants (Linux: SCHED_IDLE;
    elsewhere, or where refused, it keeps the writer's low priority). Per thread, and one way:
    an unprivileged thread cannot leave SCHED_IDLE again, so the busy lane is other threads."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


#: The lanes of object threads (:class:`Objects`): while the pace is idle, while it is busy, and
#: once training has ended.
IDLE, BUSY, DRAIN = "idle", "busy", "drain"


class Objects:
    """Content-addressed objects hashed and written on a few threads. ``write`` releases the
    GIL, so the disk writing one object overlaps the hashing of another (XXH3 holds the GIL, for
    2 ms a 64 MB object). Lanes of threads, as the writer's own
    (:func:`serve`): idle ones (SCHED_IDLE, :func:`_idle_thread`) for a small backlog, busy ones
    at the writer's low priority for a large one (:class:`Pace`), and, once the parent has said
    stop, twice as many drain threads: the run is then waiting, the cores are free, and the
    disk's time per object is what it waits for (throughput: docs/materializer.md). More
    threads while training runs would only preempt it more often. A lane's threads
    start on its first use, from the writer thread of that lane, whose scheduling they inherit
    (in the forked writer, never in the parent before the fork)."""

    def __init__(self, blobs: Path, threads: int | None = None) -> None:
        self.blobs = blobs
        self.threads = threads or min(4, os.cpu_count() or 1)
        #: which lane writes (:data:`IDLE`, :data:`BUSY`, :data:`DRAIN`)
        self.lane = IDLE
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._claimed: set[str] = set()  # objects of the item in hand, written by one thread only
        self._lock = threading.Lock()

    def store(self, views: list[tuple[memoryview, bool]]) -> list[tuple[str, int]]:
        """(name, bytes written) of each ``(view, aligned)``: each view becomes
        ``objects/ab/<name>`` unless that exists; an ``aligned`` one (its bytes start at a
        :data:`direct.ALIGN` boundary of memory) goes around the page cache."""
        if not views:
            return []
        jobs = [self.pool().submit(self._one, v) for v in views]
        try:
            # every job ends before the first failure is raised: the item is then reported lost
            # and its arena region reused, and a job still running would hash and write bytes
            # staging had overwritten under the name of the bytes it started with
            wait(jobs)
            return [j.result() for j in jobs]
        finally:
            self._claimed.clear()

    def pool(self) -> ThreadPoolExecutor:
        """The object threads of the current lane."""
        pool = self._pools.get(self.lane)
        if pool is None:
            pool = self._pools[self.lane] = ThreadPoolExecutor(
                2 * self.threads if self.lane == DRAIN else self.threads,
                thread_name_prefix="flortrain-ckpt",
                initializer=_idle_thread if self.lane == IDLE else None,
            )
        return pool

    def _one(self, job: tuple[memoryview, bool]) -> tuple[str, int]:
        view, aligned = job
        name = content.name(view)
        path = object_path(self.blobs, name)
        with self._lock:
            if name in self._claimed or _whole(path, len(view)):
                return name, 0
            self._claimed.add(name)
        try:
            direct.write_object(self.blobs, object_rel(name), view, aligned)
        except BaseException:
            with self._lock:
                self._claimed.discard(name)
            raise
        return name, len(view)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        self._pools.clear()


def _whole(path: Path, nbytes: int) -> bool:
    """Whether an object of ``nbytes`` is at ``path`` already. Its size is checked, not only its
    name: a crash after the rename and before the data reached the disk can leave the name with
    no bytes (objects are not fsynced), and an object skipped for being there would leave every
    later checkpoint naming it unrestorable. Damage that keeps the size is caught when a replay
    reads the object (its name is verified) and the instance runs again."""
    try:
        return path.stat().st_size == nbytes
    except OSError:
        return False


def map_until_asked(sock: socket.socket, arena: memoryview, warm: int) -> int:
    """Map the arena's first ``warm`` bytes for reading, a :data:`~flortrain.checkpoint.arena.CHUNK`
    at a time, until the parent sends something; how many bytes were mapped. A script that ends
    before warming does (``print("hi")``) says stop at once, rather than wait for the whole
    arena to be mapped while both processes fault in the same pages."""

    def unasked() -> bool:
        return not select.select([sock], [], [], 0)[0]

    return max(populate_chunks(arena, warm, unasked, MADV_POPULATE_READ), default=0)


#: replies kept for a handoff: the parent has at most as many items in flight as its arena holds
#: regions, and it reads replies at every main-loop iteration
REPLIES_KEPT = 4096

#: how long a writer that said goodbye keeps the arena mapped for the parent to unmap it first
LINGER = 5.0


def linger(sock: socket.socket, timeout: float = LINGER) -> None:
    """After ``bye``, wait for the parent to close its end, which it does once it has unmapped the
    arena. Then this process, exiting in the background, holds the arena's last mapping and
    frees its pages, instead of the training process's exit: unmapping pages another process
    still maps is several times cheaper than freeing them."""
    sock.settimeout(timeout)
    with contextlib.suppress(OSError):
        while sock.recv(1 << 12):
            pass


class Desk:
    """The writer's items and messages, worked by one thread at a time: the writer's own thread
    while the pace is idle, its busy thread while it is busy (:func:`serve`). Each works until
    the pace turns to the other lane's, or the parent says stop or is gone (:attr:`over`)."""

    def __init__(
        self,
        ch: Channel,
        arena: memoryview,
        objects: Objects,
        pace: Pace,
        parent: int,
        delay: float,
        launcher: Channel | None = None,
    ) -> None:
        self.ch = ch
        self.launcher = launcher
        self.arena = arena
        self.objects = objects
        self.pace = pace
        self.parent = parent
        self.delay = delay
        #: fault injection (FLORTRAIN_INJECT=writer-fail=1): every item fails as on a full disk,
        #: nothing is written; what is left of a record's cost is the training side's alone
        self.fail = bool(knobs.injected("writer-fail"))
        self.tokens: dict[int, str] = {}
        self.queue: deque[Any] = deque()
        self.cpu = IdleCores()
        self.deferred = (
            False  # the queue's head is an item not started: no idle core to write it on
        )
        self.over = False
        self.eof = False  # the parent closed its end
        #: the parent handed what is queued to the launcher (:meth:`hand_off`): its exit or its
        #: closed end no longer ends the work, and no more replies go to it
        self.handing = False
        #: the latest replies by key, for :meth:`hand_off` to send again those the parent never read
        self.replies: OrderedDict[str, tuple[Any, ...]] = OrderedDict()

    def work(self, busy: bool) -> None:
        """Take items and write them on the calling thread, which is of the ``busy`` lane, until
        the pace wants the other lane (the item that says so stays queued for it) or it is over."""
        while not self.over:
            msg = self._next()
            if msg is None:
                continue
            if msg[0] == "stop":
                self.ch.send(("bye",))
                linger(self.ch.sock)
                self.over = True
                return
            if msg[0] == "handoff":
                self.hand_off(msg[1])
                self.over = True
                return
            stopping = any(m[0] in ("stop", "handoff") for m in self.queue)
            item = msg[1]
            if self.pace.update(item.get("staged", 0) + _holding(self.queue), stopping) != busy:
                self.queue.appendleft(msg)
                return
            if not busy and not may_start_idle(item.get("staged", 0), self.cpu):
                self.queue.appendleft(msg)
                self.deferred = True
                continue
            self._write(item, DRAIN if stopping else BUSY if busy else IDLE)
            if (
                self.pace.update(_holding(self.queue), stopping) != busy
            ):  # nothing left: back to idle CPU
                return

    def _next(self) -> Any:
        """The next message (None: none yet); everything pending is queued behind it, so that a
        "stop" or "handoff" among it is seen."""
        if not self.eof:
            try:
                if (
                    self.deferred and (more := self.ch.recv(IDLE_LOOK)) is not None
                ):  # look again in a moment
                    self.queue.append(more)
                if not self.queue and (first := self.ch.recv(1.0)) is not None:
                    self.queue.append(first)
                while (more := self.ch.recv(0)) is not None:
                    self.queue.append(more)
            except EOFError:
                self.eof = True
        self.handing = self.handing or any(m[0] == "handoff" for m in self.queue)
        if not self.handing and (
            self.eof or ((not self.queue or self.deferred) and os.getppid() != self.parent)
        ):
            self.over = True  # the recording process died: nothing can commit what is written now
            return None
        if not self.queue:
            return None
        self.deferred = False
        return self.queue.popleft()

    def hand_off(self, keys: list[str]) -> None:
        """Everything queued before the handoff is written: send the launcher the result of each
        key the parent had not read, then say so. The launcher commits them."""
        if self.launcher is None:
            return
        with contextlib.suppress(OSError):  # a launcher gone (killed) has nobody to commit for
            for key in keys:
                self.launcher.send(("reply", key, self.replies.get(key)))
            self.launcher.send(("written",))

    def _write(self, item: dict[str, Any], lane: str) -> None:
        for t in item.get("forget", ()):
            self.tokens.pop(t, None)
        if self.delay:
            time.sleep(self.delay)  # fault injection (FLORTRAIN_INJECT=writer-delay=S): a slow disk
        self.objects.lane = lane
        reply: tuple[Any, ...]
        try:
            if self.fail:
                raise OSError(
                    errno.ENOSPC, "No space left on device (injected: writer-fail)", item["rel"]
                )
            rel, sha, nbytes, digests = _write(item, self.arena, self.objects, self.tokens)
        except Exception as e:  # reported, never fatal: the next item may well succeed
            reason = (
                f"{type(e).__name__}: {e}"
                if not isinstance(e, OSError)
                else f"{e.strerror or e} ({e.filename or ''})"
            )
            reply = ("lost", item["key"], reason)
        else:
            reply = ("done", item["key"], rel, sha, nbytes, digests)
        if self.launcher is not None:  # only a launcher is ever handed these
            self.replies[item["key"]] = reply
            while len(self.replies) > REPLIES_KEPT:
                self.replies.popitem(last=False)
        if not self.handing:  # once handing, the parent reads no more
            with contextlib.suppress(
                OSError
            ):  # it closed its end: a handoff may be unread (`_next`)
                self.ch.send(reply)


def serve(
    sock: socket.socket,
    arena: memoryview,
    blobs: Path,
    parent: int,
    delay: float,
    threshold: int,
    warm: int = 0,
    launcher: socket.socket | None = None,
) -> None:
    """The writer's loop, until the parent says stop (or is gone). Never returns normally: the
    caller ``os._exit``s, so nothing the parent's interpreter registered runs here.

    Two threads take turns at the :class:`Desk`. The writer's own thread works while the pace is
    idle, at SCHED_IDLE: it wakes for every message, and a thread of normal policy waking on
    cores training keeps busy preempts one of torch's threads, which stalls the parallel op that
    thread was in (on the fine-tuning benchmark, a nice-10 writer thread woken a few times per
    checkpoint tripled the training threads' involuntary context switches). The busy thread,
    started first so that it keeps the writer's nice-10 normal policy (an unprivileged thread
    cannot leave SCHED_IDLE), works while the pace is busy. Before either, the writer maps the
    ``warm`` bytes of the arena the parent warms (``checkpoint/arena.py``): a page read for the
    first time costs the writer a fault per 4 KB too, and it is idle until the script has built a
    model to checkpoint; it stops as soon as the parent sends something."""
    # Ctrl-C, and a SIGTERM sent to the whole process group, are the parent's to handle: it
    # flushes, and this process ends when the parent says stop or is gone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICE)  # the busy thread inherits it; the idle lane's threads leave for SCHED_IDLE
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text("flortrain-ckpt")
    busy = ThreadPoolExecutor(1, thread_name_prefix="flortrain-ckpt")
    busy.submit(int).result()  # its one thread exists now, with this thread's policy
    map_until_asked(sock, arena, warm)
    _idle_thread()
    objects = Objects(blobs)
    desk = Desk(
        Channel(sock),
        arena,
        objects,
        Pace(threshold),
        parent,
        delay,
        None if launcher is None else Channel(launcher),
    )
    while not desk.over:
        desk.work(busy=False)
        if not desk.over:
            busy.submit(desk.work, True).result()


def _holding(queue: deque[Any]) -> int:
    """Bytes staged by the items waiting in ``queue``."""
    return sum(m[1].get("staged", 0) for m in queue if m[0] == "item")


def _write(
    item: dict[str, Any], arena: memoryview, objects: Objects, tokens: dict[int, str]
) -> tuple[str, str, int, dict[str, str]]:
    blobs = objects.blobs
    rel: str = item["rel"]
    if item["kind"] == "bytes":  # a payload serialized on the training thread (torch.save)
        off, n = item["region"]
        sha = write_durably(blobs, rel, item["key"], [arena[off : off + n]])
        return rel, sha, n, item["digests"]
    metas = item["metas"]
    off, n = item["parts"]
    parts = bytes(arena[off : off + n])
    names: list[str] = [""] * len(metas)
    table: list[tuple[str, Any]] = [("i", 0)] * len(metas)
    inline: list[int] = []
    external: list[int] = []
    for g, place in enumerate(item["places"]):
        if place[0] == "t":
            known = tokens.get(place[1])
            if known is None:
                raise LookupError("it shares an unchanged tensor with a checkpoint that was lost")
            names[g], table[g] = known, ("x", known)
            continue
        if place[0] == "k":  # as at the main loop's entry: the replay's prologue makes its bytes
            names[g], table[g] = place[1], ("k", place[1])
            continue
        _, start, is_external, _token = place
        if is_external:
            external.append(g)
        else:
            names[g] = content.name(arena[start : start + metas[g][2]])
            inline.append(g)
    stored = objects.store(
        [
            (arena[(a := item["places"][g][1]) : a + metas[g][2]], a % direct.ALIGN == 0)
            for g in external
        ]
    )
    written = 0
    for g, (name, nbytes) in zip(external, stored, strict=True):
        names[g], table[g] = name, ("x", name)
        written += nbytes
        token = item["places"][g][3]
        if token is not None:
            tokens[token] = name
    starts = [item["places"][g][1] for g in inline]
    offsets, chunks = codec.inline(
        [arena[s : s + metas[g][2]] for g, s in zip(inline, starts, strict=True)]
    )
    for g, off in zip(inline, offsets, strict=True):
        table[g] = ("i", off)
    head = codec.header(parts, metas, table)
    sha = write_durably(blobs, rel, item["key"], [head, *chunks])
    nbytes = len(head) + sum(len(c) for c in chunks) + written
    return rel, sha, nbytes, codec.part_digests(item["skeletons"], metas, names)


def run_child(
    sock: socket.socket,
    arena: memoryview,
    blobs: Path,
    parent: int,
    delay: float,
    threshold: int,
    warm: int = 0,
    launcher: socket.socket | None = None,
) -> None:
    """The forked child's whole life. ``launcher``: where the results of what the parent hands
    over at its end go (``flortrain/process/launcher.py``)."""
    code = 0
    try:
        serve(sock, arena, blobs, parent, delay, threshold, warm, launcher)
    except BaseException as e:
        with contextlib.suppress(Exception):
            os.write(2, f"flortrain: checkpoint writer failed: {type(e).__name__}: {e}\n".encode())
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)
