"""A changeset's state, captured into a checkpoint payload and restored from one.

What a SkipBlock does at a loop's end and a main-loop boundary at an iteration's start. The
payload holds the objects restored in place (by their capture: ``state``), those the registry
adds (the library augmentation), the rebound names (by value, or as a reference to a live object
the state holds), the registry's ids and the RNG streams. Both talk to their host through
:class:`~flortrain.runtime.host.CheckpointHost`, never to the session itself.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from flortrain.checkpoint.blob import deserialize
from flortrain.checkpoint.capture import capture_named, unpicklable
from flortrain.checkpoint.channels import is_channel, type_name
from flortrain.checkpoint.codec import MissingObject
from flortrain.checkpoint.kinds import (
    IMMUTABLE,
    Mark,
    Unrestorable,
    attr,
    carries_graph,
    graph_of,
    item,
)
from flortrain.checkpoint.restore import MISSING, Restorer, assign_into, why_unrestorable
from flortrain.runtime import identity, rng
from flortrain.runtime.host import CheckpointHost

Getters = Mapping[str, Callable[[], Any]]


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: A changeset element that is not bound at the end of the loop.
ABSENT = _Absent()

#: Rebound values that are not objects with an identity worth keeping (two names holding 3)
_VALUES = IMMUTABLE


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

    def live(self, s: CheckpointHost) -> Any:
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


def _members(s: CheckpointHost) -> dict[int, Member]:
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

    def augment(self, s: CheckpointHost, objs: list[Any]) -> list[tuple[str, int, Any]]:
        """Live objects the state holds beyond its named changeset (registry kind, id, object)."""
        return s.augmentation(self.id, objs)

    def roots(self, s: CheckpointHost, objs: dict[str, Any]) -> dict[str, Any]:
        """The objects the state restores in place, by the path their capture has: the named
        changeset's, then those :meth:`augment` adds (``module#3``)."""
        return {**objs, **{f"{kind}#{i}": o for kind, i, o in self.augment(s, list(objs.values()))}}

    def marks(self, s: CheckpointHost) -> identity.InstanceMarks | identity.BoundaryMarks | None:
        """What notes the objects the loop replaced (``identity``); None: nothing to compare with."""
        return None

    def _payload(self, s: CheckpointHost, objects: Getters, names: Getters) -> dict[str, Any]:
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
        (:func:`capture.unpicklable`)."""
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

    def load(self, host: CheckpointHost, data: bytes) -> str | None:
        """Take a checkpoint for restoring; the reason it cannot be used, or None."""
        try:
            self.payload = deserialize(data, host.read_object, host.live_object)
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
            obj = host.registry.get(_registry_id(ref))
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

    def restore(self, s: CheckpointHost, objects: Getters, names: Getters | None = None) -> None:
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
                v = r.child(MISSING if held is ABSENT else held, v.state, identity.NAME + expr)
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


def _no_live_objects_inside(s: CheckpointHost, expr: str, v: Any) -> None:
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


def _no_views_of_parameters(
    s: CheckpointHost, rebound: dict[str, Any], objs: dict[str, Any]
) -> None:
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
