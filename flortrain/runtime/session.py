"""The session: everything one record or replay process knows at run time.

Instrumented code calls the functions in :mod:`flortrain.runtime`; they act on the one active
session (none when instrumented code runs under plain ``python``: then every hook is a no-op and
every loop runs as written).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from flortrain import knobs
from flortrain.runtime import audit, identity, rng, signals, versions
from flortrain.runtime import materializer as _materializer
from flortrain.runtime.adaptive import AdaptivePeriod
from flortrain.runtime.blobformat import object_refs, tensor_bytes, tensor_name
from flortrain.runtime.capture import Tee
from flortrain.runtime.files import Watch, put_back
from flortrain.runtime.materializer import Afford, Callbacks, Declined, Materializer
from flortrain.runtime.registry import Registry
from flortrain.runtime.skipblock import Getters, SkipBlock, State, bound, resolve
from flortrain.runtime.spans import Boundary, Segment, SegmentEnd, SpanReplay, scalars_json
from flortrain.store.iterations import IterationRow
from flortrain.store.records import BlockRow, BlockState, Checkpoint
from flortrain.store.rows import RecordSink, RunSink
from flortrain.store.scriptfiles import FileState


@dataclass
class ReplaySource:
    """What a replay reads from the record it replays."""

    run_id: int
    execute: frozenset[str]  # block ids that must run (probed)
    checkpoints: dict[str, Checkpoint]
    spans: SpanReplay | None = None  # jumping over main-loop iterations no probe needs
    #: per checkpoint key, the files the record had written as it found them (``file_states``)
    files: dict[str, list[FileState]] = field(default_factory=dict)


@dataclass
class Session:
    mode: str  # "record" | "replay"
    store: RunSink  # the SQLite store, or a parallel-replay worker's rows (flortrain.store.rows)
    run_id: int
    replay: ReplaySource | None = None
    registry: Registry = field(default_factory=Registry)
    adaptive: AdaptivePeriod = field(default_factory=AdaptivePeriod)
    materializer: Materializer | None = None
    main: list[Any] | None = None  # [main id, entry, iteration]
    main_entries: dict[str, int] = field(default_factory=dict)
    occurrences: dict[str, int] = field(default_factory=dict)
    frames: list[SkipBlock] = field(default_factory=list)
    probe_depth: int = 0
    learned: dict[str, set[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    tee: Tee | None = None
    _warned: set[str] = field(default_factory=set)
    _iterations: list[IterationRow] = field(default_factory=list)
    _blocks: list[BlockRow] = field(default_factory=list)  # block instances without a checkpoint
    _jump_pending: tuple[str, int, Boundary] | None = (
        None  # a jump the main loop's generator decided
    )
    _driven: set[str] = field(default_factory=set)  # main loops whose iterator the runtime wraps
    #: when the current iteration of each main loop began: wall, CPU, and :attr:`held` then
    _boundary_t: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    #: main loop id -> [wall, CPU] seconds of its iterations in this process: how many cores the
    #: loop keeps busy, which a parallel replay's planner weighs against the machine's
    loop_load: dict[str, list[float]] = field(default_factory=dict)
    _hold_t0: float | None = None  # when the hook in progress began (:meth:`holding`)
    background: float = 0.0  # the writer's estimated seconds for the latest checkpoint
    #: seconds of :attr:`held` spent at the end waiting for the writer to finish what training
    #: left it (:meth:`flush`): a writer that training starved of CPU does its work then
    exit_wait: float = 0.0
    _no_boundary: set[str] = field(default_factory=set)
    #: main loop id -> the objects below its state at the last boundary captured: path -> (the
    #: object, iteration since which it has been there) (``identity.BoundaryMarks``)
    identity_tables: dict[str, dict[str, tuple[Any, int]]] = field(default_factory=dict)
    #: which files are the project's own modules (record sets it): their globals are state a
    #: loop can change through a function of theirs (``audit.project_roots``)
    project: Any = None
    #: loop id -> why it is not checkpointed: the side-effect audit saw it change state in place
    #: that its changeset does not name (``audit``)
    unnamed_effects: dict[str, str] = field(default_factory=dict)
    _main_audit: tuple[str, audit.Image, FrameType] | None = None
    _initial_digests: dict[str, str] = field(default_factory=dict)
    _digest_memo: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # ``rng.digest_map``'s
    #: id -> (tensor, version, name): live module tensors hashed by :meth:`live_object`
    _live_names: dict[int, tuple[Any, int, str]] = field(default_factory=dict)
    _last_commit: float = 0.0
    commit_interval: float = field(default_factory=knobs.commit_interval)
    boundary_every: int = field(default_factory=knobs.boundary_every)
    track_versions: bool = True  # False when the script writes tensors through `.data`
    _submitting: str | None = None
    _outcome: tuple[str, Any] | None = None
    _pending: dict[str, BlockState] = field(
        default_factory=dict
    )  # checkpoints staged, not yet committed
    started: float = field(default_factory=time.perf_counter)
    #: a parallel-replay worker's output positions (captured-line numbers) where its segment's
    #: main loop was entered ("enter") and where it left it or stopped ("exit")
    marks: dict[str, int] = field(default_factory=dict)
    #: ``record --resume``: the (main id, entry, iteration) to continue a killed run at
    resume: tuple[str, int, int] | None = None
    resume_seq: int = 0  # the killed run's captured lines kept: the resumed log continues there
    #: ``record --resume``: the iteration it records from; those from the boundary restored up
    #: to it run as in a replay (:attr:`replaying`)
    resume_until: int = 0
    #: (main id, entry, iteration): a resumed record runs its main loop's iterations before
    #: that one as a replay would, its blocks restored and nothing recorded or printed
    replaying: tuple[str, int, int] | None = None
    _signal_injected: int | None = None  # ``FLORTRAIN_INJECT=checkpoint-signal=N``, once read
    _pid: int = field(default_factory=os.getpid)  # the training process's (``signals.defer``)
    #: the writer's pid and the keys it still held when the script ended, handed to the launcher
    handed: tuple[int, list[str]] | None = None
    #: record: the files the script reads and writes (``runtime/files.py``)
    files: Watch | None = None

    def __post_init__(self) -> None:
        if self.replay is not None and self.replay.spans is not None:
            self.replay.spans.warn = lambda msg: self.warn_once(msg, msg)
        if self.mode == "replay" and self.replay is not None:
            # the checkpoints of blocks it does not re-execute, read ahead of their restores
            # (a boundary's key begins with its main loop's id, never among them)
            execute = self.replay.execute
            self.store.read_ahead(
                [
                    ck
                    for key, ck in self.replay.checkpoints.items()
                    if key.partition("@")[0] not in execute
                ],
                object_refs,
            )

    def start_materializer(self) -> Materializer:
        """The materializer, started now: ``record`` starts it before the script runs, so the
        writer is forked while the process is small and shares none of the model's pages."""
        if self.materializer is None:
            assert isinstance(self.store, RecordSink)  # record mode: the SQLite store itself
            self.materializer = _materializer.make(
                self.store,
                self.run_id,
                Callbacks(self._committed, self._lost, self.warn),
                self.track_versions,
            )
        return self.materializer

    # -- main loop ---------------------------------------------------------------------------------
    def main_enter(self, main_id: str) -> None:
        if self.probe_depth:
            return  # a probe that runs the main loop's function is the probe's business
        self.abort_frames()
        entry = self.main_entries.get(main_id, 0)
        self.main_entries[main_id] = entry + 1
        self.main = [main_id, entry, -1]
        if self.materializer is not None and self.mode == "record":
            self.materializer.loop_entered(self.module_tensors())
        seg = self._segment()
        if seg is not None and seg.owns(main_id, entry):
            self._mark("enter")

    def _segment(self) -> Segment | None:
        """The iterations this process owns, in a parallel-replay worker."""
        spans = self.replay.spans if self.replay is not None else None
        return spans.segment if spans is not None else None

    def _segment_here(self) -> Segment | None:
        """A worker's segment, when the current main-loop iteration is of the loop it divides."""
        seg = self._segment()
        return (
            seg
            if seg is not None and self.main is not None and seg.owns(self.main[0], self.main[1])
            else None
        )

    def _mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = self.tee.seq if self.tee is not None else 0

    def _end_segment(self, main_id: str, entry: int, i: int, target: int | None = None) -> None:
        """Stop this worker at iteration ``i`` of its segment's loop when ``i`` (or the
        iteration the replay would continue at) is past the segment; iterations from ``i`` to
        the segment's end are then jumped over: no probe fires in them."""
        seg = self._segment()
        reached = i if target is None else target
        if (
            seg is None
            or seg.end is None
            or not seg.owns(main_id, entry)
            or i < seg.start
            or reached < seg.end
        ):
            return
        if i < seg.end:
            self.store.put_jump(self.run_id, main_id, entry, i, seg.end)
            self.counts["jumped"] = self.counts.get("jumped", 0) + seg.end - i
        self._mark("exit")
        raise SegmentEnd

    def before_segment(self) -> bool:
        """In a worker, whether the current iteration precedes its segment (its output is not
        wanted, and the blocks probes need execute only in the segment)."""
        seg = self._segment_here()
        return seg is not None and self.main is not None and self.main[2] < seg.start

    def main_iteration(
        self,
        main_id: str,
        objects: Getters | None = None,
        names: Getters | None = None,
        values: tuple[str, ...] = (),
        frame: FrameType | None = None,
    ) -> Boundary | None:
        """The start of a main-loop iteration. With a boundary state (``objects`` given: the
        static pass found the loop's changeset), record its scalars and maybe checkpoint it, or
        on replay jump over the iterations no probe needs (:mod:`flortrain.runtime.spans`)."""
        if self.probe_depth:
            return None
        if self.main is None or self.main[0] != main_id:
            self.main_enter(main_id)  # closes any block left open
        else:
            self.abort_frames()
        assert self.main is not None
        i = self.main[2] + 1
        self._end_segment(main_id, self.main[1], i)
        self.main[2] = i
        self.occurrences.clear()
        if self.materializer is not None:
            self.materializer.poll()
        boundary: Boundary | None = None
        scalars: str | None = None
        if self.mode == "record":
            if self.resume is not None and self.resume == (main_id, self.main[1], 0):
                self._replay_from_start(main_id)
            if self.replaying is not None and self._replayed_until(main_id, i):
                return None  # the killed run's row, output and checkpoints of it are kept
            self._time_iteration(main_id)
        if objects is not None and names is not None:
            if self.mode == "record":
                self._audit_iteration(main_id, i, objects, names, frame)
                boundary = (
                    self._resume_jump(main_id, i, objects, names)
                    if self.resume is not None
                    else None
                )
                if self.replaying is not None:
                    return boundary
                scalars = scalars_json(names)
                if boundary is None:
                    boundary = self._record_boundary(main_id, i, objects, names, values)
            else:
                boundary = self._jump(main_id, i, objects, names, values, frame)
        state = rng.capture()
        key = (main_id, self.main[1], self.main[2])
        t = time.perf_counter() - self.started
        seq = self.tee.seq if self.tee is not None else None
        self._iterations.append((*key, self._boundary_digests(state), None, scalars, t, seq))
        # Commit what was printed and the boundary states, at most once per commit interval: a
        # killed run loses at most that much, and a step-based main loop does not pay a
        # transaction per step.
        now = time.monotonic()
        if now - self._last_commit >= self.commit_interval:
            self._last_commit = now
            if self.tee is not None:
                self.tee.flush_entries()
            self._put_rows()
        return boundary

    def _audit_iteration(
        self, main_id: str, i: int, objects: Getters, names: Getters, frame: FrameType | None
    ) -> None:
        """The side-effect audit of the main loop's first iterations (``audit``): an iteration
        that changed state in place that the loop's changeset does not name makes its boundaries
        unusable (a jump over iterations would skip that change), so none is checkpointed."""
        last, self._main_audit = self._main_audit, None
        if last is not None and last[0] == main_id:
            self.audit_loop(main_id, last[1], last[2], objects, names)
        if (
            frame is not None
            and i < knobs.ALIAS_WATCH_INSTANCES
            and main_id not in self.unnamed_effects
        ):
            before = self.audit_image(main_id, frame)
            if before is not None:
                self._main_audit = (main_id, before, frame)

    def _watched(self, obj: Any) -> bool:
        """Whether the alias watch has this module, optimizer or data loader (the audit images
        one the registry does not know)."""
        return self.registry.id_of(obj) is not None

    def audit_image(self, loop_id: str, frame: FrameType) -> audit.Image | None:
        """The side-effect audit's before-image of what a loop's frame can reach (``audit``);
        None, with a warning, where taking it fails: the loop then goes unaudited."""
        try:
            return audit.Image(audit.roots(frame, self.project), watched=self._watched)
        except Exception as e:
            self.warn_once(
                f"{loop_id}.audit", f"loop {loop_id}: side-effect audit unavailable: {e}"
            )
            return None

    def audit_loop(
        self,
        loop_id: str,
        before: audit.Image,
        frame: FrameType | None,
        objects: Getters,
        names: Getters,
    ) -> None:
        """Compare a loop instance's before-image with the state now (``audit``). State changed in
        place that the changeset (``objects``, ``names``) does not reach stops the loop's
        checkpoints, and its main loop's boundaries, for the rest of the run."""
        torch = sys.modules.get("torch")
        state = {**resolve(objects), **resolve(names)}
        try:
            after = audit.Image(audit.roots(frame, self.project), watched=self._watched)
            optimizers = [o for _, o in self.registry.optimizers()]
            # an optimizer's groups are the alias watch's, however the script reaches them
            # (nanoGPT's `for param_group in optimizer.param_groups` leaves a name on the last)
            covered = audit.reachable([*state.values(), *(o.param_groups for o in optimizers)])
            trained = (
                audit.trained_addresses(
                    [m for _, m in self.registry.root_modules()], optimizers, torch
                )
                if torch is not None
                else set()
            )
            named = audit.named_slots(state.keys(), frame)
            changed = audit.changed(before, after, covered, trained, named)
        except Exception as e:
            self.warn_once(
                f"{loop_id}.audit", f"loop {loop_id}: side-effect audit unavailable: {e}"
            )
            return
        if not changed or loop_id in self.unnamed_effects:
            return
        listed = ", ".join(f"`{n}`" for n in changed[:3]) + (", ..." if len(changed) > 3 else "")
        self.unnamed_effect(
            loop_id, f"changes {listed} in place through code its changeset does not see into"
        )

    def unnamed_effect(self, loop_id: str, why: str) -> None:
        """A loop changes state its checkpoints would not hold (the audit, or an iterator it
        advances: ``audit.outside_iterator``): its instances and its main loop's iterations are
        not checkpointed from now on, and record says why."""
        self.unnamed_effects[loop_id] = why
        if self.main is not None:
            self._no_boundary.add(self.main[0])
        self.warn(
            f"loop {loop_id} {why}: it is not checkpointed from now on (its instances run again on"
            " replay), nor are its main loop's iterations"
        )

    def _put_rows(self) -> None:
        """Write the iteration and block rows held since the last commit."""
        self.store.put_blocks(self.run_id, self._blocks)
        self.store.put_iterations(self.run_id, self._iterations)
        self._blocks, self._iterations = [], []
        if isinstance(self.store, RecordSink):
            if self.files is not None and self.files.dirty:
                self.store.put_files(self.run_id, self.files.rows())
            if self.files is not None and self.files.pending:
                self.store.put_file_states(self.run_id, self.files.take_states())
            self.store.write_held()  # the checkpoints' rows and claims (`Store.hold_claims`)

    def _resume_jump(
        self, main_id: str, i: int, objects: Getters, names: Getters
    ) -> Boundary | None:
        """``record --resume``: at the resumed main loop's first iteration, restore the killed
        run's boundary checkpoint and continue recording from there; its output from then on is
        printed and captured again (the Tee was muted until here)."""
        assert self.resume is not None and self.main is not None
        target_main, entry, k = self.resume
        if main_id != target_main or self.main[1] != entry:
            return None
        pending, self._jump_pending = self._jump_pending, None
        b = pending[2] if pending is not None and pending[0] == main_id else None
        if b is None and main_id not in self._driven and i < k:
            b = self._load_boundary(main_id, entry, k, i)
        if b is None:
            raise RuntimeError(
                f"flortrain: cannot resume at {main_id} iteration {k}: its boundary checkpoint did not load"
            )
        b.restore(self, objects, names)
        b.jumped_to = k
        self.main[2] = k
        self.resume = None
        if self.resume_until > k:
            self.replaying = (main_id, entry, self.resume_until)
            self._main_audit = None  # the audit's image is of the state before the restore
        else:
            self._record_on()
        return b

    def _replay_from_start(self, main_id: str) -> None:
        """``record --resume`` of a run that committed no boundary: its main loop runs from its
        start as a replay would, up to the iteration it records from."""
        assert self.main is not None
        self.resume = None
        self.replaying = (main_id, self.main[1], self.resume_until)

    def _replayed_until(self, main_id: str, i: int) -> bool:
        """In a resumed record, whether iteration ``i`` is one it runs as a replay; at the
        iteration it records from, the record goes on from there."""
        assert self.replaying is not None and self.main is not None
        target, entry, until = self.replaying
        if main_id != target or self.main[1] != entry:
            return False
        if i < until:
            return True
        self.replaying = None
        self._main_audit = None
        self._boundary_t.pop(main_id, None)  # the iterations replayed are not training time
        self._record_on()
        return False

    def _record_on(self) -> None:
        """A resumed record has reached the iteration it records from: an ordinary record from
        here on, printing and capturing its output again (the Tee was muted until here)."""
        self.replay = None
        if self.tee is not None:
            self.tee.muted = False

    def replaying_here(self) -> bool:
        """Whether the current main-loop iteration is one a resumed record runs as a replay."""
        r = self.replaying
        return (
            r is not None
            and self.main is not None
            and (self.main[0], self.main[1]) == r[:2]
            and self.main[2] < r[2]
        )

    @property
    def held(self) -> float:
        """Seconds flortrain's own code held the training thread: block entries and exits (staging
        checkpoints included), iteration boundaries, the wait for the writer at the end."""
        return self.adaptive.held

    def iteration_elapsed(self) -> float:
        """Seconds of training since the current main-loop iteration began, net of what flortrain
        held (0 outside one)."""
        t = self._boundary_t.get(self.main[0]) if self.main is not None else None
        if t is None:
            return 0.0
        now = time.perf_counter()
        return now - t[0] - (self._held_at(now) - t[2])

    def _held_at(self, now: float) -> float:
        """:attr:`held` at ``now``, the hook in progress included."""
        return self.adaptive.held + (now - self._hold_t0 if self._hold_t0 is not None else 0.0)

    def _iteration_begins(self, main_id: str) -> None:
        now = time.perf_counter()
        self._boundary_t[main_id] = (now, time.process_time(), self._held_at(now))

    def _time_iteration(self, main_id: str, last_one: bool = False) -> None:
        """Account the main-loop iteration that just ended with the adaptive period: it is the
        unit of the boundary's Eq. 4 and the run's training time (``adaptive``'s budget), net of
        what flortrain held during it."""
        now, cpu = time.perf_counter(), time.process_time()
        last = self._boundary_t.pop(main_id, None) if last_one else self._boundary_t.get(main_id)
        held = self._held_at(now)
        if last is not None:
            self.adaptive.executed(main_id, now - last[0] - (held - last[2]), cpu - last[1])
            load = self.loop_load.setdefault(main_id, [0.0, 0.0])
            load[0] += now - last[0]
            load[1] += cpu - last[1]
        if not last_one:
            self._boundary_t[main_id] = (now, cpu, held)

    def _record_boundary(
        self, main_id: str, i: int, objects: Getters, names: Getters, values: tuple[str, ...]
    ) -> Boundary | None:
        """Checkpoint the boundary when Eq. 4 allows, the iteration being the unit of compute.
        The first boundary (the loop's entry state) is never needed: a replay is there anyway."""
        now = time.perf_counter()
        if i == 0 and main_id not in self._no_boundary:
            self._entry_identities(main_id, objects, names, values)
        if (
            i == 0
            or main_id in self._no_boundary
            or (self.boundary_every and i % self.boundary_every)
            or not self.adaptive.should_materialize(main_id)
        ):
            return None
        assert self.main is not None
        b = Boundary(self, main_id, values, i)
        b.key = f"{main_id}@{main_id}.{self.main[1]}.{i}#0"

        def afford(blocked: float, writer: float) -> bool:
            return self.adaptive.affords(main_id, blocked, writer)

        try:
            outcome = self.checkpoint(
                b.key, main_id, lambda: b._payload(self, objects, names), afford
            )
        except Declined:
            self.adaptive.declined(main_id, time.perf_counter() - now)
            self._iteration_begins(main_id)  # the capture is not the next iteration's
            return None
        except Exception as e:  # the iterations still run and record; only jumping is lost
            self._no_boundary.add(main_id)
            self.warn(
                f"main loop {main_id}: iteration boundaries not checkpointed: {b.failure(e, objects, names)}"
            )
            return None
        if self.files is not None:  # every file the run has written, as the iteration finds it
            self.files.checkpoint(b.key, 0)
        if b.observed is not None:
            self.identity_tables[main_id] = b.observed.now
        m = self.adaptive.materialized(main_id, time.perf_counter() - now, self.background)
        self.put_checkpointed(b.key, main_id, i, 0, BlockState.BOUNDARY, outcome, materialize_s=m)
        self._iteration_begins(main_id)  # the checkpoint is not the next iteration's
        return b

    def _entry_identities(
        self, main_id: str, objects: Getters, names: Getters, values: tuple[str, ...]
    ) -> None:
        """The objects below the main loop's state, and its names' objects, as it starts: what
        its first boundary tells replaced objects by (``identity``)."""
        try:
            b = Boundary(self, main_id, values)
            self.identity_tables[main_id] = identity.entry_table(
                b.roots(self, bound(objects)), bound(names)
            )
        except Exception as e:  # boundaries then judge every object new: right, only slower
            self.warn_once(
                f"{main_id}.identity", f"main loop {main_id}: cannot walk its state: {e}"
            )

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoint(
        self,
        key: str,
        block_id: str,
        payload: Callable[[], dict[str, Any]],
        afford: Afford | None = None,
    ) -> tuple[str, Any] | None:
        """Capture and stage a checkpoint. Returns ``("committed", digests)`` or ``("lost",
        reason)`` when the materializer finished it at once, None while it is pending (its row is
        updated when the writer reports). Raises when the state cannot be captured, and
        :class:`Declined` when ``afford`` turned down its estimated cost."""
        materializer = self.start_materializer()
        self._submitting, self._outcome = key, None
        self.background = 0.0
        if self._signal_injected is None:  # fault injection: a signal arrives mid-checkpoint, once
            self._signal_injected = int(knobs.injected("checkpoint-signal"))
            if self._signal_injected:
                os.kill(os.getpid(), self._signal_injected)
        try:
            self.background = materializer.submit(key, block_id, payload(), afford)
        finally:
            self._submitting = None
        return self._outcome

    def put_checkpointed(
        self,
        key: str,
        block_id: str,
        iteration: int,
        occurrence: int,
        state: BlockState,
        outcome: tuple[str, Any] | None,
        **costs: Any,
    ) -> None:
        """The row of a block instance (or boundary) just staged; ``state`` is what it becomes
        once committed (``checkpointed`` or ``boundary``)."""
        assert self.main is not None
        digests, note = None, None
        if outcome is None:
            self._pending[key] = state
            note = "checkpoint pending"
        elif outcome[0] == "committed":
            digests = outcome[1]
        else:
            note = f"checkpoint lost: {outcome[1]}"
        row_state = (
            state
            if state == BlockState.BOUNDARY or (outcome is not None and outcome[0] == "committed")
            else BlockState.RECORDED
        )
        if state != BlockState.BOUNDARY:
            self.counts[row_state] = self.counts.get(row_state, 0) + 1
        self.store.put_block(
            self.run_id,
            BlockRow(
                key,
                block_id,
                self.main[0],
                self.main[1],
                iteration,
                occurrence,
                row_state,
                note=note,
                state_sha=digests,
                **costs,
            ),
        )

    def untracked_writes(self) -> None:
        """The script writes tensors behind their version counters (``.data``): no shortcut may
        trust those counters (:mod:`flortrain.static.untracked`)."""
        self.track_versions = False
        tracker = getattr(self.materializer, "tracker", None)
        if tracker is not None:
            tracker.enabled = False
            tracker.clear()

    def _committed(self, key: str, digests: dict[str, str]) -> None:
        if key == self._submitting:
            self._outcome = ("committed", digests)
            return
        state = self._pending.pop(key, None)
        if state is None:
            return
        assert isinstance(self.store, RecordSink)
        self.store.mark_checkpointed(self.run_id, key, digests)
        if state != BlockState.BOUNDARY:
            self.counts[BlockState.RECORDED] = self.counts.get(BlockState.RECORDED, 0) - 1
            self.counts[BlockState.CHECKPOINTED] = self.counts.get(BlockState.CHECKPOINTED, 0) + 1

    def _lost(self, key: str, reason: str) -> None:
        if key == self._submitting:
            self._outcome = ("lost", reason)
            return
        if self._pending.pop(key, None) is not None:
            assert isinstance(self.store, RecordSink)
            self.store.note_block(self.run_id, key, f"checkpoint lost: {reason}")

    def iterate_main(self, main_id: str, iterable: Any) -> Iterator[Any]:
        """A replay's main ``for`` loop: the jump is decided before an item is taken, so the
        iterator skips the items of the iterations jumped over (``main_iteration`` restores)."""
        self._driven.add(main_id)
        it = iter(iterable)
        while True:
            skip = 0
            spans = self.replay.spans if self.replay is not None else None
            if (
                spans is not None
                and not self.probe_depth
                and self.main is not None
                and self.main[0] == main_id
            ):
                _, entry, last = self.main
                i = last + 1
                self._end_segment(main_id, entry, i)
                j = spans.target(main_id, entry, i, sys._getframe(1))
                self._end_segment(main_id, entry, i, j)
                b = self._load_boundary(main_id, entry, j, i) if j > i else None
                if b is not None:
                    self._jump_pending, skip = (main_id, j, b), j - i
            try:
                for _ in range(skip):
                    next(it)
                item = next(it)
            except StopIteration:
                self._jump_pending = None
                return
            yield item

    def _jump(
        self,
        main_id: str,
        i: int,
        objects: Getters,
        names: Getters,
        values: tuple[str, ...],
        frame: FrameType | None,
    ) -> Boundary | None:
        assert self.main is not None and self.replay is not None
        spans = self.replay.spans
        if spans is None:
            return None
        entry = self.main[1]
        pending, self._jump_pending = self._jump_pending, None
        if pending is not None and pending[0] == main_id:
            j, b = pending[1], pending[2]
        elif main_id in self._driven:
            return None  # the generator decided not to jump
        else:
            j = spans.target(main_id, entry, i, frame)
            self._end_segment(main_id, entry, i, j)
            found = self._load_boundary(main_id, entry, j, i) if j > i else None
            if found is None:
                return None
            b = found
        b.restore(self, objects, names)
        self.restore_files(f"{main_id}@{main_id}.{entry}.{j}#0")
        b.jumped_to = j
        self.main[2] = j
        self.store.put_jump(self.run_id, main_id, entry, i, j)
        self.counts["jumped"] = self.counts.get("jumped", 0) + j - i
        return b

    def restore_files(self, key: str) -> None:
        """A replay restored checkpoint ``key``: the files the record had written are put back as
        that checkpoint found them (``runtime/files.py``)."""
        if self.replay is not None and self.replay.files:
            try:
                put_back(self.replay.files.get(key, ()), self.store.read_object)
            except OSError as e:
                self.warn_once(
                    f"files:{key}", f"files not put back as checkpoint {key} found them: {e}"
                )

    def _load_boundary(self, main_id: str, entry: int, j: int, i: int) -> Boundary | None:
        """Boundary ``j`` of the main loop, loaded for a jump from iteration ``i``."""
        assert self.replay is not None
        key = f"{main_id}@{main_id}.{entry}.{j}#0"
        ck = self.replay.checkpoints.get(key)
        data = self.store.read_blob(ck) if ck is not None else None
        if data is None:
            self.warn_once(
                f"corrupt:{key}", f"boundary checkpoint {key} is missing or corrupt; running on"
            )
            return None
        b = Boundary(self, main_id, ())
        b.at = i
        problem = b.load(self, data)
        if problem is not None:
            self.warn_once(
                f"unusable:{main_id}", f"boundary checkpoint {key} {problem}; running on"
            )
            return None
        return b

    def note_initial_streams(self) -> None:
        """Remember each global stream's state before the script runs: it comes from OS entropy
        (torch's, numpy's and ``random``'s unseeded state differ in every process)."""
        self._initial_digests = rng.digest_map(rng.capture())

    def _boundary_digests(self, state: dict[str, Any]) -> str:
        """Per-stream digests at a main-loop boundary, with a stream the script has not touched
        since the process started marked ``untouched``: its entropy-derived state differs between
        any two processes, so it is not evidence of anything (``diff`` does not compare it). A
        stream first seen here (imported during the run) counts its first state as initial."""
        out = {}
        for stream, digest in rng.digest_map(state, self._digest_memo).items():
            initial = self._initial_digests.setdefault(stream, digest)
            out[stream] = rng.UNTOUCHED if digest == initial else digest
        return rng.dumps_digests(out)

    def main_exit(self, main_id: str) -> None:
        if self.probe_depth:
            return
        self.abort_frames()
        if self._segment_here() is not None:
            self._mark("exit")
        if self.mode == "record":
            self._time_iteration(main_id, last_one=True)
            self.adaptive.loop_ended(main_id)
        self.main = None

    # -- blocks an exception left ----------------------------------------------------------------
    def close_left_frames(self) -> None:
        """Close the open blocks whose loop control has left without ``end()`` (an exception
        caught outside the loop), so what is printed next is not charged to them. Checked when a
        block opens and at every write; only the thread running the loops can tell."""
        if not self.frames or self.frames[0].thread != threading.get_ident():
            return
        on_stack: set[int] = set()
        f: FrameType | None = sys._getframe(1)
        while f is not None:
            on_stack.add(id(f))
            f = f.f_back
        for i, frame in enumerate(self.frames):
            if frame.left(on_stack):
                for gone in reversed(self.frames[i:]):
                    gone.abort(self)
                del self.frames[i:]
                return

    def abort_frames(self) -> None:
        """A main-loop boundary: any block still open was left by an exception."""
        for gone in reversed(self.frames):
            gone.abort(self)
        self.frames.clear()

    def next_key(self, block_id: str) -> str:
        assert self.main is not None
        occ = self.occurrences.get(block_id, 0)
        self.occurrences[block_id] = occ + 1
        m, entry, it = self.main
        return f"{block_id}@{m}.{entry}.{it}#{occ}"

    # -- blocks ------------------------------------------------------------------------------------
    def initial_state(self, block: SkipBlock) -> State:
        if self.mode == "record" and not self.replaying_here():
            return State.RECORD
        assert self.replay is not None
        if block.id in self.replay.execute and not self.before_segment():
            return State.EXECUTE
        ck = self.replay.checkpoints.get(block.key)
        if ck is None:
            return State.EXECUTE
        data = self.store.read_blob(ck)
        if data is None:
            self.warn_once(
                f"corrupt:{block.key}",
                f"checkpoint {block.key} is missing or corrupt; re-executing it",
            )
            return State.EXECUTE
        problem = block.load(self, data)
        if problem is not None:
            self.warn_once(
                f"unusable:{block.id}", f"checkpoint {block.key} {problem}; re-executing it"
            )
            return State.EXECUTE
        return State.SKIP

    def block_done(
        self,
        block: SkipBlock,
        state: BlockState,
        digests: dict[str, str] | None = None,
        **costs: Any,
    ) -> None:
        self.counts[state] = self.counts.get(state, 0) + 1
        if self.replaying_here():
            return  # the killed run's row of the instance is kept
        assert self.main is not None
        m, entry, it = self.main
        occ = int(block.key.rsplit("#", 1)[1])
        # written with the iterations, once per commit interval: the row describes the run, and
        # no checkpoint hangs on it
        self._blocks.append(
            BlockRow(block.key, block.id, m, entry, it, occ, state, state_sha=digests, **costs)
        )

    def region(self) -> str | None:
        for f in self.frames:
            if f.state is not State.PASSTHROUGH:
                return f.key
        return None

    def context(self) -> tuple[str | None, int | None, int | None, str | None, bool]:
        self.close_left_frames()
        if self.main is None:
            return None, None, None, None, self.probe_depth > 0
        return self.main[0], self.main[1], self.main[2], self.region(), self.probe_depth > 0

    # -- library augmentation and the registry -----------------------------------------------------
    def module_tensors(self) -> list[Any]:
        """The parameters and buffers of every live module."""
        return [t for _, m in self.registry.root_modules() for t in (*m.parameters(), *m.buffers())]

    def live_object(self, sha: str, nbytes: int) -> memoryview | None:
        """A checkpoint's tensor that was unchanged since the main loop's entry when it was
        taken is not in the store, only named by the hash of its bytes (``ChangeTracker.enter``):
        the replay's prologue made it again. Its bytes are those of the live module tensor of that
        size that hashes to that name, or None (the checkpoint then cannot be used, and what it
        would have restored runs again). A tensor is hashed once per version. The view is of the
        live tensor: the loader copies it at once."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        for t in self.module_tensors():
            if t.nbytes != nbytes:
                continue
            try:
                version = t._version
            except RuntimeError:
                continue
            known = self._live_names.get(id(t))
            if known is None or known[0] is not t or known[1] != version or versions.untrusted(t):
                known = self._live_names[id(t)] = (t, version, tensor_name(t, torch))
            if known[2] == sha:
                return tensor_bytes(t, torch)
        return None

    def watchable(self) -> Iterator[tuple[int, Any]]:
        yield from self.registry.root_modules()
        yield from self.registry.optimizers()

    def augmentation(self, block_id: str, objs: list[Any]) -> list[tuple[str, int, Any]]:
        """Objects a block changes beyond its named changeset: the modules an optimizer updates,
        the optimizer a scheduler drives, optimizers that stepped, data loaders iterated (for
        their generators), and learned aliases."""
        torch = sys.modules.get("torch")
        if torch is None:
            return []
        covered = {id(o) for o in objs}
        out: list[tuple[str, int, Any]] = []

        def add(obj: Any) -> None:
            if id(obj) in covered:
                return
            i = self.registry.id_of(obj)
            if i is None:
                return
            covered.add(id(obj))
            kind = (
                "module"
                if isinstance(obj, torch.nn.Module)
                else "optimizer"
                if isinstance(obj, torch.optim.Optimizer)
                else "loader"
            )
            out.append((kind, i, obj))
            if isinstance(obj, torch.optim.Optimizer):
                for _, m in self.registry.modules_of(obj):
                    add(m)
            elif (
                kind == "loader"
                and self.mode == "record"
                and getattr(obj, "persistent_workers", False)
            ):
                self.warn_once(f"persistent#{i}", _persistent_workers(block_id, i))

        def expand(obj: Any) -> None:
            if isinstance(obj, torch.optim.Optimizer):
                for _, m in self.registry.modules_of(obj):
                    add(m)
            elif hasattr(obj, "optimizer") and isinstance(obj.optimizer, torch.optim.Optimizer):
                add(obj.optimizer)

        for o in objs:
            expand(o)
        for i in sorted(self.registry.stepped | self.registry.iterated):
            add(self.registry.get(i))
        for i in sorted(self.learned.get(block_id, ())):
            obj = self.registry.get(i)
            if obj is not None:
                add(obj)
        return out

    def learn(self, block_id: str, registry_id: int, type_name: str) -> None:
        if registry_id not in self.learned.setdefault(block_id, set()):
            self.learned[block_id].add(registry_id)
            self.warn(
                f"block {block_id} changed a {type_name} (registry #{registry_id}) that its changeset"
                " does not name; it is checkpointed with the block from now on"
            )

    # -- messages and shutdown ---------------------------------------------------------------------
    def warn(self, msg: str) -> None:
        print(f"flortrain: {msg}", file=sys.__stderr__, flush=True)

    def warn_once(self, tag: str, msg: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            self.warn(msg)

    @contextlib.contextmanager
    def holding(self, defer_signals: bool = True) -> Iterator[None]:
        """Time flortrain's own code on the training thread (:attr:`held`), with garbage
        collection deferred until it returns. A full collection is the cost of the script's heap,
        plain or recorded (0.2 s each in a nanoGPT-shaped script); one that fell into a
        checkpoint would be charged to it as M, and Eq. 4 and the run's budget would then refuse
        checkpoints for the rest of the run. It runs at the script's next allocation instead.
        The script's signal handlers are deferred too (:mod:`~flortrain.runtime.signals`): what
        one raises reaches the script as the hook returns, not flortrain's code half-way."""
        if self._hold_t0 is not None:  # within a hook already: its time is counted there
            yield
            return
        collecting = gc.isenabled()
        gc.disable()
        self._hold_t0 = time.perf_counter()
        deferred = None
        try:
            deferred = signals.defer(self._pid) if defer_signals else None
            yield
        finally:
            self.adaptive.hold(time.perf_counter() - self._hold_t0)
            self._hold_t0 = None
            if collecting:
                gc.enable()
            signals.resume(deferred)  # last: a handler that raises leaves nothing undone here

    def flush(self) -> None:
        """The script ended: hand the writer's backlog to the launcher where there is one (the
        wait then overlaps this process's exit, ``flortrain/launcher.py``), else wait for it.
        Signals are not deferred here: a Ctrl-C during a long wait for the writer stops it."""
        with self.holding(defer_signals=False):
            if self.materializer is not None:
                t0 = time.perf_counter()
                self.handed = self.materializer.hand_off()
                if self.handed is None:
                    self.materializer.flush()
                self.exit_wait += time.perf_counter() - t0
        if self.tee is not None:
            self.tee.close_capture()
        self._put_rows()

    def handoff(self) -> dict[str, Any] | None:
        """What the launcher needs to commit the checkpoints handed over (None: nothing was, or
        the store failed and nothing more is claimed): their keys in order, and what each
        block row becomes once its checkpoint is committed (:meth:`_committed`)."""
        if self.handed is None or not isinstance(self.store, RecordSink) or self.store.failed:
            return None
        writer, keys = self.handed
        return {
            "root": str(self.store.root),
            "run_id": self.run_id,
            "writer": writer,
            "inflight": keys,
            "pending": {k: self._pending[k] for k in keys if k in self._pending},
        }


#: The active session of this process, set by the runner.
current: Session | None = None


def _persistent_workers(block_id: str, registry_id: int) -> str:
    """Why a data loader whose workers outlive an epoch can make a replay differ. Its workers'
    random streams (seeded once, when they start) advance from epoch to epoch in processes no
    checkpoint reaches. A replay that restores an epoch's state and then runs the next one starts
    fresh workers, whose streams are where the record's were at the first epoch: augmentations
    drawn there differ. ``diff`` reports it; with ``persistent_workers=False`` every epoch's
    workers are seeded from the main process's stream, which checkpoints hold."""
    return (
        f"block {block_id} iterates a DataLoader (registry #{registry_id}) with persistent_workers=True:"
        " its workers' random streams carry over between epochs, and no checkpoint holds them. A"
        " replay that runs an epoch after restoring an earlier one may draw different data there"
        " (`flortrain diff` reports it); persistent_workers=False replays exactly"
    )
