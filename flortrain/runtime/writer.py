"""The materializer's writer: a process forked once, before the script runs, that hashes and
writes the checkpoints the training thread staged (Flor thesis, Chapter 4).

It reads staged bytes from the shared arena (an anonymous shared mapping the parent created
before forking it) and messages from a socket; it never imports torch and never touches the
store's SQLite connection: the parent commits a checkpoint only when the writer reports its bytes
durable, with their sha256. It runs at a low CPU priority, so on a machine with few cores
training keeps the CPU it would have had. One item at a time, in order:

- every staged tensor is hashed (sha256); a large one is written as a content-addressed object
  (``objects/ab/<sha256>``) unless that object exists already, bypassing the page cache where
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
import hashlib
import os
import pickle
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flortrain.runtime import blobformat
from flortrain.store import direct
from flortrain.store.db import object_path, write_durably

_LEN = struct.Struct("<Q")


class Channel:
    """Length-prefixed pickled messages over a stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def send(self, msg: Any) -> None:
        data = pickle.dumps(msg, protocol=5)
        self.sock.sendall(_LEN.pack(len(data)) + data)

    def recv(self, timeout: float | None) -> Any:
        """The next message; None if none arrives within ``timeout`` (0: poll). Raises
        :class:`EOFError` when the other end is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if len(self.buf) >= 8:
                (n,) = _LEN.unpack_from(self.buf)
                if len(self.buf) >= 8 + n:
                    msg = pickle.loads(bytes(self.buf[8 : 8 + n]))
                    del self.buf[: 8 + n]
                    return msg
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return None
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError as e:
                raise EOFError(str(e)) from None
            if not chunk:
                raise EOFError("closed")
            self.buf += chunk


class Objects:
    """Content-addressed objects hashed and written on a few threads. sha256 and ``write`` both
    release the GIL, so the hashing of one object overlaps the disk writing another, and on
    idle cores objects are hashed side by side: a starved writer's whole backlog is written when
    training ends, so its speed then is time the run waits. Threads start on first use (in the
    forked writer, never in the parent before the fork)."""

    def __init__(self, blobs: Path, threads: int | None = None) -> None:
        self.blobs = blobs
        self.threads = threads or min(4, os.cpu_count() or 1)
        #: aligned objects bypass the page cache (see :func:`serve`)
        self.direct = True
        self._pool: ThreadPoolExecutor | None = None
        self._claimed: set[str] = set()  # objects of the item in hand, written by one thread only
        self._lock = threading.Lock()

    def store(self, views: list[tuple[memoryview, bool]]) -> list[tuple[str, int]]:
        """(sha256, bytes written) of each ``(view, aligned)``: each view becomes
        ``objects/ab/<sha256>`` unless that exists; an ``aligned`` one (its bytes start at a
        :data:`direct.ALIGN` boundary of memory) goes around the page cache."""
        try:
            if len(views) <= 1 or self.threads <= 1:
                return [self._one(v) for v in views]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="flortrain-ckpt")
            return list(self._pool.map(self._one, views))
        finally:
            self._claimed.clear()

    def _one(self, job: tuple[memoryview, bool]) -> tuple[str, int]:
        view, aligned = job
        sha = hashlib.sha256(view).hexdigest()
        path = object_path(self.blobs, sha)
        with self._lock:
            if sha in self._claimed or path.exists():
                return sha, 0
            self._claimed.add(sha)
        try:
            direct.write_object(path, view, aligned and self.direct)
        except BaseException:
            with self._lock:
                self._claimed.discard(sha)
            raise
        return sha, len(view)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _yield_cpu() -> None:
    """Run only on CPU time training leaves idle. A parallel torch op waits for its slowest
    thread, so even a niced process that preempts one of them stalls the whole op; SCHED_IDLE
    is preempted as soon as a normal thread wants the core (Linux; elsewhere, nice)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def serve(sock: socket.socket, arena: memoryview, blobs: Path, parent: int, delay: float) -> None:
    """The writer's loop, until the parent says stop (or is gone). Never returns normally: the
    caller ``os._exit``s, so nothing the parent's interpreter registered runs here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it flushes
    _yield_cpu()
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text("flortrain-ckpt")
    ch = Channel(sock)
    objects = Objects(blobs)
    tokens: dict[int, str] = {}
    queue: deque[Any] = deque()
    while True:
        try:
            msg = queue.popleft() if queue else ch.recv(1.0)
            while (more := ch.recv(0)) is not None:  # all that is pending: is "stop" among it?
                queue.append(more)
        except EOFError:
            return
        # Once the parent waits for the backlog (training is over), the disk's speed is the
        # run's time: write through the page cache on the idle cores. Until then, around it:
        # a copy into the page cache is CPU that training would lose.
        objects.direct = not any(m[0] == "stop" for m in queue)
        if msg is None:
            if os.getppid() != parent:
                return  # the recording process died: nothing can commit what is written now
            continue
        if msg[0] == "stop":
            ch.send(("bye",))
            return
        item = msg[1]
        for t in item.get("forget", ()):
            tokens.pop(t, None)
        if delay:
            time.sleep(delay)  # fault injection (FLORTRAIN_INJECT=writer-delay=S): a slow disk
        try:
            rel, sha, nbytes, digests = _write(item, arena, objects, tokens)
        except Exception as e:  # reported, never fatal: the next item may well succeed
            reason = f"{type(e).__name__}: {e}" if not isinstance(e, OSError) else f"{e.strerror or e} ({e.filename or ''})"
            ch.send(("lost", item["key"], reason))
            continue
        ch.send(("done", item["key"], rel, sha, nbytes, digests))


def _write(item: dict[str, Any], arena: memoryview, objects: Objects, tokens: dict[int, str]) -> tuple[str, str, int, dict[str, str]]:
    blobs = objects.blobs
    rel: str = item["rel"]
    if item["kind"] == "bytes":  # a payload serialized on the training thread (torch.save)
        off, n = item["region"]
        sha = write_durably(blobs / rel, [arena[off : off + n]])
        return rel, sha, n, item["digests"]
    metas = item["metas"]
    off, n = item["parts"]
    parts = bytes(arena[off : off + n])
    shas: list[str] = [""] * len(metas)
    table: list[tuple[str, Any]] = [("i", 0)] * len(metas)
    inline: list[int] = []
    external: list[int] = []
    for g, place in enumerate(item["places"]):
        if place[0] == "t":
            known = tokens.get(place[1])
            if known is None:
                raise LookupError("it shares an unchanged tensor with a checkpoint that was lost")
            shas[g], table[g] = known, ("x", known)
            continue
        _, start, is_external, _token = place
        if is_external:
            external.append(g)
        else:
            shas[g] = hashlib.sha256(arena[start : start + metas[g][2]]).hexdigest()
            inline.append(g)
    stored = objects.store([
        (arena[(a := item["places"][g][1]) : a + metas[g][2]], a % direct.ALIGN == 0) for g in external
    ])
    written = 0
    for g, (sha, nbytes) in zip(external, stored, strict=True):
        shas[g], table[g] = sha, ("x", sha)
        written += nbytes
        token = item["places"][g][3]
        if token is not None:
            tokens[token] = sha
    starts = [item["places"][g][1] for g in inline]
    offsets, chunks = blobformat.inline([arena[s : s + metas[g][2]] for g, s in zip(inline, starts, strict=True)])
    for g, off in zip(inline, offsets, strict=True):
        table[g] = ("i", off)
    head = blobformat.header(parts, metas, table)
    sha = write_durably(blobs / rel, [head, *chunks])
    nbytes = len(head) + sum(len(c) for c in chunks) + written
    return rel, sha, nbytes, blobformat.part_digests(item["skeletons"], metas, shas)


def run_child(sock: socket.socket, arena: memoryview, blobs: Path, parent: int, delay: float) -> None:
    """The forked child's whole life."""
    code = 0
    try:
        serve(sock, arena, blobs, parent, delay)
    except BaseException as e:
        with contextlib.suppress(Exception):
            os.write(2, f"flortrain: checkpoint writer failed: {type(e).__name__}: {e}\n".encode())
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)
