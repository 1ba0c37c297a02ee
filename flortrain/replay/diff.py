"""``flortrain diff``: Flor's deferred correctness check.

The record's and the replay's captured output are compared as sequences (a line inserted or lost
is one difference) over the regions both executed (top-level code, main-loop iterations the replay
did not jump over, and block instances it re-executed), probe output excluded. RNG stream digests taken at every
main-loop iteration boundary are compared too: a skipped block that restored the wrong state
shows up there even when nothing printed differs. And where the replay executed an instance the
record checkpointed, the digests of the state each left behind are compared part by part
(:mod:`flortrain.checkpoint.digest`). What differs is named (:mod:`flortrain.replay.divergence`):
the random stream, the part and the first tensor in it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from flortrain.errors import FlortrainError
from flortrain.replay.divergence import loads_boundaries, state_differences, stream_differences
from flortrain.store.db import Store
from flortrain.store.logs import LogEntry
from flortrain.store.records import INCOMPLETE, BlockState, Run, RunStatus


@dataclass
class DiffResult:
    record: Run
    replay: Run
    compared: int = 0
    differences: list[tuple[LogEntry | None, LogEntry | None]] = field(default_factory=list)
    rng_checked: int = 0
    #: (main id, entry, iteration) and the streams that differ at its start
    rng_mismatches: list[tuple[tuple[str, int, int], list[str]]] = field(default_factory=list)
    beyond_record: int = 0  # replay lines past the end of a record that ended early
    states_checked: int = 0
    #: (block key, the part or tensor that differs, as shown: ``module#0.weight``)
    state_mismatches: list[tuple[str, str]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences and not self.rng_mismatches and not self.state_mismatches

    def report(self, limit: int = 5) -> list[str]:
        rec, rep = self.record.id, self.replay.id
        if self.identical:
            out = [
                f"replay {rep} matches record {rec}: {self.compared} output lines compared,"
                f" RNG streams equal at {self.rng_checked} main-loop iteration boundaries"
                + (
                    f", state equal at {self.states_checked} checkpoints"
                    if self.states_checked
                    else ""
                )
            ]
            if self.beyond_record:
                out.append(
                    f"  record {rec} is {self.record.effective_status}: {self.beyond_record} replay"
                    " lines past its end were not compared"
                )
            return out
        out = [f"replay {rep} differs from record {rec}:"]
        for a, b in self.differences[:limit]:
            where = (a or b).context() if (a or b) is not None else "?"  # type: ignore[union-attr]
            out.append(f"  at {where}:")
            out.append(f"    record: {a.text if a else '(no line)'}")
            out.append(f"    replay: {b.text if b else '(no line)'}")
        if len(self.differences) > limit:
            out.append(f"  ... {len(self.differences) - limit} more differing lines")
        for (m, entry, it), streams in self.rng_mismatches[:limit]:
            out.append(
                f"  RNG streams differ at the start of {m} iteration {it} (entry {entry}): "
                + ", ".join(f"`{s}`" for s in streams)
            )
        for key, part in self.state_mismatches[:limit]:
            out.append(f"  state differs from the record's checkpoint after {key}: `{part}`")
        return out


def resolve_replay(store: Store, run_id: int | None) -> Run:
    if run_id is None:
        run = store.latest("replay")
        if run is None:
            raise FlortrainError(
                "no replay to diff; run `flortrain replay SCRIPT` first", code="FT030"
            )
        return run
    run = store.run(run_id)
    if run.kind != "replay":
        raise FlortrainError(f"run {run_id} is a {run.kind}, not a replay", code="FT030")
    return run


def comparable_lines(
    entries: Iterable[LogEntry], executed: set[str], jumped: set[tuple[str, int, int]] | None = None
) -> list[LogEntry]:
    """The output both runs produced: pieces printed by probes, inside block instances the
    replay skipped, or in main-loop iterations it jumped over are dropped, and what remains is
    re-split into lines. A line whose newline was dropped joins the next (a probe's own newline
    in the middle of a progress line)."""
    out: list[LogEntry] = []
    text = ""
    first: LogEntry | None = None
    for e in entries:
        if jumped and e.main_id is not None and (e.main_id, e.main_inst, e.iteration) in jumped:
            continue
        pieces = e.pieces()
        for i, (piece, region, probe) in enumerate(pieces):
            if probe or (region is not None and region not in executed):
                continue
            if first is None and piece:
                first = e
            text += piece
            if i == len(pieces) - 1:
                # where the line started (loop context) and the region whose newline ended it
                out.append(
                    replace(first or e, text=text, region=region, probe=False, segments=None)
                )
                text, first = "", None
    if text:
        out.append(
            replace(
                first or LogEntry(-1, "", None, None, None, None, False), text=text, segments=None
            )
        )
    return out


def _key(e: LogEntry) -> tuple[object, ...]:
    return (e.text, e.main_id, e.main_inst, e.iteration, e.region)


def line_differences(
    a: list[LogEntry], b: list[LogEntry]
) -> list[tuple[LogEntry | None, LogEntry | None]]:
    """The lines that differ, by a sequence diff: a line inserted or lost is one difference, and
    the lines after it still line up (a zip would report every later line)."""
    ka, kb = [_key(e) for e in a], [_key(e) for e in b]
    if ka == kb:
        return []
    out: list[tuple[LogEntry | None, LogEntry | None]] = []
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        xs, ys = a[i1:i2], b[j1:j2]
        for k in range(max(len(xs), len(ys))):
            out.append((xs[k] if k < len(xs) else None, ys[k] if k < len(ys) else None))
    return out


def _state_differences(store: Store, record: int, replay: int) -> tuple[int, list[tuple[str, str]]]:
    """Checkpoint state digests: at each instance the replay executed where the record took a
    checkpoint, every part both digested must be equal; the first differing per instance is named."""
    recorded = {b.key: b.state_sha for b in store.blocks(record) if b.state_sha}
    checked = 0
    mismatches: list[tuple[str, str]] = []
    for b in store.blocks(replay):
        if b.state != BlockState.EXECUTED or not b.state_sha or b.key not in recorded:
            continue
        checked += 1
        mismatches.extend((b.key, part) for part in state_differences(recorded[b.key], b.state_sha))
    return checked, mismatches


def diff_runs(store: Store, replay: Run) -> DiffResult:
    if replay.parent is None:
        raise FlortrainError(f"replay {replay.id} has no record", code="FT030")
    if replay.effective_status in (RunStatus.RUNNING, INCOMPLETE):
        raise FlortrainError(
            f"replay {replay.id} is {replay.effective_status}; nothing to compare yet", code="FT030"
        )
    record = store.run(replay.parent)
    executed = {b.key for b in store.blocks(replay.id) if b.state == BlockState.EXECUTED}

    jumped = store.jumped(replay.id)
    a = comparable_lines(store.logs(record.id), executed, jumped)
    b = comparable_lines(store.logs(replay.id), executed, jumped)
    result = DiffResult(record, replay, compared=min(len(a), len(b)))
    if record.effective_status != RunStatus.COMPLETE:
        # the record was killed or crashed: the replay runs on past where it stopped, and the
        # comparison covers the output both produced
        result.beyond_record = max(0, len(b) - len(a))
        b = b[: len(a)]
    result.differences = line_differences(a, b)
    result.states_checked, result.state_mismatches = _state_differences(store, record.id, replay.id)
    result.rng_checked, result.rng_mismatches = stream_differences(
        loads_boundaries(store.iteration_hashes(record.id)),
        loads_boundaries(store.iteration_hashes(replay.id)),
    )
    return result
