"""A record's session: time the main loop's iterations, watch and audit what loops change, and
checkpoint block instances and main-loop boundaries when the adaptive period says so.

A resumed record (``record --resume``) restores the killed run's latest boundary and runs the
iterations from there up to the one it records from as a replay would (:attr:`replaying`).
Slightly above 500 lines: the record's hooks, each short; the checkpointing they call is in
:mod:`flortrain.checkpoint`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from flortrain import knobs
from flortrain.checkpoint import materializer as _materializer
from flortrain.checkpoint.interface import Callbacks, Materializer, Prepared
from flortrain.checkpoint.key import CheckpointKey
from flortrain.runtime import audit, identity
from flortrain.runtime.audit import Image
from flortrain.runtime.boundaries import MainBoundary, scalars_json
from flortrain.runtime.checkpointable import Getters, bound, resolve
from flortrain.runtime.host import Instance, Outcome, State
from flortrain.runtime.jumping import JumpingSession
from flortrain.runtime.session import IterationStart, Step
from flortrain.store.db import Store
from flortrain.store.records import BlockRow, BlockState


@dataclass
class RecordSession(JumpingSession):
    store: Store
    materializer: Materializer | None = None
    #: when the current iteration of each main loop began: wall, CPU, and :attr:`held` then
    _boundary_t: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    #: main loop id -> [wall, CPU] seconds of its iterations in this process: how many cores the
    #: loop keeps busy, which a parallel replay's planner weighs against the machine's
    loop_load: dict[str, list[float]] = field(default_factory=dict)
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
    _main_audit: tuple[str, audit.Image, FrameType] | None = None
    boundary_every: int = field(default_factory=knobs.boundary_every)
    _submitting: str | None = None
    _outcome: Outcome = None
    _pending: dict[str, BlockState] = field(
        default_factory=dict
    )  # checkpoints staged, not yet committed
    #: ``record --resume``: the iteration it records from; those from the boundary restored up
    #: to it run as in a replay (:attr:`replaying`)
    resume_until: int = 0
    #: (main id, entry, iteration): a resumed record runs its main loop's iterations before
    #: that one as a replay would, its blocks restored and nothing recorded or printed
    replaying: tuple[str, int, int] | None = None
    _signal_injected: int | None = None  # ``FLORTRAIN_INJECT=checkpoint-signal=N``, once read
    #: the writer's pid and the keys it still held when the script ended, handed to the launcher
    handed: tuple[int, list[str]] | None = None

    def start_materializer(self) -> Materializer:
        """The materializer, started now: ``record`` starts it before the script runs, so the
        writer is forked while the process is small and shares none of the model's pages."""
        if self.materializer is None:
            self.materializer = _materializer.make(
                self.store,
                self.run_id,
                Callbacks(self._committed, self._lost, self.warn),
                self.track_versions,
            )
        return self.materializer

    # -- the main loop ---------------------------------------------------------------------------
    def _entered(self, main_id: str, entry: int) -> None:
        if self.materializer is not None:
            self.materializer.loop_entered(self.module_tensors())
        super()._entered(main_id, entry)

    def _iteration(self, at: IterationStart) -> Step:
        """Time the iteration that ended; with a boundary state, audit the one before, and
        checkpoint this boundary when Eq. 4 allows (or, resuming, restore the killed run's)."""
        main_id, i, objects, names = at.main_id, at.i, at.objects, at.names
        assert self.main is not None
        if self.materializer is not None:
            self.materializer.poll()
        if self.resume is not None and self.resume == (main_id, self.main[1], 0):
            self._replay_from_start(main_id)
        if self.replaying is not None and self._replayed_until(main_id, i):
            return None, None, False  # the killed run's row, output and checkpoints of it are kept
        self._time_iteration(main_id)
        if objects is None or names is None:
            return None, None, True
        self._audit_iteration(main_id, i, objects, names, at.frame)
        boundary = (
            self._resume_jump(main_id, i, objects, names) if self.resume is not None else None
        )
        if self.replaying is not None:
            return boundary, None, False
        scalars = scalars_json(names)
        if boundary is None:
            boundary = self._record_boundary(main_id, i, objects, names, at.values)
        return boundary, scalars, True

    def _exited(self, main_id: str) -> None:
        super()._exited(main_id)
        self._time_iteration(main_id, last_one=True)
        self.adaptive.loop_ended(main_id)

    def initial_state(self, block: Instance) -> State:
        return State.RECORD if not self.replaying_here() else super().initial_state(block)

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
        self, loop_id: str, before: Image, frame: FrameType | None, objects: Getters, names: Getters
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

    def _resume_jump(
        self, main_id: str, i: int, objects: Getters, names: Getters
    ) -> MainBoundary | None:
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
        self.note_streams_before_restore()
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
        if self.forwarded:
            lines = ", ".join(str(line) for line in sorted(self.forwarded))
            self.warn(
                f"fast-forward left out {sum(self.forwarded.values())} statement(s) at line(s)"
                f" {lines} of the iterations it replayed"
            )
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

    def iteration_elapsed(self) -> float:
        """Seconds of training since the current main-loop iteration began, net of what flortrain
        held (0 outside one)."""
        t = self._boundary_t.get(self.main[0]) if self.main is not None else None
        if t is None:
            return 0.0
        now = time.perf_counter()
        return now - t[0] - (self._held_at(now) - t[2])

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
    ) -> MainBoundary | None:
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
        b = MainBoundary(self, main_id, values, i, self.identity_tables.get(main_id))
        b.key = str(CheckpointKey.boundary(main_id, self.main[1], i))
        try:
            prepared = self.prepare(b.key, main_id, lambda: b._payload(self, objects, names))
            # a boundary's cost varies most: the period decides again on the estimate
            est = prepared.estimate
            if est is not None and not self.adaptive.affords(main_id, est.blocked_s, est.writer_s):
                self.adaptive.declined(main_id, time.perf_counter() - now)
                self._iteration_begins(main_id)  # the capture is not the next iteration's
                return None
            outcome = self.stage(prepared)
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
        self.put_checkpointed(b.key, main_id, BlockState.BOUNDARY, outcome, materialize_s=m)
        self._iteration_begins(main_id)  # the checkpoint is not the next iteration's
        return b

    def _entry_identities(
        self, main_id: str, objects: Getters, names: Getters, values: tuple[str, ...]
    ) -> None:
        """The objects below the main loop's state, and its names' objects, as it starts: what
        its first boundary tells replaced objects by (``identity``)."""
        try:
            b = MainBoundary(self, main_id, values)
            self.identity_tables[main_id] = identity.entry_table(
                b.roots(self, bound(objects)), bound(names)
            )
        except Exception as e:  # boundaries then judge every object new: right, only slower
            self.warn_once(
                f"{main_id}.identity", f"main loop {main_id}: cannot walk its state: {e}"
            )

    # -- checkpoints -------------------------------------------------------------------------------

    def checkpoint(
        self, key: str, block_id: str, payload: Callable[[], dict[str, Any]]
    ) -> tuple[str, Any] | None:
        """Capture and stage a checkpoint, whatever it costs (a block's, which the period
        decided on before capturing it). See :meth:`stage`."""
        return self.stage(self.prepare(key, block_id, payload))

    def prepare(self, key: str, block_id: str, payload: Callable[[], dict[str, Any]]) -> Prepared:
        """Capture a checkpoint and lay it out: its :class:`Estimate` is what the period
        decides on before anything is staged. Raises when the state cannot be captured."""
        materializer = self.start_materializer()
        self.background = 0.0
        if self._signal_injected is None:  # fault injection: a signal arrives mid-checkpoint, once
            self._signal_injected = int(knobs.injected("checkpoint-signal"))
            if self._signal_injected:
                os.kill(os.getpid(), self._signal_injected)
        return materializer.prepare(key, block_id, payload())

    def stage(self, prepared: Prepared) -> tuple[str, Any] | None:
        """Stage a prepared checkpoint. Returns ``("committed", digests)`` or ``("lost",
        reason)`` when the materializer finished it at once, None while it is pending (its row is
        updated when the writer reports)."""
        materializer = self.start_materializer()
        self._submitting, self._outcome = prepared.key, None
        try:
            self.background = materializer.stage(prepared)
        finally:
            self._submitting = None
        return self._outcome

    def put_checkpointed(
        self,
        key: str,
        block_id: str,
        state: BlockState,
        outcome: Outcome,
        **costs: Any,
    ) -> None:
        """The row of a block instance (or boundary) just staged, in the current main-loop
        iteration; ``state`` is what it becomes once committed (``checkpointed`` or
        ``boundary``)."""
        assert self.main is not None
        occurrence = CheckpointKey.parse(key).occurrence
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
                self.main[2],
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
        self.store.mark_checkpointed(self.run_id, key, digests)
        if state != BlockState.BOUNDARY:
            self.counts[BlockState.RECORDED] = self.counts.get(BlockState.RECORDED, 0) - 1
            self.counts[BlockState.CHECKPOINTED] = self.counts.get(BlockState.CHECKPOINTED, 0) + 1

    def _lost(self, key: str, reason: str) -> None:
        if key == self._submitting:
            self._outcome = ("lost", reason)
            return
        if self._pending.pop(key, None) is not None:
            self.store.note_block(self.run_id, key, f"checkpoint lost: {reason}")

    def _persistent_loader(self, block_id: str, registry_id: int, loader: Any) -> None:
        # a loader under ``--deterministic`` keys every example's numbers: nothing carries over
        keyed = getattr(getattr(loader, "dataset", None), "keyed_examples", False)
        if getattr(loader, "persistent_workers", False) and not keyed:
            self.warn_once(f"persistent#{registry_id}", _persistent_workers(block_id, registry_id))

    def _drain_writer(self) -> None:
        if self.materializer is not None:
            t0 = time.perf_counter()
            self.handed = self.materializer.hand_off()
            if self.handed is None:
                self.materializer.flush()
            self.exit_wait += time.perf_counter() - t0

    def handoff(self) -> dict[str, Any] | None:
        """What the launcher needs to commit the checkpoints handed over (None: nothing was, or
        the store failed and nothing more is claimed): their keys in order, and what each
        block row becomes once its checkpoint is committed (:meth:`_committed`)."""
        if self.handed is None or self.store.failed:
            return None
        writer, keys = self.handed
        return {
            "root": str(self.store.root),
            "run_id": self.run_id,
            "writer": writer,
            "inflight": keys,
            "pending": {k: self._pending[k] for k in keys if k in self._pending},
        }


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
