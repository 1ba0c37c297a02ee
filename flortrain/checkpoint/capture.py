"""Capturing the state of changeset objects: a picklable description that refers to (does not
copy) their tensors, which the materializer stages before training goes on.

Each kind of object is captured through the interface its library gives it (``state_dict`` for
modules, optimizers and schedulers) plus what that interface leaves out and training reads
(gradients, train/eval mode, ``requires_grad``). Containers are captured element-wise so that
``restore.py`` can put their elements back in place.
"""

from __future__ import annotations

import collections
import io
import random
import re
import sys
import types
from typing import Any

from flortrain.checkpoint import channels
from flortrain.checkpoint.channels import is_channel, type_name
from flortrain.checkpoint.kinds import (
    CONTAINERS,
    IMMUTABLE,
    CarriesGraph,
    Mark,
    Uncapturable,
    Unrestorable,
    attr,
    carries_graph,
    data_source_rngs,
    is_data_source,
    is_numpy_value,
    is_rng,
    is_stateful,
    item,
    library_module,
    loaded_torch,
    picklable_class,
)


def capture(
    obj: Any,
    memo: dict[int, str] | None = None,
    path: str = "",
    mark: Mark | None = None,
) -> dict[str, Any]:
    """A picklable description of ``obj``'s state, referencing (not copying) its tensors: the
    materializer serializes it before training continues (or forks, for copy-on-write).

    ``memo`` maps each object already described to its path: a second sighting is a ``ref`` to
    it, so a restore puts the same object in both places. ``mark`` sees every object below
    ``obj`` (see :data:`Mark`). Each kind is tried in turn, libraries' first (a tensor is not
    captured as an object with a ``__dict__``)."""
    memo = {} if memo is None else memo
    if isinstance(obj, IMMUTABLE) or is_numpy_value(obj):
        return {"kind": "value", "value": obj}
    if id(obj) in memo:
        return {"kind": "ref", "path": memo[id(obj)]}
    memo[id(obj)] = path
    for kind in (_torch_state, _library_state, _container_state, _object_state):
        state = kind(obj, memo, path, mark)
        if state is not None:
            return state
    raise Uncapturable(path, obj)


def _torch_state(
    obj: Any, memo: dict[int, str], path: str, mark: Mark | None
) -> dict[str, Any] | None:
    torch = loaded_torch()
    if torch is None:
        return None
    if isinstance(obj, torch.nn.Module):
        return _module_state(obj, torch, memo, path)
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
    if (
        isinstance(obj, torch.optim.lr_scheduler.LRScheduler)
        or type(obj).__name__ == "ReduceLROnPlateau"
    ):
        return {"kind": "scheduler", "state": obj.state_dict()}
    if isinstance(obj, torch.Tensor):
        if obj.grad_fn is not None:
            raise CarriesGraph(carries_graph(path, obj))
        state = {
            "kind": "tensor",
            "value": obj.detach(),
            "grad": obj.grad,
            "requires_grad": obj.requires_grad,
        }
        if isinstance(obj, torch.nn.Parameter):
            state["param"] = True  # a replaced one is rebuilt a Parameter, as the loop made it
        return state
    if isinstance(obj, torch.Generator):
        return {"kind": "generator", "state": obj.get_state()}
    return None


def _module_state(obj: Any, torch: Any, memo: dict[int, str], path: str) -> dict[str, Any]:
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
        # unmarked: a module's plain attributes are restored in place (``identity``)
        "attrs": {
            name: _plain_attrs(m, torch, memo, attr(path, name), None)
            for name, m in obj.named_modules()
        },
    }


def _library_state(
    obj: Any, memo: dict[int, str], path: str, mark: Mark | None
) -> dict[str, Any] | None:
    """NumPy's arrays and generators, Python's ``random.Random``, data sources."""
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
    if is_data_source(obj):
        return {
            "kind": "data_source",
            "rngs": {p: capture(g) for p, g in data_source_rngs(obj).items()},
        }
    return None


def _container_state(
    obj: Any, memo: dict[int, str], path: str, mark: Mark | None
) -> dict[str, Any] | None:
    if isinstance(obj, collections.deque):
        items = [_child(x, memo, item(path, i), mark) for i, x in enumerate(obj)]
        return {"kind": "deque", "items": items, "maxlen": obj.maxlen}
    if isinstance(obj, list | tuple):
        kind, base = ("list", list) if isinstance(obj, list) else ("tuple", tuple)
        items = [_child(x, memo, item(path, i), mark) for i, x in enumerate(obj)]
        return _typed({"kind": kind, "items": items}, obj, base)
    if isinstance(obj, dict):
        entries = {k: _child(v, memo, item(path, k), mark) for k, v in obj.items()}
        return _typed({"kind": "dict", "items": entries}, obj, dict)
    if isinstance(obj, set):
        return {"kind": "set", "value": obj}
    return None


def _object_state(
    obj: Any, memo: dict[int, str], path: str, mark: Mark | None
) -> dict[str, Any] | None:
    if is_channel(obj):
        # where the script writes (a logger, a log file, a SummaryWriter): not state (``channels``)
        return {"kind": "channel", "type": type_name(obj), "level": channels.level(obj)}
    if isinstance(obj, io.IOBase):
        return {"kind": "file", "position": _file_position(obj, path)}
    if is_stateful(obj):
        return {"kind": "stateful", "state": obj.state_dict()}
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        state: dict[str, Any] = {
            "kind": "object",
            "items": {k: _child(v, memo, attr(path, k), mark) for k, v in vars(obj).items()},
        }
        if picklable_class(type(obj)):
            # a replaced one is rebuilt as pickle would: new, then its dict
            state["cls"] = type(obj)
        return state
    return None


def capture_named(
    expr: str,
    obj: Any,
    memo: dict[int, str],
    mark: Mark | None = None,
    path: str | None = None,
) -> dict[str, Any]:
    """:func:`capture` of a changeset element ``expr`` (under ``path``, ``expr`` unless told); a
    failure names the element, its type, and what inside it could not be captured, where
    (``cannot capture `writer` (mylib.Writer): holds a _thread.lock at `writer._lock```): the
    user reading why a loop is not checkpointed learns which object to look at."""
    path = expr if path is None else path
    try:
        return capture(obj, memo, path, mark)
    except Uncapturable as e:
        inner = expr + e.path[len(path) :] if e.path.startswith(path) else e.path
        if inner == expr:
            raise Uncapturable(expr, obj) from None
        raise Unrestorable(
            f"cannot capture `{expr}` ({type_name(obj)}): holds a {e.type} at `{inner}`"
        ) from None


_UNPICKLABLE = re.compile(r"(?:cannot|Can't) pickle '?([\w.<>]+)'?")


def unpicklable(error: Exception, roots: dict[str, Any], budget: int = 20_000) -> str:
    """Why a checkpoint could not be stored, naming what holds the object pickle refused
    (``cannot capture `guard` (_thread.lock): it cannot be pickled``) where pickle's message
    names only its type: the state's objects are walked for one of that type, containers by
    their items and plain objects by their attributes, up to ``budget`` objects. Called once a
    checkpoint has failed, on the live state it was made of."""
    found = _UNPICKLABLE.search(str(error))
    if found is None:
        return str(error)
    wanted = found.group(1)
    seen: set[int] = set()
    for expr, obj in roots.items():
        stack: list[tuple[str, Any]] = [(expr, obj)]
        while stack and len(seen) < budget:
            path, o = stack.pop()
            if isinstance(o, IMMUTABLE) or id(o) in seen:
                continue
            seen.add(id(o))
            if wanted in (type(o).__name__, type_name(o)):
                if path == expr:
                    return f"cannot capture `{expr}` ({type_name(o)}): it cannot be pickled"
                return f"cannot capture `{expr}` ({type_name(obj)}): holds a {type_name(o)} at `{path}`, which cannot be pickled"
            stack.extend(reversed(_pickled_children(o, path)))
    return str(error)


def _pickled_children(obj: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        return [(item(path, k), v) for k, v in obj.items()]
    if isinstance(obj, list | tuple | collections.deque):
        return [(item(path, i), v) for i, v in enumerate(obj)]
    if isinstance(obj, set | frozenset | types.ModuleType | type):
        return []
    torch = loaded_torch()
    if torch is not None and isinstance(
        obj, torch.Tensor | torch.nn.Module | torch.optim.Optimizer
    ):
        return []
    d = getattr(obj, "__dict__", None)
    return [(attr(path, k), v) for k, v in d.items()] if isinstance(d, dict) else []


def _file_position(f: Any, path: str) -> Any:
    """Where a file open for reading only stands (``f.readline()`` in the loop): a skipped instance
    seeks the live file there, so a replay does not read the first lines again. None for a closed
    file and one open for writing: what the loop wrote is not restored (docs/limitations.md), and
    moving its position would only add a gap."""
    if f.closed or f.writable() or not f.readable():
        return None
    try:
        return f.tell()
    except OSError:  # a text file iterated with `for line in f` cannot tell
        raise Unrestorable(
            f"`{path}` is a file iterated line by line, whose position cannot be told"
        ) from None


def _child(obj: Any, memo: dict[int, str], path: str, mark: Mark | None) -> dict[str, Any]:
    """:func:`capture` of an object inside another, shown to ``mark`` when it is an object (not
    a plain value, not a second sighting). A library module inside is a value: named, not
    walked (:func:`library_module`)."""
    if library_module(obj) is not None:
        return {"kind": "value", "value": obj}
    state = capture(obj, memo, path, mark)
    if mark is not None and state["kind"] not in ("value", "ref"):
        mark(path, obj)
    return state


def _typed(state: dict[str, Any], obj: Any, base: type) -> dict[str, Any]:
    """A container's state, with its type when it is a subclass (a namedtuple, a ``Counter``, a
    ``defaultdict`` and its factory): a rebuilt one is of that type again, not a plain one
    (a namedtuple does not come back as a tuple)."""
    if type(obj) is not base:
        state["type"] = type(obj)
        if isinstance(obj, collections.defaultdict):
            state["factory"] = obj.default_factory
    return state


def _plain_attrs(
    module: Any, torch: Any, memo: dict[int, str], path: str, mark: Mark | None
) -> dict[str, Any]:
    """Captured states of a module's public attributes that training may change in place and
    ``state_dict`` leaves out: plain values, unregistered tensors, containers (``self.stats =
    {"n": 0}`` updated in ``forward``) and private RNG objects. Other objects (a config, a
    tokenizer) are left alone: they are inputs, and capturing them could copy anything."""
    out: dict[str, Any] = {}
    for k, v in vars(module).items():
        if (
            k.startswith("_")
            or k == "training"
            or isinstance(v, torch.nn.Module | torch.nn.Parameter)
        ):
            continue
        if isinstance(v, (*IMMUTABLE, *CONTAINERS, torch.Tensor)) or is_rng(v) or is_numpy_value(v):
            try:
                out[k] = _child(v, memo, attr(path, k), mark)
            except CarriesGraph:
                raise
            except Unrestorable:
                continue  # e.g. a list of callbacks: not training state
    return out
