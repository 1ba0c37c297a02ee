"""Capturing the state of changeset objects, and restoring it *into* live objects.

In-place restoration keeps identity: the optimizer still references the model's parameters after a
skipped block, because the parameters were overwritten, not replaced. Each kind of object is
captured through the interface its library gives it (``state_dict`` for modules, optimizers and
schedulers) plus what that interface leaves out and training reads (gradients, train/eval mode,
``requires_grad``). Containers are captured element-wise so their elements are restored in place.
"""

from __future__ import annotations

import collections
import copy
import random
import sys
from typing import Any

from flortrain.runtime import versions

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset)


class Unrestorable(Exception):
    """An object the checkpoint cannot hold faithfully: the block instance is not memoized."""


class CarriesGraph(Unrestorable):
    """A tensor with an autograd graph: training state that a checkpoint cannot hold."""


def graph_of(obj: Any) -> Any:
    """The autograd node a tensor hangs from (``grad_fn``), or None."""
    torch = _torch()
    return obj.grad_fn if torch is not None and isinstance(obj, torch.Tensor) else None


def carries_graph(path: str, obj: Any) -> str:
    """Why a tensor with a ``grad_fn`` cannot be checkpointed. Restored, it would be a detached
    leaf: a later ``backward()`` through it (REINFORCE's ``torch.stack(log_probs).sum()``, a
    ``total = total + loss`` accumulated over the loop) would miss every parameter upstream and
    the update would be silently lost. The instance executes instead."""
    node = type(obj.grad_fn).__name__
    return f"`{path}` holds a tensor carrying an autograd graph (grad_fn={node}); it executes on replay"


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_data_source(obj: Any) -> bool:
    """Data loaders and datasets are inputs, re-created or re-iterated by the script itself; only
    the random generators they draw from are state (see :func:`data_source_rngs`)."""
    torch = _torch()
    return torch is not None and isinstance(obj, torch.utils.data.DataLoader | torch.utils.data.Dataset)


def data_source_rngs(obj: Any) -> dict[str, Any]:
    """The random generators iterating a data source advances, by attribute path: a loader's
    ``generator``, its sampler's and batch sampler's, and generators a dataset keeps for its own
    augmentation (``self.rng.normal(..)`` in ``__getitem__``), through wrappers like ``Subset``.
    Only public attributes of torch's data classes and of the user's Dataset/Sampler subclasses
    are followed, a few levels deep: anything else is data, not stream state."""
    torch = _torch()
    found: dict[str, Any] = {}
    if torch is None:
        return found
    data = torch.utils.data
    seen: set[int] = set()

    def walk(o: Any, path: str, depth: int) -> None:
        if id(o) in seen or depth > 4:
            return
        seen.add(id(o))
        for k, v in list(vars(o).items()):
            if k.startswith("_") or v is None:
                continue
            p = f"{path}.{k}" if path else k
            if _is_rng(v):
                if id(v) not in seen:
                    seen.add(id(v))
                    found[p] = v
            elif isinstance(v, data.DataLoader | data.Dataset | data.Sampler) and hasattr(v, "__dict__"):
                walk(v, p, depth + 1)

    if hasattr(obj, "__dict__"):
        walk(obj, "", 0)
    return found


def _attr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def capture(obj: Any, memo: dict[int, str] | None = None, path: str = "") -> dict[str, Any]:
    """A picklable description of ``obj``'s state, referencing (not copying) its tensors: the
    materializer serializes it before training continues (or forks, for copy-on-write)."""
    memo = {} if memo is None else memo
    if isinstance(obj, _IMMUTABLE) or _is_numpy_value(obj):
        return {"kind": "value", "value": obj}
    if id(obj) in memo:
        return {"kind": "ref", "path": memo[id(obj)]}
    memo[id(obj)] = path
    torch = _torch()
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            state = obj.state_dict()
            return {
                "kind": "module",
                "state": state,
                # what state_dict leaves out but training reads: grads, non-persistent buffers,
                # train/eval flags, requires_grad, and plain attributes (`self.calls += 1`)
                "grads": {n: p.grad for n, p in obj.named_parameters() if p.grad is not None},
                "buffers": {n: b for n, b in obj.named_buffers() if n not in state},
                "training": [m.training for m in obj.modules()],
                "requires_grad": [p.requires_grad for p in obj.parameters()],
                "attrs": {name: _plain_attrs(m, torch, memo, f"{path}.{name}") for name, m in obj.named_modules()},
            }
        if isinstance(obj, torch.optim.Optimizer):
            groups = [g["params"] for g in obj.param_groups]
            return {
                "kind": "optimizer",
                "state": obj.state_dict(),
                # an optimizer's state_dict holds no parameter values; parameters that belong to
                # no module (`W = torch.zeros(.., requires_grad=True)`) live only here. torch.save
                # stores a storage once, so parameters a module also holds cost nothing extra.
                "params": [[p.detach() for p in g] for g in groups],
                "grads": [[p.grad for p in g] for g in groups],
                # `_opt_called` tells an LR scheduler the optimizer stepped; without it a skipped
                # block makes the scheduler warn about a call order the user never had
                "called": getattr(obj, "_opt_called", None),
            }
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or type(obj).__name__ == "ReduceLROnPlateau":
            return {"kind": "scheduler", "state": obj.state_dict()}
        if isinstance(obj, torch.Tensor):
            if obj.grad_fn is not None:
                raise CarriesGraph(carries_graph(path, obj))
            t = obj.detach()
            return {"kind": "tensor", "value": t, "grad": obj.grad, "requires_grad": obj.requires_grad}
        if isinstance(obj, torch.Generator):
            return {"kind": "generator", "state": obj.get_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(obj, np.ndarray):
            return {"kind": "ndarray", "value": obj}
        if isinstance(obj, np.random.RandomState):
            return {"kind": "np_randomstate", "state": obj.get_state()}
        if isinstance(obj, np.random.Generator):
            return {"kind": "np_generator", "state": obj.bit_generator.state}
    if isinstance(obj, random.Random):
        return {"kind": "random", "state": obj.getstate()}
    if _is_data_source(obj):
        return {"kind": "data_source", "rngs": {p: capture(g) for p, g in data_source_rngs(obj).items()}}
    if isinstance(obj, collections.deque):
        return {"kind": "deque", "items": [capture(x, memo, f"{path}[{i}]") for i, x in enumerate(obj)]}
    if isinstance(obj, list):
        return _typed({"kind": "list", "items": [capture(x, memo, f"{path}[{i}]") for i, x in enumerate(obj)]}, obj, list)
    if isinstance(obj, tuple):
        return _typed({"kind": "tuple", "items": [capture(x, memo, f"{path}[{i}]") for i, x in enumerate(obj)]}, obj, tuple)
    if isinstance(obj, dict):
        return _typed({"kind": "dict", "items": {k: capture(v, memo, f"{path}[{k!r}]") for k, v in obj.items()}}, obj, dict)
    if isinstance(obj, set):
        return {"kind": "set", "value": obj}
    if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
        return {"kind": "stateful", "state": obj.state_dict()}
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {"kind": "object", "items": {k: capture(v, memo, f"{path}.{k}") for k, v in vars(obj).items()}}
    raise Unrestorable(f"cannot capture a {type(obj).__name__}")


def _typed(state: dict[str, Any], obj: Any, base: type) -> dict[str, Any]:
    """A container's state, with its type when it is a subclass (a namedtuple, a ``Counter``, a
    ``defaultdict`` and its factory): a rebuilt one is of that type again, not a plain one
    (found in review at stop 33: a namedtuple came back as a tuple)."""
    if type(obj) is not base:
        state["type"] = type(obj)
        if isinstance(obj, collections.defaultdict):
            state["factory"] = obj.default_factory
    return state


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


def _is_numpy_value(obj: Any) -> bool:
    """NumPy scalars (``np.int64``, ``np.float32``) and dtypes are immutable values, like ``int``:
    they are stored whole and put back by rebinding (gymnasium spaces and counters hold them)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.generic | np.dtype)


def _plain_attrs(module: Any, torch: Any, memo: dict[int, str], path: str) -> dict[str, Any]:
    """Captured states of a module's public attributes that training may change in place and
    ``state_dict`` leaves out: plain values, unregistered tensors, containers (``self.stats =
    {"n": 0}`` updated in ``forward``) and private RNG objects. Other objects (a config, a
    tokenizer) are left alone: they are inputs, and capturing them could copy anything."""
    out: dict[str, Any] = {}
    for k, v in vars(module).items():
        if k.startswith("_") or k == "training" or isinstance(v, torch.nn.Module | torch.nn.Parameter):
            continue
        if isinstance(v, (*_IMMUTABLE, *_CONTAINERS, torch.Tensor)) or _is_rng(v) or _is_numpy_value(v):
            try:
                out[k] = capture(v, memo, f"{path}.{k}")
            except CarriesGraph:
                raise
            except Unrestorable:
                continue  # e.g. a list of callbacks: not training state
    return out


_CONTAINERS = (list, tuple, dict, set, collections.deque)


def _is_rng(obj: Any) -> bool:
    torch = _torch()
    np = sys.modules.get("numpy")
    return (
        isinstance(obj, random.Random)
        or (torch is not None and isinstance(obj, torch.Generator))
        or (np is not None and isinstance(obj, np.random.RandomState | np.random.Generator))
    )


def rebuild(state: dict[str, Any]) -> Any:
    """A fresh object from a captured state, for slots whose live value is not restorable in place."""
    kind = state["kind"]
    if kind in ("value", "ndarray", "set"):
        return state["value"]
    if kind == "tensor":
        t = state["value"]
        if state["requires_grad"] and t.is_floating_point():
            t = t.detach().requires_grad_(True)
            t.grad = state["grad"]
        return t
    if kind == "list":
        return _container(state, [rebuild(s) for s in state["items"]])
    if kind == "tuple":
        return _container(state, [rebuild(s) for s in state["items"]])
    if kind == "dict":
        return _container(state, {k: rebuild(v) for k, v in state["items"].items()})
    if kind == "random":
        r = random.Random()
        r.setstate(state["state"])
        return r
    raise Unrestorable(f"cannot rebuild a {kind} without a live object")


def restore_into(live: Any, state: dict[str, Any]) -> Any:
    """Load ``state`` into ``live`` in place when its kind allows; return the object the slot
    holding ``live`` should now hold (``live`` itself unless it had to be rebuilt).

    ``state`` is taken over: its tensors become the live gradients and optimizer state without a
    copy. Every state restored is a payload ``deserialize`` has just built for this one restore
    (fresh tensors no cache or other object holds); cloning them cost a replay of the CNN
    benchmark two copies of every gradient per checkpoint, the module's and the optimizer's."""
    kind = state["kind"]
    if kind == "data_source":
        for path, st in state.get("rngs", {}).items():
            restore_into(_attr_path(live, path), st)
        return live
    if kind in ("value", "ref"):
        return state.get("value", live) if kind == "value" else live
    if kind == "module":
        torch = _torch()
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
                    d[k] = restore_into(d[k], v) if k in d else rebuild(v)
        return live
    if kind == "optimizer":
        torch = _torch()
        orders = [list(g) for g in live.param_groups]
        live.load_state_dict(state["state"])
        for group, order in zip(live.param_groups, orders, strict=False):
            # load_state_dict rebuilds each group with "params" last; the script's groups had
            # them first. Keep the live order: a resumed run's groups are then the record's,
            # down to what iterating one or digesting it sees.
            items = dict(group)
            group.clear()
            group.update({k: items[k] for k in order if k in items})
            group.update(items)
        with torch.no_grad():
            for group, values, grads in zip(live.param_groups, state["params"], state["grads"], strict=True):
                for p, v, g in zip(group["params"], values, grads, strict=True):
                    p.copy_(v)
                    p.grad = g
        if state.get("called") is not None:
            live._opt_called = state["called"]
        return live
    if kind in ("scheduler", "stateful"):
        live.load_state_dict(copy.deepcopy(state["state"]) if kind == "scheduler" else state["state"])
        return live
    if kind == "deque":
        if not isinstance(live, collections.deque):
            return collections.deque(rebuild(s) for s in state["items"])
        live.clear()
        live.extend(rebuild(s) for s in state["items"])
        return live
    if kind == "tensor":
        torch = _torch()
        assert torch is not None
        if isinstance(live, torch.Tensor) and live.shape == state["value"].shape and live.dtype == state["value"].dtype:
            with torch.no_grad():
                live.copy_(state["value"])
            live.grad = state["grad"]
            return live
        return rebuild(state)
    if kind == "generator":
        live.set_state(state["state"])
        return live
    if kind == "np_randomstate":
        live.set_state(state["state"])
        return live
    if kind == "np_generator":
        live.bit_generator.state = state["state"]
        return live
    if kind == "random":
        live.setstate(state["state"])
        return live
    if kind == "ndarray":
        value = state["value"]
        if getattr(live, "shape", None) == value.shape and getattr(live, "dtype", None) == value.dtype:
            live[...] = value
            return live
        return value  # rebound to another shape or dtype: the record's array, not a cast
    if kind == "set":
        if not isinstance(live, set):
            return set(state["value"])
        live.clear()
        live.update(state["value"])
        return live
    if kind == "list":
        items = state["items"]
        if not isinstance(live, list):  # the slot held something else before (None)
            return rebuild(state)
        if len(live) == len(items):
            for i, s in enumerate(items):
                live[i] = restore_into(live[i], s)
        else:
            live[:] = [rebuild(s) for s in items]
        return live
    if kind == "tuple":
        if isinstance(live, tuple) and len(live) == len(state["items"]):
            return _container(state, [restore_into(x, s) for x, s in zip(live, state["items"], strict=True)])
        return rebuild(state)
    if kind == "dict":
        items = state["items"]
        if not isinstance(live, dict):  # the slot held something else before (None)
            return rebuild(state)
        for k in [k for k in live if k not in items]:
            del live[k]
        for k, s in items.items():
            live[k] = restore_into(live[k], s) if k in live else rebuild(s)
        if list(live) != list(items):  # the loop reordered keys (`move_to_end`, pop and re-insert)
            ordered = {k: live[k] for k in items}
            live.clear()
            live.update(ordered)
        return live
    if kind == "object":
        if live is None or not hasattr(live, "__dict__"):
            raise Unrestorable(f"cannot restore a {type(live).__name__} from an object's state")
        d = vars(live)
        for k, s in state["items"].items():
            d[k] = restore_into(d[k], s) if k in d else rebuild(s)
        return live
    raise Unrestorable(f"unknown state kind {kind}")


def snapshot_equal(a: Any, b: Any) -> bool:
    """Exact comparison of two captured states (used by the alias watch)."""
    torch = _torch()
    if torch is not None and isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(snapshot_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(snapshot_equal(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:
        return False


def fingerprint(obj: Any, owned: frozenset[int] = frozenset()) -> Any:
    """A cheap token of a live module's or optimizer's state that changes whenever the state does,
    for the alias watch: each tensor by its memory and in-place version counter (no bytes read or
    copied), plain values by value. Tensors written through ``.data`` escape it: a script that
    does so is watched with :func:`clone_state` instead (``static/untracked.py``).

    ``owned``: ids of parameters that belong to a watched module. An optimizer's token leaves
    them out: their values and gradients are that module's state, and its token sees them
    change. Otherwise every loop that runs ``backward()`` would seem to change the optimizer (its
    parameters' gradients moved), and each of its checkpoints would carry the optimizer's state
    as well, which the loop never touched: nanoGPT's micro-step loop staged AdamW's two moments
    beside the model at every checkpoint. Parameters of no module (``SGD([w])``) stay in it."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.nn.Module):
        return (
            [_fp(t) for t in obj.parameters()],
            [_fp(t.grad) for t in obj.parameters()],
            [_fp(b) for b in obj.buffers()],
            [m.training for m in obj.modules()],
            [p.requires_grad for p in obj.parameters()],
            {name: _fp(_plain_attrs_raw(m, torch)) for name, m in obj.named_modules()},
        )
    if torch is not None and isinstance(obj, torch.optim.Optimizer):
        return (
            [_fp(v) for v in obj.state.values()],
            [_fp({k: v for k, v in g.items() if k != "params"}) for g in obj.param_groups],
            [[(_fp(p), _fp(p.grad)) for p in g["params"] if id(p) not in owned] for g in obj.param_groups],
        )
    return _fp(obj)


def _plain_attrs_raw(module: Any, torch: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_") and k != "training" and not isinstance(v, torch.nn.Module | torch.nn.Parameter)
    }


def _fp(v: Any) -> Any:
    torch = _torch()
    if torch is not None and isinstance(v, torch.Tensor):
        try:
            version = v._version
        except RuntimeError:  # an inference tensor: no counter; compare its bytes
            return ("bytes", v.detach().cpu().clone())
        if versions.untrusted(v):  # a kernel writes it behind the counter: compare its bytes
            return ("bytes", v.detach().cpu().clone())
        return ("T", v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.dtype, version)
    if isinstance(v, _IMMUTABLE) or _is_numpy_value(v):
        return v
    if isinstance(v, dict):
        return ("D", [(k, _fp(x)) for k, x in v.items()])
    if isinstance(v, list | tuple | collections.deque):
        return ("L", [_fp(x) for x in v])
    if isinstance(v, set):
        return ("S", frozenset(v))
    if _is_rng(v):
        return ("R", repr(capture(v)))
    return ("O", id(v))


def clone_state(obj: Any) -> Any:
    """A deep copy of an object's captured state, for before/after comparison."""
    return copy.deepcopy(capture(obj))
