"""Restoring captured state *into* live objects.

In-place restoration keeps identity: the optimizer still references the model's parameters after a
skipped block, because the parameters were overwritten, not replaced. A restore is checked whole
before it begins (:func:`why_unrestorable`): one that stopped halfway would leave training state
half-written.
"""

from __future__ import annotations

import collections
import copy
import io
import random
import sys
from collections.abc import Callable
from typing import Any

from flortrain.checkpoint import channels
from flortrain.checkpoint.kinds import Unrestorable, attr, attr_path, item, loaded_torch


def _container(state: dict[str, Any], items: Any) -> Any:
    """A rebuilt container of the captured type, holding ``items``."""
    cls = state.get("type")
    if cls is None:
        return tuple(items) if state["kind"] == "tuple" else items
    if "factory" in state:
        return cls(state["factory"], items)
    if state["kind"] == "tuple" and hasattr(cls, "_make"):
        return cls._make(items)
    return cls(items)


class Missing:
    """A slot the live container does not have (a key the loop added)."""


MISSING = Missing()


class Restorer:
    """Puts captured states back into live objects, keeping the identities the loop left.

    An object a container held at the loop's start and still held at its end is restored in
    place: everything that refers to it (an optimizer to its parameters, ``first = bufs[0]``)
    sees the restored values, as after the loop. An object the loop *replaced*
    (``tracker["best"] = Best(..)``, ``bufs[0] = t * 1.0``) is made new, and the one the slot
    held stays as it was: writing the new state into it would change every other name for it.
    ``since`` names the replaced slots
    (:mod:`flortrain.runtime.identity`): the path of each, and the position (a main-loop
    iteration; 1 for a block's instance) from which its object has been there. A slot is
    restored in place when its object was there already at ``at``, the position the replay
    restores from. A checkpoint without ``since`` (written by an older flortrain) restores every
    slot in place.

    ``placed`` maps each restored object's path to the object now there: a second sighting of
    an object in the state (``last = row`` after ``rows.append(row)``; one row in two
    containers) is that same object again."""

    def __init__(self, since: dict[str, int] | None = None, at: int = 0) -> None:
        self.since = since or {}
        self.at = at
        self.placed: dict[str, Any] = {}

    def replaced(self, path: str) -> bool:
        """Whether the object at ``path`` came there after the position the replay is at."""
        return self.since.get(path, 0) > self.at

    def child(self, live: Any, state: dict[str, Any], path: str) -> Any:
        """What a slot inside a restored object holds afterwards."""
        if live is MISSING or self.replaced(path):
            return self.fresh(state, path)
        return self.into(live, state, path)

    def into(self, live: Any, state: dict[str, Any], path: str) -> Any:
        """Load ``state`` into ``live`` in place when its kind allows; return the object the slot
        holding ``live`` should now hold (``live`` itself unless it had to be rebuilt).

        ``state`` is taken over: its tensors become the live gradients and optimizer state
        without a copy. Every state restored is a payload ``deserialize`` has just built for this
        one restore (fresh tensors no cache or other object holds); cloning them would cost a
        replay two copies of every gradient per checkpoint, the module's and the optimizer's."""
        kind = state["kind"]
        if kind == "value":
            return state["value"]
        if kind == "ref":
            return self.placed.get(state["path"], live)
        out = self._into(live, state, path)
        self.placed[path] = out
        return out

    def _into(self, live: Any, state: dict[str, Any], path: str) -> Any:
        kind = state["kind"]
        load = _INTO.get(kind)
        if load is None:
            raise Unrestorable(f"unknown state kind {kind}")
        return load(self, live, state, path)

    def _data_source(self, live: Any, state: dict[str, Any], path: str) -> Any:
        for p, st in state.get("rngs", {}).items():
            Restorer().into(attr_path(live, p), st, p)
        return live

    def _optimizer(self, live: Any, state: dict[str, Any], path: str) -> Any:
        return _optimizer(live, state)

    def _loaded(self, live: Any, state: dict[str, Any], path: str) -> Any:
        """A scheduler or an object behind ``state_dict``/``load_state_dict``."""
        kind = state["kind"]
        live.load_state_dict(
            copy.deepcopy(state["state"]) if kind == "scheduler" else state["state"]
        )
        return live

    def _deque(self, live: Any, state: dict[str, Any], path: str) -> Any:
        if not isinstance(live, collections.deque) or live.maxlen != state.get(
            "maxlen", live.maxlen
        ):
            return self.fresh(state, path)
        items = [
            self.child(live[i] if i < len(live) else MISSING, s, item(path, i))
            for i, s in enumerate(state["items"])
        ]
        live.clear()
        live.extend(items)
        return live

    def _tensor(self, live: Any, state: dict[str, Any], path: str) -> Any:
        torch = loaded_torch()
        assert torch is not None
        if (
            isinstance(live, torch.Tensor)
            and live.shape == state["value"].shape
            and live.dtype == state["value"].dtype
        ):
            with torch.no_grad():
                live.copy_(state["value"])
            live.grad = state["grad"]
            return live
        return self.fresh(state, path)

    def _channel(self, live: Any, state: dict[str, Any], path: str) -> Any:
        # not state: the live channel stays (``channels``), at the level it had
        level = state.get("level")
        if level is not None and channels.level(live) not in (None, level):
            live.setLevel(level)
        return live

    def _file(self, live: Any, state: dict[str, Any], path: str) -> Any:
        if state["position"] is not None and isinstance(live, io.IOBase) and not live.closed:
            live.seek(state["position"])
        return live

    def _rng(self, live: Any, state: dict[str, Any], path: str) -> Any:
        kind = state["kind"]
        if kind == "np_generator":
            live.bit_generator.state = state["state"]
        else:
            (live.set_state if kind != "random" else live.setstate)(state["state"])
        return live

    def _ndarray(self, live: Any, state: dict[str, Any], path: str) -> Any:
        value = state["value"]
        if (
            getattr(live, "shape", None) == value.shape
            and getattr(live, "dtype", None) == value.dtype
        ):
            live[...] = value
            return live
        return value  # rebound to another shape or dtype: the record's array, not a cast

    def _set(self, live: Any, state: dict[str, Any], path: str) -> Any:
        if not isinstance(live, set):
            return set(state["value"])
        live.clear()
        live.update(state["value"])
        return live

    def _list(self, live: Any, state: dict[str, Any], path: str) -> Any:
        if not isinstance(live, list):  # the slot held something else before (None)
            return self.fresh(state, path)
        live[:] = [
            self.child(live[i] if i < len(live) else MISSING, s, item(path, i))
            for i, s in enumerate(state["items"])
        ]
        return live

    def _tuple(self, live: Any, state: dict[str, Any], path: str) -> Any:
        if isinstance(live, tuple) and len(live) == len(state["items"]):
            return _container(
                state,
                [
                    self.child(x, s, item(path, i))
                    for i, (x, s) in enumerate(zip(live, state["items"], strict=True))
                ],
            )
        return self.fresh(state, path)

    def _dict(self, live: Any, state: dict[str, Any], path: str) -> Any:
        items = state["items"]
        if not isinstance(live, dict):  # the slot held something else before (None)
            return self.fresh(state, path)
        for k in [k for k in live if k not in items]:
            del live[k]
        for k, s in items.items():
            live[k] = self.child(live.get(k, MISSING), s, item(path, k))
        if list(live) != list(items):  # the loop reordered keys (`move_to_end`, pop and re-insert)
            ordered = {k: live[k] for k in items}
            live.clear()
            live.update(ordered)
        return live

    def _object(self, live: Any, state: dict[str, Any], path: str) -> Any:
        if live is None or not hasattr(live, "__dict__"):
            if "cls" in state:
                return self.fresh(state, path)
            raise Unrestorable(f"cannot restore a {type(live).__name__} from an object's state")
        d = vars(live)
        for k, s in state["items"].items():
            d[k] = self.child(d.get(k, MISSING), s, attr(path, k))
        return live

    def _module(self, live: Any, state: dict[str, Any], path: str) -> Any:
        torch = loaded_torch()
        live.load_state_dict(state["state"])
        buffers = dict(live.named_buffers())
        with torch.no_grad():
            for n, b in state["buffers"].items():
                if n in buffers and buffers[n].shape == b.shape:
                    buffers[n].copy_(b)
        for (n, p), rg in zip(live.named_parameters(), state["requires_grad"], strict=True):
            p.requires_grad_(rg)
            p.grad = state["grads"].get(n)
        for m, training in zip(live.modules(), state["training"], strict=True):
            m.training = training
        subs = dict(live.named_modules())
        for name, attrs in state["attrs"].items():
            if name in subs:
                d = subs[name].__dict__
                for k, v in attrs.items():
                    d[k] = self.child(d.get(k, MISSING), v, attr(attr(path, name), k))
        return live

    def fresh(self, state: dict[str, Any], path: str) -> Any:
        """A new object from a captured state, for a slot whose object the loop replaced (or
        whose live value cannot take the state in place)."""
        kind = state["kind"]
        if kind == "value":
            return state["value"]
        if kind == "ref":
            if state["path"] in self.placed:
                return self.placed[state["path"]]
            raise Unrestorable(
                f"`{path}` refers to `{state['path']}`, which the checkpoint does not restore first"
            )
        out = self._fresh(state, path)
        self.placed[path] = out
        return out

    def _fresh(self, state: dict[str, Any], path: str) -> Any:
        kind = state["kind"]
        if kind == "ndarray":
            return state["value"]
        if kind == "set":
            return set(state["value"])
        if kind == "tensor":
            t = state["value"]
            if state.get("param"):
                torch = loaded_torch()
                t = torch.nn.Parameter(t.detach(), requires_grad=state["requires_grad"])
            elif state["requires_grad"] and t.is_floating_point():
                t = t.detach().requires_grad_(True)
            if t.requires_grad:
                t.grad = state["grad"]
            return t
        if kind in ("list", "tuple"):
            return _container(
                state,
                [self.fresh(s, item(path, i)) for i, s in enumerate(state["items"])],
            )
        if kind == "deque":
            return collections.deque(
                (self.fresh(s, item(path, i)) for i, s in enumerate(state["items"])),
                state.get("maxlen"),
            )
        if kind == "dict":
            return _container(
                state,
                {k: self.fresh(v, item(path, k)) for k, v in state["items"].items()},
            )
        if kind == "object" and "cls" in state:
            obj = state["cls"].__new__(state["cls"])
            vars(obj).update({k: self.fresh(v, attr(path, k)) for k, v in state["items"].items()})
            return obj
        if kind == "random":
            r = random.Random()
            r.setstate(state["state"])
            return r
        if kind == "generator":
            g = loaded_torch().Generator()
            g.set_state(state["state"])
            return g
        if kind in ("np_randomstate", "np_generator"):
            np = sys.modules["numpy"]
            if kind == "np_randomstate":
                rs = np.random.RandomState()
                rs.set_state(state["state"])
                return rs
            bits = getattr(np.random, state["state"]["bit_generator"])()
            bits.state = state["state"]
            return np.random.Generator(bits)
        raise Unrestorable(_unrebuildable(path, kind))


#: how each kind of captured state goes into a live object (:meth:`Restorer.into`)
_INTO: dict[str, Callable[[Restorer, Any, dict[str, Any], str], Any]] = {
    "data_source": Restorer._data_source,
    "module": Restorer._module,
    "optimizer": Restorer._optimizer,
    "scheduler": Restorer._loaded,
    "stateful": Restorer._loaded,
    "deque": Restorer._deque,
    "tensor": Restorer._tensor,
    "channel": Restorer._channel,
    "file": Restorer._file,
    "generator": Restorer._rng,
    "np_randomstate": Restorer._rng,
    "random": Restorer._rng,
    "np_generator": Restorer._rng,
    "ndarray": Restorer._ndarray,
    "set": Restorer._set,
    "list": Restorer._list,
    "tuple": Restorer._tuple,
    "dict": Restorer._dict,
    "object": Restorer._object,
}


def _unrebuildable(path: str, kind: str) -> str:
    return (
        f"`{path}` holds a {kind.replace('_', ' ')} the loop put there; flortrain restores one only into"
        " the object that was there before"
    )


#: values whose equality is their identity's only observable difference
_IMMUTABLE = (bool, int, float, complex, str, bytes, type(None))


def _same_if_equal(old: Any, new: Any) -> Any:
    """``old`` where it is an immutable value equal to ``new`` (a tuple of such, too)."""
    if type(old) is not type(new):
        return new
    if isinstance(old, _IMMUTABLE):
        return old if old == new else new
    if isinstance(old, tuple) and all(isinstance(x, _IMMUTABLE) for x in old):
        return old if old == new else new
    return new


def _optimizer(live: Any, state: dict[str, Any]) -> Any:
    """``load_state_dict``, keeping the live ``param_groups`` list and dicts: it makes new ones,
    and a name the script took for a group before the loop (``group = opt.param_groups[0]``,
    then ``group["lr"] *= 0.5`` each epoch) would then change a dict the optimizer no longer
    used."""
    torch = loaded_torch()
    groups = live.param_groups
    originals = list(groups)
    live.load_state_dict(state["state"])
    loaded = live.param_groups
    for i, (group, new) in enumerate(zip(originals, loaded, strict=False)):
        # load_state_dict rebuilds each group with "params" last; the script's groups had
        # them first. Keep the live order, and the live object of each value it leaves equal
        # (the groups of `AdamW(groups, betas=b)` share `b`; load_state_dict's deep copy gives
        # each its own): a resumed run's groups are then the record's, down to what iterating
        # one or digesting it sees.
        order = list(group)
        items = {k: _same_if_equal(group.get(k), v) for k, v in new.items()}
        group.clear()
        group.update({k: items[k] for k in order if k in items})
        group.update(items)
        loaded[i] = group
    groups[:] = loaded
    live.param_groups = groups
    with torch.no_grad():
        for group, values, grads in zip(
            live.param_groups, state["params"], state["grads"], strict=True
        ):
            for p, v, g in zip(group["params"], values, grads, strict=True):
                p.copy_(v)
                p.grad = g
    if state.get("called") is not None:
        live._opt_called = state["called"]
    return live


#: kinds a restore can make anew (:meth:`Restorer.fresh`); the others only load into a live object
_REBUILDABLE = frozenset(
    {
        "value",
        "ref",
        "ndarray",
        "set",
        "tensor",
        "list",
        "tuple",
        "deque",
        "dict",
        "random",
        "generator",
        "np_randomstate",
        "np_generator",
    }
)


def children(state: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """The captured objects directly inside ``state``, with the paths :func:`capture` gave them."""
    kind = state["kind"]
    if kind in ("list", "tuple", "deque"):
        return [(item(path, i), s) for i, s in enumerate(state["items"])]
    if kind == "dict":
        return [(item(path, k), s) for k, s in state["items"].items()]
    if kind == "object":
        return [(attr(path, k), s) for k, s in state["items"].items()]
    if kind == "module":
        return [
            (attr(attr(path, name), k), s)
            for name, attrs in state["attrs"].items()
            for k, s in attrs.items()
        ]
    return []


def why_unrestorable(
    states: dict[str, dict[str, Any]], since: dict[str, int] | None, at: int
) -> str | None:
    """Why a :class:`Restorer` at ``at`` would fail on ``states`` (path to captured state, each
    restored in place), or None: checked before anything is restored, since a restore that
    stops halfway would leave training state half-written."""
    r = Restorer(since, at)
    stack = [(p, s, False) for p, s in states.items()]
    while stack:
        path, st, fresh = stack.pop()
        fresh = fresh or r.replaced(path)
        if fresh and not (st["kind"] in _REBUILDABLE or (st["kind"] == "object" and "cls" in st)):
            return _unrebuildable(path, st["kind"])
        stack.extend((p, s, fresh) for p, s in children(st, path))
    return None


def assign_into(live: Any, value: Any) -> bool:
    """Write a rebound name's stored value into the object the name holds, where the two are
    alike (a tensor or array of the same shape and dtype, a list, dict, set or deque); False,
    and nothing written, otherwise. Items of a container come back as the stored copies."""
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if (
            not isinstance(live, torch.Tensor)
            or live.shape != value.shape
            or live.dtype != value.dtype
        ):
            return False
        if live.grad_fn is not None:  # written in place, a later backward through it would fail
            return False
        with torch.no_grad():
            live.copy_(value)
        if live.requires_grad or value.grad is not None:
            live.grad = value.grad
        return True
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        if type(live) is not type(value) or live.shape != value.shape or live.dtype != value.dtype:
            return False
        live[...] = value
        return True
    if type(live) is not type(value):
        return False
    if isinstance(value, list):
        live[:] = value
    elif isinstance(value, dict | set):
        live.clear()
        live.update(value)
    elif isinstance(value, collections.deque) and live.maxlen == value.maxlen:
        live.clear()
        live.extend(value)
    else:
        return False
    return True


def restore_into(live: Any, state: dict[str, Any]) -> Any:
    """Load ``state`` into ``live`` in place (every slot inside it too); see :class:`Restorer`."""
    return Restorer().into(live, state, "")
