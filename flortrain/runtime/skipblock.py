"""The SkipBlock: one memoized loop instance and its state machine.

========== =====================================================================
RECORD     execute; at the end, maybe materialize changeset + RNG (Eq. 4)
SKIP       replay: iterate nothing; at the end, restore the checkpoint in place
EXECUTE    replay: run the loop (it is probed, or this instance has no checkpoint)
PASSTHROUGH outside a main-loop iteration, nested in another block, or run by a probe: plain code
========== =====================================================================

Pseudoresume (a replay worker starting mid-run) is SKIP for every instance before its segment,
whatever the probes, but in the iteration just before it, where the blocks probes make execute
run to bind what the segment's first probe may read; the main-loop context decides it.
"""

from __future__ import annotations

import sys
import threading
import time
from types import FrameType
from typing import Any

from flortrain import knobs
from flortrain.checkpoint import versions
from flortrain.checkpoint.blob import digests
from flortrain.checkpoint.fingerprint import clone_state, fingerprint, snapshot_equal
from flortrain.checkpoint.kinds import Unrestorable
from flortrain.runtime import audit, identity
from flortrain.runtime.checkpointable import Checkpointable, Getters, bound
from flortrain.runtime.host import BlockHost, CheckpointHost, State
from flortrain.static.plan import outside_iterator
from flortrain.store.records import BlockState

#: The row note of a futile instance (``AdaptivePeriod.futile``), which the replay plan shows as
#: the reason a block's other instances execute: without it a user sees a loop checkpointed once
#: in hundreds of instances and no reason why.
FUTILE_NOTE = "it runs faster than a checkpoint of it would restore"


class SkipBlock(Checkpointable):
    """One loop instance. ``frame`` is the user's frame that runs the loop (the hook that opens
    the block passes its caller's); ``span`` the loop's lines in it: an exception that leaves the
    loop never reaches ``end()``, and the host tells by the frame having moved on."""

    def __init__(
        self,
        host: BlockHost | None,
        block_id: str,
        span: tuple[int, int] = (0, 0),
        detach_ok: tuple[str, ...] = (),
        objects: Getters | None = None,
        names: Getters | None = None,
        unchecked: tuple[str, ...] = (),
        frame: FrameType | None = None,
    ) -> None:
        super().__init__(block_id, detach_ok, host.registry.count() if host is not None else 0)
        self.host = host
        #: rebound names restored but not compared with the record's checkpoint (clock readings)
        self.unchecked = unchecked
        self.span = span
        self.frame = frame
        self.pyframe: FrameType | None = frame if host is not None and span[0] else None
        self.thread = threading.get_ident()
        self.aborted = False
        self.files_seq = 0  # record: the write events before the instance began (``files``)
        self.watch: dict[int, Any] | None = None
        self.light: dict[int, Any] | None = None  # the light watch's before-tokens
        self.audit: audit.Image | None = None  # the side-effect audit's before-image
        self.entry: dict[str, Any] | None = None
        #: an instance the period will not checkpoint whatever happens (``AdaptivePeriod.futile``):
        #: nothing below its changeset is walked or watched
        self.futile = False
        # nested, outside the main loop, or opened by a probe (`print(evaluate(train_data))`):
        # plain code, the host decides (a probe's loops must not take the key, and so the
        # checkpoint, of the script's own instance that follows it)
        self.state = host.open_block(self) if host is not None else State.PASSTHROUGH
        if host is not None and self.state is State.RECORD:
            self._prepare(host, objects, names)
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()

    def _prepare(self, host: BlockHost, objects: Getters | None, names: Getters | None) -> None:
        """A recorded instance opens: the period's verdict, and the walks and watches that tell
        what it changed (none for a futile one)."""
        host.registry.reset_block()
        self.futile = host.adaptive.futile(self.id)
        self.files_seq = host.files.seq if host.files is not None else 0
        if self.futile:
            return
        roots = self._entry_roots(host, objects)
        self.entry = self._identities(host, roots, names)
        costs = host.adaptive.costs.get(self.id)
        if costs is None or costs.n < knobs.ALIAS_WATCH_INSTANCES:
            self.watch = self._snapshot_watched(host)
            if self.frame is not None:
                self.audit = host.audit_image(self.id, self.frame)
        elif host.track_versions:
            self.light = self._light_watch(host, roots)

    def _entry_roots(self, session: BlockHost, objects: Getters | None) -> dict[str, Any] | None:
        """The objects the state restores in place as the instance starts (:meth:`roots`), taken
        once for the identity walk and the light watch; None when they cannot be had, and the
        instance is then not checkpointed."""
        if objects is None:
            return None
        try:
            return self.roots(session, bound(objects))
        except Exception as e:
            session.warn_once(f"{self.id}.identity", f"block {self.id}: cannot walk its state: {e}")
            return None

    def _identities(
        self, session: BlockHost, roots: dict[str, Any] | None, names: Getters | None
    ) -> dict[str, Any] | None:
        """The objects below the changeset, and the rebound names' objects, as the instance
        starts (``identity``); None when they cannot be walked, and the instance is then not
        checkpointed."""
        if roots is None:
            return None
        try:
            return identity.entry(roots, bound(names or {}))
        except Exception as e:
            session.warn_once(f"{self.id}.identity", f"block {self.id}: cannot walk its state: {e}")
            return None

    def marks(self, s: CheckpointHost) -> identity.InstanceMarks | identity.BoundaryMarks | None:
        if self.state is not State.RECORD:
            return None  # a replay's executed instance: digests only, nothing is restored
        if self.entry is None:
            raise Unrestorable("its state at the instance's start is unknown")
        return identity.InstanceMarks(self.entry)

    def _light_watch(
        self, session: BlockHost, roots: dict[str, Any] | None
    ) -> dict[int, Any] | None:
        """After the alias watch's instances, a light watch on every later one: a token of the
        parameters and buffers (memory and version counter) of each live module the block's
        checkpoints do not hold. A loop that starts changing one late (a target network synced
        from epoch 2 on through ``vector_to_parameters``) then has it learned, as the alias watch
        would have, instead of restoring without it. The cost is
        a few tenths of a microsecond per tensor of such modules, none for the rest."""
        covered = {id(o) for o in (roots or {}).values()}  # unknown roots: watch every module
        try:
            return {
                i: _light_token(m)
                for i, m in session.registry.root_modules()
                if id(m) not in covered
            }
        except Exception as e:
            session.warn_once(f"{self.id}.watch", f"block {self.id}: alias watch unavailable: {e}")
            return None

    def _learn_light(self, s: BlockHost, objects: Getters) -> None:
        assert self.light is not None
        covered = {id(o) for o in self.roots(s, bound(objects)).values()}
        for i, before in self.light.items():
            obj = s.registry.get(i)
            if obj is not None and id(obj) not in covered and _light_token(obj) != before:
                s.learn(self.id, i, type(obj).__name__)

    def _snapshot_watched(self, session: BlockHost) -> dict[int, Any] | None:
        """Before-images of live modules and optimizers for the alias watch. A failure here is a
        flortrain limitation, never the user's problem: training goes on unwatched, with a
        warning (``diff`` remains the check)."""
        try:
            watched = list(session.watchable())
            owned = _module_parameters(watched)
            return {i: _watched_state(session, o, owned) for i, o in watched}
        except Exception as e:
            session.warn_once(f"{self.id}.watch", f"block {self.id}: alias watch unavailable: {e}")
            return None

    # -- what the instrumented loop calls ------------------------------------------------------
    def iterate(self, iterable: Any) -> Any:
        if self.state is State.SKIP:
            return iter(())
        s, frame = self.host, self.frame
        if (
            self.state is State.RECORD
            and s is not None
            and frame is not None
            and self.id not in s.unnamed_effects
        ):
            try:
                name = audit.outside_iterator(iterable, frame)
            except Exception as e:
                s.warn_once(
                    f"{self.id}.audit", f"loop {self.id}: side-effect audit unavailable: {e}"
                )
            else:
                if name is not None:
                    s.unnamed_effect(
                        self.id,
                        outside_iterator(name),
                    )
        return iterable

    def live(self) -> bool:
        return self.state is not State.SKIP

    def left(self, on_stack: set[int]) -> bool:
        """Whether control has left this loop without reaching ``end()``: its frame is gone from
        the stack, or runs a line outside the loop (an ``except`` after it)."""
        f = self.pyframe
        if f is None:
            return False
        return id(f) not in on_stack or not self.span[0] <= f.f_lineno <= self.span[1]

    def abort(self, s: BlockHost) -> None:
        """Close an instance an exception carried out of its loop. Nothing is checkpointed (the
        state is mid-loop); on replay the instance re-executes, and raises the same way. Its
        output region is recorded as executed so ``diff`` still compares what it printed."""
        self.aborted = True
        self.pyframe = self.frame = None
        elapsed = time.perf_counter() - self.t0
        if self.state is State.RECORD:
            s.block_done(self, BlockState.RECORDED, compute_s=elapsed, note="left by an exception")
        elif self.state is State.EXECUTE:
            s.block_done(self, BlockState.EXECUTED, compute_s=elapsed)

    def end(self, objects: Getters, names: Getters) -> bool:
        s = self.host
        self.pyframe = None
        if s is None or self.aborted:
            return False
        try:
            with s.holding():
                return self._end(s, objects, names)
        finally:
            self.frame = None  # the user's frame lives no longer than the instance

    def _end(self, s: BlockHost, objects: Getters, names: Getters) -> bool:
        s.close_block(self)
        if self.state is State.RECORD:
            self._record(s, objects, names)
            self.entry = None  # the objects it holds live no longer than the instance
            return False
        if self.state is State.SKIP:
            t0 = time.perf_counter()
            self.restore(s, objects, names)
            s.restore_files(self.key)
            s.block_done(self, BlockState.SKIPPED, restore_s=time.perf_counter() - t0)
            return True
        if self.state is State.EXECUTE:
            compute = time.perf_counter() - self.t0
            s.block_done(
                self,
                BlockState.EXECUTED,
                compute_s=compute,
                digests=self._replay_digests(s, objects, names),
            )
        return False

    def _replay_digests(
        self, s: BlockHost, objects: Getters, names: Getters
    ) -> dict[str, str] | None:
        """Digests of the state this executed instance produced, where the record checkpointed the
        same instance: ``diff`` compares them part by part. A clock reading (``unchecked``) is left
        out: the replay read the clock anew, and ``diff`` compares only parts both runs have."""
        if not s.recorded(self.key):
            return None
        try:
            parts = digests(self._payload(s, objects, names))
        except Exception:  # what cannot be captured cannot be compared; the record had it
            return None
        return {
            k: v
            for k, v in parts.items()
            if not (k.startswith("names:") and k[6:] in self.unchecked)
        }

    # -- record ----------------------------------------------------------------------------------
    def _record(self, s: BlockHost, objects: Getters, names: Getters) -> None:
        compute = time.perf_counter() - self.t0
        # a recorded block runs inside a main-loop iteration (else it is PASSTHROUGH), whose time
        # is the run's: the block's own is part of it
        s.adaptive.executed(self.id, compute, time.process_time() - self.cpu0, outer=False)
        if self.watch is not None or self.light:
            try:
                if self.watch is not None:
                    self._learn_aliases(s, objects)
                else:
                    self._learn_light(s, objects)
            except Exception as e:
                s.warn_once(f"{self.id}.watch", f"block {self.id}: alias watch unavailable: {e}")
        if self.audit is not None:
            before, self.audit = self.audit, None
            s.audit_loop(self.id, before, self.frame, objects, names)
        if self.id in s.unnamed_effects:  # changes state its checkpoints would not hold
            s.block_done(
                self, BlockState.RECORDED, compute_s=compute, note=s.unnamed_effects[self.id]
            )
            return
        if self.futile:
            s.block_done(self, BlockState.RECORDED, compute_s=compute, note=FUTILE_NOTE)
            return
        if not s.adaptive.should_materialize(self.id, s.iteration_elapsed()):
            s.block_done(self, BlockState.RECORDED, compute_s=compute)
            return
        # M_i of Eq. 4 is all the time training is held up: capturing the state and staging it
        # (the writer hashes and writes it in the background)
        t0 = time.perf_counter()
        try:
            outcome = s.checkpoint(self.key, self.id, lambda: self._payload(s, objects, names))
        except Exception as e:  # any failure to checkpoint leaves the instance to re-execute
            why = self.failure(e, objects, names)
            s.warn_once(self.id, f"block {self.id} not checkpointed: {why}")
            s.block_done(self, BlockState.RECORDED, compute_s=compute, note=why)
            return
        if s.files is not None:  # the files the instance wrote, as it leaves them
            s.files.checkpoint(self.key, self.files_seq)
        m = s.adaptive.materialized(self.id, time.perf_counter() - t0, s.background)
        s.put_checkpointed(
            self.key,
            self.id,
            BlockState.CHECKPOINTED,
            outcome,
            compute_s=compute,
            materialize_s=m,
        )

    def _learn_aliases(self, s: BlockHost, objects: Getters) -> None:
        assert self.watch is not None
        objs = list(bound(objects).values())
        covered = {i for _, i, _ in s.augmentation(self.id, objs)} | {
            i for o in objs if (i := s.registry.id_of(o)) is not None
        }
        owned = _module_parameters(
            [(i, o) for i in self.watch if (o := s.registry.get(i)) is not None]
        )
        for i, before in self.watch.items():
            if i in covered:
                continue
            obj = s.registry.get(i)
            if obj is not None and not snapshot_equal(_watched_state(s, obj, owned), before):
                s.learn(self.id, i, type(obj).__name__)


def _light_token(m: Any) -> Any:
    """A module's parameters and buffers by memory and version counter, and its train flag. A
    tensor whose counter cannot be trusted (batch norm's running statistics, an inference
    tensor) is taken by a digest of its bytes: a token equal to nothing made every live norm
    module that had trained once look changed at every instance, so a previous fold's model,
    still alive on record only, was learned and its checkpoints refused on replay."""
    torch = sys.modules["torch"]
    out: list[Any] = [m.training]
    for t in (*m.parameters(), *m.buffers()):
        try:
            out.append(
                audit.tensor_image(t, torch)
                if versions.untrusted(t)
                else (t.data_ptr(), t._version)
            )
        except RuntimeError:  # an inference tensor: no counter
            out.append(audit.tensor_image(t, torch))
    return out


def _watched_state(s: BlockHost, obj: Any, owned: frozenset[int]) -> Any:
    """What the alias watch compares before and after a block: version fingerprints, or copies
    when the script writes tensors behind their version counters (``static/untracked.py``).
    ``owned``: the watched modules' parameters, which an optimizer's fingerprint leaves to them."""
    return fingerprint(obj, owned) if s.track_versions else clone_state(obj)


def _module_parameters(watched: list[tuple[int, Any]]) -> frozenset[int]:
    """Ids of the parameters of the watched modules (each live root module is watched)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return frozenset()
    return frozenset(
        id(p) for _, o in watched if isinstance(o, torch.nn.Module) for p in o.parameters()
    )
