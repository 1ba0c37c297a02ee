"""The SkipBlock: one memoized loop instance and its state machine.

========== =====================================================================
RECORD     execute; at the end, maybe materialize changeset + RNG (Eq. 4)
SKIP       replay: iterate nothing; at the end, restore the checkpoint in place
EXECUTE    replay: run the loop (it is probed, or this instance has no checkpoint)
PASSTHROUGH outside a main-loop iteration, nested in another block, or run by a probe: plain code
========== =====================================================================

Pseudoresume (a replay worker starting mid-run) is SKIP for every instance before its segment,
whatever the probes; the main-loop context decides it.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import FrameType
from typing import TYPE_CHECKING, Any

from flortrain import knobs
from flortrain.runtime import audit, identity, rng, versions
from flortrain.runtime.blobformat import MissingObject
from flortrain.runtime.channels import is_channel, type_name
from flortrain.runtime.materializer import deserialize, digests
from flortrain.runtime.state import (
    _IMMUTABLE,
    _MISSING,
    Mark,
    Restorer,
    Unrestorable,
    assign_into,
    attr,
    capture_named,
    carries_graph,
    clone_state,
    fingerprint,
    graph_of,
    item,
    snapshot_equal,
    unpicklable,
    why_unrestorable,
)
from flortrain.static.plan import outside_iterator
from flortrain.store.records import BlockState

if TYPE_CHECKING:
    from flortrain.runtime.session import Session

Getters = Mapping[str, Callable[[], Any]]

#: The row note of a futile instance (``AdaptivePeriod.futile``), which the replay plan shows as
#: the reason a block's other instances execute: without it a user sees a loop checkpointed once
#: in hundreds of instances and no reason why.
FUTILE_NOTE = "it runs faster than a checkpoint of it would restore"


class State(StrEnum):
    RECORD = "record"
    SKIP = "skip"
    EXECUTE = "execute"
    PASSTHROUGH = "passthrough"


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: A changeset element that is not bound at the end of the loop.
ABSENT = _Absent()

#: Rebound values that are not objects with an identity worth keeping (two names holding 3)
_VALUES = _IMMUTABLE


class Captured:
    """A rebound name whose value holds objects the state also holds (``top = sorted(top +
    [row])[:3]`` over rows in ``history``; ``last = (epoch, row)``): stored as a captured state,
    so that a restore gives it those same objects, not copies: otherwise an annotation through
    ``last[1]`` after the loop would not reach ``history``."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (Captured, (self.state,))


class Ref:
    """A rebound name that held one of the block's in-place objects: restore the live object."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __repr__(self) -> str:  # what the state digest of a checkpoint sees
        return f"Ref({self.where!r})"


class Member:
    """A rebound name that held a parameter or buffer of a live module (the loop variable ``p``
    of ``for e, p in zip(ema, model.parameters())``): a restore gives it that module's tensor
    of that name, which the module's own restore has written, not a copy that would no longer
    follow training. ``module`` is the root module's registry id, ``name`` the tensor's
    qualified name in it (``0.weight``)."""

    def __init__(self, module: int, name: str) -> None:
        self.module = module
        self.name = name

    def __repr__(self) -> str:  # what the state digest of a checkpoint sees
        return f"Member({self.module}, {self.name!r})"

    def live(self, s: Session) -> Any:
        """The tensor this names in the live module (None: the module is gone)."""
        m = s.registry.get(self.module)
        if m is None:
            return None
        prefix, _, leaf = self.name.rpartition(".")
        return getattr(m.get_submodule(prefix), leaf)


class Logger:
    """A rebound name that held a logger of the logging registry (``log =
    logging.getLogger("train")`` inside the loop): a channel, not state (``channels``), which a
    restore gets back by its name, the very object the skipped statement would have bound."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # what the state digest of a checkpoint sees
        return f"Logger({self.name!r})"


def _rebound_channel(expr: str, v: Any) -> Logger:
    """How a checkpoint holds a rebound name whose value is a channel: a registry logger by its
    name; any other channel cannot be made again by a restore, so the instance is not
    checkpointed, and the reason names it."""
    logging = sys.modules.get("logging")
    if logging is not None and isinstance(v, logging.Logger) and logging.getLogger(v.name) is v:
        return Logger(v.name)
    raise Unrestorable(
        f"cannot capture `{expr}` ({type_name(v)}): an output channel the loop binds, which a skipped"
        " instance cannot make again"
    )


class Imported:
    """A rebound name that held a module (``import math`` inside the loop): a module is not
    state, and a restore binds the name to the module of that name, importing it as the skipped
    ``import`` statement would have. Stored by value, it could not be pickled, and every
    checkpoint of the loop failed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # what the state digest of a checkpoint sees
        return f"Imported({self.name!r})"


def _members(s: Session) -> dict[int, Member]:
    """Every parameter and buffer of the live root modules, by ``id``, as a :class:`Member`."""
    out: dict[int, Member] = {}
    for i, m in s.registry.root_modules():
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            out.setdefault(id(t), Member(i, name))
    return out


def resolve(getters: Getters) -> dict[str, Any]:
    """A changeset's current values; an element that is not bound (a name or attribute
    assigned only in a branch this run never takes: ``if ddp:``) is :data:`ABSENT`. Absence
    at the end of a loop is state like any other: the loop left the element unbound, and a
    skipped instance leaves it unbound the same way."""
    out: dict[str, Any] = {}
    for expr, get in getters.items():
        try:
            out[expr] = get()
        except (NameError, AttributeError):
            out[expr] = ABSENT
    return out


def bound(getters: Getters) -> dict[str, Any]:
    """The elements of a changeset bound now, with their values (:func:`resolve` without
    :data:`ABSENT`): what a walk or a watch looks at."""
    return {e: v for e, v in resolve(getters).items() if v is not ABSENT}


class Checkpointable:
    """A changeset that can be captured into a checkpoint payload and restored from one: what a
    SkipBlock does at a loop's end, and a main-loop boundary (iteration spans) at an iteration's
    start. ``values`` holds the rebound names a restore hands back to the generated code."""

    def __init__(self, block_id: str, detach_ok: tuple[str, ...], registry_start: int) -> None:
        self.id = block_id
        self.detach_ok = detach_ok
        self.values: dict[str, Any] = {}
        self.payload: dict[str, Any] | None = None
        self.key = ""
        self.registry_start = registry_start
        #: the position a replay restores from: 0 for a block's instance (its start), the
        #: iteration a jump leaves for a main-loop boundary (``identity``)
        self.at = 0

    def has(self, name: str) -> bool:
        """Whether the recorded state left ``name`` bound (else it stays as it is: unbound)."""
        return name in self.values

    def value(self, name: str) -> Any:
        return self.values[name]

    def augment(self, s: Session, objs: list[Any]) -> list[tuple[str, int, Any]]:
        """Live objects the state holds beyond its named changeset (registry kind, id, object)."""
        return s.augmentation(self.id, objs)

    def roots(self, s: Session, objs: dict[str, Any]) -> dict[str, Any]:
        """The objects the state restores in place, by the path their capture has: the named
        changeset's, then those :meth:`augment` adds (``module#3``)."""
        return {**objs, **{f"{kind}#{i}": o for kind, i, o in self.augment(s, list(objs.values()))}}

    def marks(self, s: Session) -> identity.InstanceMarks | identity.BoundaryMarks | None:
        """What notes the objects the loop replaced (``identity``); None: nothing to compare with."""
        return None

    def _payload(self, s: Session, objects: Getters, names: Getters) -> dict[str, Any]:
        objs = bound(objects)
        vals = resolve(names)
        memo: dict[int, str] = {}
        marks = self.marks(s)
        mark: Mark | None = marks
        captured = {expr: capture_named(expr, o, memo, mark) for expr, o in objs.items()}
        augmented = self.augment(s, list(objs.values()))
        extra = {
            f"{kind}#{i}": {**capture_named(f"{kind}#{i}", o, memo, mark), "type": type(o).__name__}
            for kind, i, o in augmented
        }
        # a rebound name holding an object the state holds (`model = model.train()`, `last =
        # row` after `rows.append(row)`) gets that object back, not a copy of it; so does a
        # second name for the same object (`a = b = []`)
        rebound: dict[str, Any] = {}
        members: dict[int, Member] | None = None
        torch = sys.modules.get("torch")
        for expr, v in vals.items():
            if v is ABSENT:
                continue  # not in the payload: `has()` is false and the name stays unbound
            if id(v) in memo:
                rebound[expr] = Ref(memo[id(v)])
                continue
            if isinstance(v, types.ModuleType) and sys.modules.get(v.__name__) is v:
                rebound[expr] = Imported(v.__name__)
                continue
            if is_channel(v):
                rebound[expr] = _rebound_channel(expr, v)
                continue
            if torch is not None and isinstance(v, torch.Tensor):
                members = _members(s) if members is None else members
                if (
                    id(v) in members
                ):  # a model's own tensor: the live one, after the model's restore
                    rebound[expr] = members[id(v)]
                    continue
            _no_live_objects_inside(s, expr, v)
            if not isinstance(v, _VALUES) and identity.shares(v, memo):
                rebound[expr] = Captured(capture_named(expr, v, memo, mark, identity.NAME + expr))
                if marks is not None:
                    marks(identity.NAME + expr, v)
                continue
            rebound[expr] = self._detachable(expr, v)
            if not isinstance(v, _VALUES):
                memo[id(v)] = expr
                if marks is not None:
                    marks(identity.NAME + expr, v)
        _no_views_of_parameters(s, rebound, objs)
        registry = {
            "start": self.registry_start,
            "end": s.registry.count(),
            "ids": {e: i for e, v in vals.items() if (i := s.registry.id_of(v)) is not None},
        }
        payload = {
            "objects": captured,
            "extra": extra,
            "names": rebound,
            "rng": rng.capture(),
            "registry": registry,
        }
        if marks is not None:
            payload["since"] = marks.since
        if isinstance(marks, identity.InstanceMarks):
            # a block's instance is restored at its start (a boundary's position is the jump's,
            # known only on replay, where ``load`` checks it): refuse what no restore can use
            why = self.unusable(payload)
            if why is not None:
                raise Unrestorable(why)
        return payload

    def failure(self, error: Exception, objects: Getters, names: Getters) -> str:
        """Why a checkpoint of this state failed, naming what holds an object pickle refused
        (:func:`state.unpicklable`)."""
        if isinstance(error, Unrestorable):
            return str(error)
        try:
            return unpicklable(error, {**bound(names), **bound(objects)})
        except Exception:
            return str(error)

    def unusable(self, payload: dict[str, Any]) -> str | None:
        """Why a restore of ``payload`` would fail (at :attr:`at`), checked before it starts."""
        return why_unrestorable(
            {**payload["objects"], **payload["extra"]}, payload.get("since"), self.at
        )

    def _detachable(self, expr: str, v: Any) -> Any:
        """A rebound value as the checkpoint stores it. A tensor carrying an autograd graph is
        stored detached only when the static pass proved that nothing can tell (``values``: the
        name is read afterwards only as a number, ``loss.item()``); otherwise a later
        ``backward()`` through it would silently miss the loop's part of the graph."""
        if graph_of(v) is None:
            return v
        if expr in self.detach_ok:
            return v.detach()
        raise Unrestorable(carries_graph(expr, v))

    def load(self, session: Session, data: bytes) -> str | None:
        """Take a checkpoint for restoring; the reason it cannot be used, or None."""
        try:
            self.payload = deserialize(data, session.store.read_object, session.live_object)
        except MissingObject as e:
            return f"cannot be used: {e}"
        except Exception as e:
            return f"cannot be read ({type(e).__name__})"
        reg = self.payload["registry"]
        if not self._registry_fits(reg["start"]):
            return (
                f"was taken with {reg['start']} modules/optimizers alive, the replay has"
                f" {self.registry_start} (the script creates them differently on replay)"
            )
        extra = self.payload["extra"]
        for ref, st in list(extra.items()):
            obj = session.registry.get(_registry_id(ref))
            if type(obj).__name__ == st["type"]:
                continue
            if self._may_drop(ref, obj):
                del extra[ref]
                continue
            return f"refers to {ref} ({st['type']}), which the replay does not have"
        why = self.unusable(self.payload)
        return f"cannot be restored here: {why}" if why is not None else None

    def _registry_fits(self, recorded_start: int) -> bool:
        """Whether the record had the replay's modules/optimizers alive when this was taken: a
        block's instance starts with exactly as many."""
        return recorded_start == self.registry_start

    def _may_drop(self, ref: str, obj: Any) -> bool:
        """Whether an object of the checkpoint the replay does not have may be left out."""
        return False

    def restore(self, s: Session, objects: Getters, names: Getters | None = None) -> None:
        """Put the loaded checkpoint's state back: objects in place, rebound names into
        ``values`` (the generated code assigns them), registry ids aligned, RNG streams. A name
        that held the same object all along (``gsum += g``) gets its value written into the
        object it holds now, which other names may share (``identity.name_identities``)."""
        payload = self.payload
        assert payload is not None
        objs = resolve(objects)
        live = resolve(names or {}) if "since" in payload else {}
        r = Restorer(payload.get("since"), self.at)
        for expr, st in payload["objects"].items():
            if objs.get(expr, ABSENT) is not ABSENT:
                r.into(objs[expr], st, expr)
        for ref, st in payload["extra"].items():
            r.into(s.registry.get(_registry_id(ref)), st, ref)
        for expr, v in payload["names"].items():
            if isinstance(v, Member):
                v = v.live(s)
            elif isinstance(v, Imported):
                v = importlib.import_module(v.name)
            elif isinstance(v, Logger):
                v = sys.modules["logging"].getLogger(v.name)
            elif isinstance(v, Ref):
                if v.where in r.placed:
                    v = r.placed[v.where]
                elif v.where in objs:
                    v = objs[v.where]
                else:
                    v = s.registry.get(_registry_id(v.where))
            elif isinstance(v, Captured):
                held = live.get(expr, ABSENT)
                v = r.child(_MISSING if held is ABSENT else held, v.state, identity.NAME + expr)
            elif (
                live.get(expr, ABSENT) is not ABSENT
                and not r.replaced(identity.NAME + expr)
                and assign_into(live[expr], v)
            ):
                v = live[expr]
            self.values[expr] = v
            r.placed[expr] = v
        # objects the recorded state created keep their ids, so later ids stay aligned
        reg = payload["registry"]
        s.registry.pad(reg["end"] - reg["start"])
        for expr, i in reg["ids"].items():
            if i >= reg["start"]:
                s.registry.place(i, self.values[expr])
        rng.restore(payload["rng"])


class SkipBlock(Checkpointable):
    def __init__(
        self,
        session: Session | None,
        block_id: str,
        span: tuple[int, int] = (0, 0),
        detach_ok: tuple[str, ...] = (),
        objects: Getters | None = None,
        names: Getters | None = None,
        unchecked: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            block_id, detach_ok, session.registry.count() if session is not None else 0
        )
        self.session = session
        #: rebound names restored but not compared with the record's checkpoint (clock readings)
        self.unchecked = unchecked
        # The user's frame running the loop, and the loop's lines in it: an exception that leaves
        # the loop never reaches `end()`, and the session tells by the frame having moved on.
        self.span = span
        self.pyframe: FrameType | None = (
            sys._getframe(2) if session is not None and span[0] else None
        )
        self.thread = threading.get_ident()
        self.aborted = False
        self.files_seq = (
            0  # record: the write events before the instance began (``runtime/files.py``)
        )
        if session is not None:
            session.close_left_frames()
        self.watch: dict[int, Any] | None = None
        self.light: dict[int, Any] | None = None  # the light watch's before-tokens
        self.audit: audit.Image | None = None  # the side-effect audit's before-image
        self._audit_frame: FrameType | None = None
        if session is None or session.main is None or session.frames or session.probe_depth:
            # nested, outside the main loop, or opened by a probe (`print(evaluate(train_data))`):
            # plain code. A probe's loops must not take the key, and so the checkpoint, of the
            # script's own instance that follows it; they run, isolated with the probe.
            self.state = State.PASSTHROUGH
        else:
            self.key = session.next_key(block_id)
            self.state = session.initial_state(self)
        self.entry: dict[str, Any] | None = None
        #: an instance the period will not checkpoint whatever happens (``AdaptivePeriod.futile``):
        #: nothing below its changeset is walked or watched
        self.futile = False
        if session is not None:
            session.frames.append(self)
            if self.state is State.RECORD:
                session.registry.reset_block()
                self.futile = session.adaptive.futile(block_id)
                self.files_seq = session.files.seq if session.files is not None else 0
            if self.state is State.RECORD and not self.futile:
                roots = self._entry_roots(session, objects)
                self.entry = self._identities(session, roots, names)
                if session.adaptive.costs.get(block_id) is None or (
                    session.adaptive.costs[block_id].n < knobs.ALIAS_WATCH_INSTANCES
                ):
                    self.watch = self._snapshot_watched(session)
                    self._audit_frame = sys._getframe(2)
                    self.audit = session.audit_image(self.id, self._audit_frame)
                elif session.track_versions:
                    self.light = self._light_watch(session, roots)
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()

    def _entry_roots(self, session: Session, objects: Getters | None) -> dict[str, Any] | None:
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
        self, session: Session, roots: dict[str, Any] | None, names: Getters | None
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

    def marks(self, s: Session) -> identity.InstanceMarks | identity.BoundaryMarks | None:
        if self.state is not State.RECORD:
            return None  # a replay's executed instance: digests only, nothing is restored
        if self.entry is None:
            raise Unrestorable("its state at the instance's start is unknown")
        return identity.InstanceMarks(self.entry)

    def _light_watch(self, session: Session, roots: dict[str, Any] | None) -> dict[int, Any] | None:
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

    def _learn_light(self, s: Session, objects: Getters) -> None:
        assert self.light is not None
        covered = {id(o) for o in self.roots(s, bound(objects)).values()}
        for i, before in self.light.items():
            obj = s.registry.get(i)
            if obj is not None and id(obj) not in covered and _light_token(obj) != before:
                s.learn(self.id, i, type(obj).__name__)

    def _snapshot_watched(self, session: Session) -> dict[int, Any] | None:
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
        s = self.session
        if self.state is State.RECORD and s is not None and self.id not in s.unnamed_effects:
            try:
                name = audit.outside_iterator(iterable, sys._getframe(1))
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

    def abort(self, s: Session) -> None:
        """Close an instance an exception carried out of its loop. Nothing is checkpointed (the
        state is mid-loop); on replay the instance re-executes, and raises the same way. Its
        output region is recorded as executed so ``diff`` still compares what it printed."""
        self.aborted = True
        self.pyframe = None
        elapsed = time.perf_counter() - self.t0
        if self.state is State.RECORD:
            s.block_done(self, BlockState.RECORDED, compute_s=elapsed, note="left by an exception")
        elif self.state is State.EXECUTE:
            s.block_done(self, BlockState.EXECUTED, compute_s=elapsed)

    def end(self, objects: Getters, names: Getters) -> bool:
        s = self.session
        self.pyframe = None
        if s is None or self.aborted:
            return False
        with s.holding():
            return self._end(s, objects, names)

    def _end(self, s: Session, objects: Getters, names: Getters) -> bool:
        if s.frames and s.frames[-1] is self:
            s.frames.pop()
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
        self, s: Session, objects: Getters, names: Getters
    ) -> dict[str, str] | None:
        """Digests of the state this executed instance produced, where the record checkpointed the
        same instance: ``diff`` compares them part by part. A clock reading (``unchecked``) is left
        out: the replay read the clock anew, and ``diff`` compares only parts both runs have."""
        if s.replay is None or self.key not in s.replay.checkpoints:
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
    def _record(self, s: Session, objects: Getters, names: Getters) -> None:
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
            s.audit_loop(self.id, before, self._audit_frame, objects, names)
        self._audit_frame = None
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
        occ = int(self.key.rsplit("#", 1)[1])
        assert s.main is not None
        s.put_checkpointed(
            self.key,
            self.id,
            s.main[2],
            occ,
            BlockState.CHECKPOINTED,
            outcome,
            compute_s=compute,
            materialize_s=m,
        )

    def _learn_aliases(self, s: Session, objects: Getters) -> None:
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


def _watched_state(s: Session, obj: Any, owned: frozenset[int]) -> Any:
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


def _no_live_objects_inside(s: Session, expr: str, v: Any) -> None:
    """Refuse a rebound object that holds a live model, optimizer or loader in an attribute (a
    learning-rate scheduler created in the loop holds its optimizer): stored by value, it would
    come back holding a copy, and drive that copy instead of the training's own."""
    try:
        attrs = vars(v)
    except TypeError:
        return  # no instance dict: a number, a string, a tensor, a container of them
    for name, a in attrs.items():
        if s.registry.id_of(a) is not None:
            raise Unrestorable(
                f"`{expr}` holds a live {type(a).__name__} in `.{name}`; restored by value, it would drive a copy"
            )


def _no_views_of_parameters(s: Session, rebound: dict[str, Any], objs: dict[str, Any]) -> None:
    """Refuse a tensor that shares memory with a live model's parameter or buffer where a
    restore would give back a copy that no longer follows the optimizer's in-place updates:
    held by a rebound name (``snap = model.weight.detach()``; a rebound name is restored by
    value), or inside a container the block changes in place (``snaps.append(w.detach())``).
    A parameter itself in such a container (an optimizer's
    ``param_groups``) is restored into in place, and is fine. Modules and optimizers are
    restored through their own state and are not looked into."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    by_value: list[tuple[str, Any]] = []
    for expr, v in rebound.items():
        if isinstance(v, torch.Tensor):
            by_value.append((expr, v))
    inside: list[tuple[str, Any]] = []
    for expr, o in objs.items():
        _contained_tensors(o, expr, torch, inside, set())
    if not any(t.numel() for _, t in (*by_value, *inside)):
        return
    live: set[int] = set()
    own: set[int] = set()
    for _, m in s.registry.root_modules():
        for t in [*m.parameters(), *m.buffers()]:
            own.add(id(t))
            if t.numel():
                live.add(t.untyped_storage().data_ptr())
    for expr, v in [*by_value, *((e, t) for e, t in inside if id(t) not in own)]:
        if v.numel() and v.untyped_storage().data_ptr() in live:
            raise Unrestorable(
                f"`{expr}` shares memory with a model parameter; restored, it would be a copy that"
                " no longer follows training"
            )


def _contained_tensors(
    v: Any, path: str, torch: Any, out: list[tuple[str, Any]], seen: set[int]
) -> None:
    """The tensors inside a live container or plain object (not a tensor at the top: a
    changeset tensor restored in place is the same object), through lists, tuples, dicts and
    attributes."""
    if id(v) in seen or isinstance(v, torch.nn.Module | torch.optim.Optimizer | torch.Tensor):
        return
    seen.add(id(v))
    if isinstance(v, list | tuple):
        items: list[tuple[str, Any]] = [(item(path, i), x) for i, x in enumerate(v)]
    elif isinstance(v, dict):
        items = [(item(path, k), x) for k, x in v.items()]
    elif type(v).__module__ != "builtins" and isinstance(getattr(v, "__dict__", None), dict):
        items = [(attr(path, k), x) for k, x in vars(v).items()]
    else:
        return
    for p, x in items:
        if isinstance(x, torch.Tensor):
            out.append((p, x))
        else:
            _contained_tensors(x, p, torch, out, seen)


def _registry_id(ref: str) -> int:
    """The registry id in an augmentation key (``module#3``)."""
    return int(ref.split("#", 1)[1])
