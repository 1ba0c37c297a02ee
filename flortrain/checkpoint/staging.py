"""Staging: where a checkpoint's bytes go in the arena the writer reads, and what copying them
there will cost, decided before anything is copied.

A large tensor unchanged since it was last staged is referred to, not copied
(:class:`ChangeTracker`); one unchanged since the main loop's entry is named by the hash of its
bytes. The rest is laid out in a ring of regions the writer frees in order (:func:`ring_fit`).
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from flortrain.checkpoint import codec, versions
from flortrain.checkpoint.skeleton import Staged
from flortrain.store import direct

#: Tensors at least this large are content-addressed objects, and skipped when unchanged: small
#: enough that an LSTM's 0.5 MB gate matrices are tracked (a boundary right after a block's
#: checkpoint then writes nothing again), large enough that the per-file cost stays small.
EXTERNAL_MIN = 1 << 16


_ALIGN = 64


@dataclass(frozen=True)
class Estimate:
    """What staging a prepared checkpoint will cost, known before anything is copied: the bytes
    staging copies and those it hashes here, the seconds that holds training, and the seconds
    the writer will take (:func:`writer_speed`)."""

    staged: int
    hashed: int
    blocked_s: float
    writer_s: float


@dataclass
class Layout:
    """Where a payload's tensors go in the arena (:meth:`BackgroundMaterializer.prepare`)."""

    st: Staged
    places: list[Any]
    seen: list[tuple[Any, int]]  # large tensors staged or referred to, with their tokens
    copies: list[tuple[int, int]]  # (tensor, offset within the region) to copy
    kept: list[tuple[int, tuple[Any, ...]]]  # unchanged since the loop's entry: named, not staged
    n: int  # the region's bytes


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
            name = codec.tensor_name(ref, torch)
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
class Flight:
    key: str
    start: int
    end: int
    staged: int  # bytes the writer hashes and writes


def ring_fit(inflight: deque[Flight], size: int, n: int) -> int | None:
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


def _up(n: int) -> int:
    return n + (-n % _ALIGN)


def lay_out(tracker: ChangeTracker, st: Staged) -> Layout:
    """Where each tensor of a staged payload goes: referred to by token (unchanged since
    staged), by name (unchanged since the loop's entry), or copied at an offset."""
    lay = Layout(st, [None] * len(st.tensors), [], [], [], _up(len(st.parts)))
    for g, t in enumerate(st.tensors):
        nbytes = st.metas[g][2]
        external = nbytes >= EXTERNAL_MIN
        if external:
            tok = tracker.unchanged(t)
            if tok is not None:
                lay.places[g] = ("t", tok)
                lay.seen.append((t, tok))
                continue
            where = tracker.since_entry(t)
            if where is not None:
                lay.kept.append((g, where))
                continue
            tok = tracker.token()
            lay.seen.append((t, tok))
            lay.n = direct.aligned(lay.n)  # the writer hands its pages to the disk as they are
        else:
            tok = None
        lay.places[g] = ("a", lay.n, external, tok)
        lay.copies.append((g, lay.n))
        lay.n += _up(nbytes)
    lay.n = direct.aligned(lay.n)  # the next region starts aligned too
    return lay
