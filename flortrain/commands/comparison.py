"""One run of ``flortrain verify`` against the first: every digest both took, and the first that
differs, by name.

A run's digests are the random streams at the start of every main-loop iteration, the state
of every checkpoint (a boundary's, a block instance's), and what it printed. The first record
is the reference; the second record and each resumed run are compared with it where both took a
digest. Divergences are ordered as the reference ran: by main-loop iteration, and in one
iteration the streams at its start, then its boundary checkpoint, then its block instances in
the order they ran. The first names the iteration, the block and the tensor or stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flortrain.replay.diff import line_differences
from flortrain.replay.divergence import (
    Boundary,
    moving_streams,
    state_differences,
    stream_differences,
)
from flortrain.store.logs import LogEntry
from flortrain.store.records import BlockRow, BlockState


@dataclass
class Digests:
    """What one run left to compare (read from the store, or returned by a resumed worker)."""

    boundaries: dict[Boundary, dict[str, str]]
    blocks: list[BlockRow]
    lines: list[LogEntry]


@dataclass(frozen=True)
class Divergence:
    """Where a run first left the reference: ``kind`` is ``stream``, ``state``, ``output``, or
    ``failed`` (a resumed run that did not run to its end)."""

    kind: str
    main_id: str | None
    entry: int | None
    iteration: int | None
    #: the block id (a boundary checkpoint: the main loop's id), None for a stream or a line
    block: str | None
    #: the checkpoint's key, None for a stream or a line
    checkpoint: str | None
    #: the tensors or streams that differ, first first (a line: its text in the reference)
    names: tuple[str, ...]
    #: an output line: the other run's text (None: it printed no such line)
    other: str | None = None

    def describe(self) -> str:
        where = (
            f"main loop {self.main_id} iteration {self.iteration}"
            if self.main_id is not None
            else "outside the main loop"
        )
        if self.kind == "failed":
            return f"resumed at {where}, the run failed: {self.names[0]}"
        if self.kind == "stream":
            return f"{where}, at its start: random stream {', '.join(self.names)}"
        if self.kind == "state":
            block = "its boundary" if self.block == self.main_id else f"block {self.block}"
            shown = ", ".join(f"`{n}`" for n in self.names)
            return f"{where}, {block} (checkpoint {self.checkpoint}): {shown}"
        return f"{where}: output line {self.names[0]!r} printed as {self.other!r}"

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "main": self.main_id,
            "entry": self.entry,
            "iteration": self.iteration,
            "block": self.block,
            "checkpoint": self.checkpoint,
            "names": list(self.names),
            "other": self.other,
        }


@dataclass
class Comparison:
    """A run against the reference: how much was compared, and what differs, in run order."""

    name: str
    boundaries: int = 0
    checkpoints: int = 0
    lines: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.divergences


def _order(reference: Digests) -> dict[Boundary, int]:
    """Each main-loop boundary's place in the reference run (by the order its rows were taken:
    the iterations of one loop entry are consecutive)."""
    return {b: i for i, b in enumerate(reference.boundaries)}


def _block_place(reference: Digests, order: dict[Boundary, int]) -> dict[str, tuple[int, int, int]]:
    """Each checkpointed instance's place in the reference: (its iteration's, 1 for a boundary
    and 2 for a block, its row's)."""
    out = {}
    for i, b in enumerate(reference.blocks):
        at = order.get((b.main_id, b.main_inst, b.iteration), len(order))
        out[b.key] = (at, 1 if b.state == BlockState.BOUNDARY else 2, i)
    return out


def _digested(blocks: list[BlockRow]) -> dict[str, BlockRow]:
    return {b.key: b for b in blocks if b.state_sha}


def _lines_from(lines: list[LogEntry], since: Boundary | None) -> list[LogEntry]:
    """The lines from the first printed in the main loop's entry at or after ``since`` on (a
    resumed run printed nothing of the iterations before)."""
    if since is None:
        return [e for e in lines if not e.probe]
    m, entry, start = since
    first = next(
        (
            k
            for k, e in enumerate(lines)
            if e.main_id == m
            and e.main_inst == entry
            and e.iteration is not None
            and e.iteration >= start
        ),
        len(lines),
    )
    return [e for e in lines[first:] if not e.probe]


def compare(
    name: str, reference: Digests, other: Digests, since: Boundary | None = None
) -> Comparison:
    """``other`` against ``reference`` where both took a digest (from ``since`` on: a resumed
    run's boundary)."""
    out = Comparison(name)
    order = _order(reference)
    place = _block_place(reference, order)
    found: list[tuple[tuple[int, int, int], Divergence]] = []

    def later(b: Boundary) -> bool:
        return since is None or (b[:2] != since[:2] or b[2] >= since[2])

    ra = {k: v for k, v in reference.boundaries.items() if later(k)}
    rb = {k: v for k, v in other.boundaries.items() if later(k)}
    out.boundaries, streams = stream_differences(ra, rb, moving_streams(reference.boundaries))
    for (m, entry, it), names in streams:
        d = Divergence("stream", m, entry, it, None, None, tuple(names))
        found.append(((order.get((m, entry, it), len(order)), 0, 0), d))
    mine = _digested(other.blocks)
    for key, row in _digested(reference.blocks).items():
        theirs = mine.get(key)
        if theirs is None or theirs.state_sha is None or row.state_sha is None:
            continue
        out.checkpoints += 1
        parts = state_differences(row.state_sha, theirs.state_sha)
        if parts:
            d = Divergence(
                "state", row.main_id, row.main_inst, row.iteration, row.block_id, key, tuple(parts)
            )
            found.append((place[key], d))
    a, b = _lines_from(reference.lines, since), _lines_from(other.lines, since)
    out.lines = min(len(a), len(b))
    for x, y in line_differences(a, b)[:1]:
        e = x or y
        assert e is not None
        d = Divergence(
            "output",
            e.main_id,
            e.main_inst,
            e.iteration,
            None,
            None,
            (x.text if x else "",),
            y.text if y else None,
        )
        at = (e.main_id or "", e.main_inst or 0, e.iteration or 0)
        found.append(((order.get(at, len(order)), 3, 0), d))
    out.divergences = [d for _, d in sorted(found, key=lambda f: f[0])]
    return out


__all__ = ["Comparison", "Digests", "Divergence", "compare"]
