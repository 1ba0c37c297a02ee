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
import functools
import io
import pickle
import random
import re
import sys
import types
from collections.abc import Callable
from typing import Any

from flortrain.runtime import channels, versions
from flortrain.runtime.channels import is_channel, type_name
from flortrain.static import plan

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset)


#: Called with the path and the object of every captured object below a changeset element (not
#: plain values, not second sightings): how record notes which of them the loop replaced
#: (:mod:`flortrain.runtime.identity`).
Mark = Callable[[str, Any], None]


def item(path: str, key: Any) -> str:
    """The path of a container's item (``rows[3]``, ``tracker['best']``). Capture, the identity
    walk, :func:`children` and :class:`Restorer` all name paths through this and :func:`attr`:
    a restore finds an object's marks only if it names the object as capture did."""
    return f"{path}[{key!r}]"


def attr(path: str, name: str) -> str:
    """The path of an object's attribute (``trainer.stats``): see :func:`item`."""
    return f"{path}.{name}"


class Unrestorable(Exception):
    """An object the checkpoint cannot hold faithfully: the block instance is not memoized."""


class Uncapturable(Unrestorable):
    """An object no kind of capture describes (a lock, a socket, a C extension's object):
    raised with its path, and named whole by :func:`capture_named`."""

    def __init__(self, path: str, obj: Any) -> None:
        self.path = path
        self.type = type_name(obj)
        super().__init__(
            f"cannot capture `{path}` ({self.type}): flortrain has no way to capture a {self.type}"
        )


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
    return plan.carries_graph(path, type(obj.grad_fn).__name__)


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_data_source(obj: Any) -> bool:
    """Data loaders and datasets are inputs, re-created or re-iterated by the script itself; only
    the random generators they draw from are state (see :func:`data_source_rngs`)."""
    torch = _torch()
    return torch is not None and isinstance(
        obj, torch.utils.data.DataLoader | torch.utils.data.Dataset
    )


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
            p = attr(path, k) if path else k
            if _is_rng(v):
                if id(v) not in seen:
                    seen.add(id(v))
                    found[p] = v
            elif isinstance(v, data.DataLoader | data.Dataset | data.Sampler) and hasattr(
                v, "__dict__"
            ):
                walk(v, p, depth + 1)

    if hasattr(obj, "__dict__"):
        walk(obj, "", 0)
    return found


def _attr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def capture(
    obj: Any, memo: dict[int, str] | None = None, path: str = "", mark: Mark | None = None
) -> dict[str, Any]:
    """A picklable description of ``obj``'s state, referencing (not copying) its tensors: the
    materializer serializes it before training continues (or forks, for copy-on-write).

    ``memo`` maps each object already described to its path: a second sighting is a ``ref`` to
    it, so a restore puts the same object in both places. ``mark`` sees every object below
    ``obj`` (see :data:`Mark`)."""
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
                # unmarked: a module's plain attributes are restored in place (``identity``)
                "attrs": {
                    name: _plain_attrs(m, torch, memo, attr(path, name), None)
                    for name, m in obj.named_modules()
                },
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
        if (
            isinstance(obj, torch.optim.lr_scheduler.LRScheduler)
            or type(obj).__name__ == "ReduceLROnPlateau"
        ):
            return {"kind": "scheduler", "state": obj.state_dict()}
        if isinstance(obj, torch.Tensor):
            if obj.grad_fn is not None:
                raise CarriesGraph(carries_graph(path, obj))
            t = obj.detach()
            state = {
                "kind": "tensor",
                "value": t,
                "grad": obj.grad,
                "requires_grad": obj.requires_grad,
            }
            if isinstance(obj, torch.nn.Parameter):
                state["param"] = True  # a replaced one is rebuilt a Parameter, as the loop made it
            return state
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
        return {
            "kind": "data_source",
            "rngs": {p: capture(g) for p, g in data_source_rngs(obj).items()},
        }
    if isinstance(obj, collections.deque):
        items = [_child(x, memo, item(path, i), mark) for i, x in enumerate(obj)]
        return {"kind": "deque", "items": items, "maxlen": obj.maxlen}
    if isinstance(obj, list):
        return _typed(
            {
                "kind": "list",
                "items": [_child(x, memo, item(path, i), mark) for i, x in enumerate(obj)],
            },
            obj,
            list,
        )
    if isinstance(obj, tuple):
        return _typed(
            {
                "kind": "tuple",
                "items": [_child(x, memo, item(path, i), mark) for i, x in enumerate(obj)],
            },
            obj,
            tuple,
        )
    if isinstance(obj, dict):
        return _typed(
            {
                "kind": "dict",
                "items": {k: _child(v, memo, item(path, k), mark) for k, v in obj.items()},
            },
            obj,
            dict,
        )
    if isinstance(obj, set):
        return {"kind": "set", "value": obj}
    if is_channel(obj):
        # where the script writes (a logger, a log file, a SummaryWriter): not state (``channels``)
        return {"kind": "channel", "type": type_name(obj), "level": channels.level(obj)}
    if isinstance(obj, io.IOBase):
        return {"kind": "file", "position": _file_position(obj, path)}
    if is_stateful(obj):
        return {"kind": "stateful", "state": obj.state_dict()}
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        state = {
            "kind": "object",
            "items": {k: _child(v, memo, attr(path, k), mark) for k, v in vars(obj).items()},
        }
        if _picklable_class(type(obj)):
            state["cls"] = type(
                obj
            )  # a replaced one is rebuilt as pickle would: new, then its dict
        return state
    raise Uncapturable(path, obj)


def capture_named(
    expr: str, obj: Any, memo: dict[int, str], mark: Mark | None = None, path: str | None = None
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
            if isinstance(o, _IMMUTABLE) or id(o) in seen:
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
    torch = _torch()
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


@functools.cache
def _library() -> tuple[str, ...]:
    """Where the standard library and installed packages live (a venv's and the base
    interpreter's). Asked for on the first module a capture meets, not at import: ``sysconfig``
    and its paths cost a recorded run's start-up time that most scripts never need."""
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(
        {p for scheme in ("stdlib", "platstdlib", "purelib", "platlib") if (p := paths.get(scheme))}
    )


def library_module(obj: Any) -> str | None:
    """The name of ``obj`` when it is a module of the standard library or of an installed
    package that ``sys.modules`` holds under that name: state a checkpoint names instead of
    storing (``cfg = {"lib": math}``: a module object cannot be pickled, and a restore gets the
    very module back by importing the name). A module of the project is not one: the loop may
    change its globals, which a name would not restore, so a container holding one stays
    unstorable and its loop re-executes."""
    if not isinstance(obj, types.ModuleType):
        return None
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str) or sys.modules.get(name) is not obj:
        return None
    path = getattr(obj, "__file__", None)
    if path is None:
        return name if name in sys.builtin_module_names else None
    if isinstance(path, str) and not path.startswith("/") and "." in name:
        # a module object a package makes itself (``torch.ops``, whose ``__file__`` is
        # ``_ops.py``): its package's, as the package is
        top = sys.modules.get(name.split(".", 1)[0])
        return name if top is not None and library_module(top) is not None else None
    return name if isinstance(path, str) and path.startswith(_library()) else None


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


_CLASSES: dict[type, bool] = {}


def _picklable_class(cls: type) -> bool:
    """Whether pickle finds ``cls`` again by its name (not a class made inside a function): only
    then can a checkpoint name it, and a restore make a new instance of it."""
    ok = _CLASSES.get(cls)
    if ok is None:
        try:
            ok = pickle.loads(pickle.dumps(cls)) is cls
        except Exception:
            ok = False
        _CLASSES[cls] = ok
    return ok


def _typed(state: dict[str, Any], obj: Any, base: type) -> dict[str, Any]:
    """A container's state, with its type when it is a subclass (a namedtuple, a ``Counter``, a
    ``defaultdict`` and its factory): a rebuilt one is of that type again, not a plain one
    (a namedtuple does not come back as a tuple)."""
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
        if (
            isinstance(v, (*_IMMUTABLE, *_CONTAINERS, torch.Tensor))
            or _is_rng(v)
            or _is_numpy_value(v)
        ):
            try:
                out[k] = _child(v, memo, attr(path, k), mark)
            except CarriesGraph:
                raise
            except Unrestorable:
                continue  # e.g. a list of callbacks: not training state
    return out


_CONTAINERS = (list, tuple, dict, set, collections.deque)


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` keeps its state behind ``state_dict``/``load_state_dict`` (a scheduler, a
    sampler, a user's tracker). Asked of any object a changeset reaches, some of which answer
    an unknown attribute with something other than ``AttributeError``: ``ctypes.cdll.state_dict``
    tries to load a library of that name and raises ``OSError`` (a module imported inside the
    loop reaches it), which would make every boundary of the loop fail."""
    try:
        return hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
    except Exception:
        return False


def _is_rng(obj: Any) -> bool:
    torch = _torch()
    np = sys.modules.get("numpy")
    return (
        isinstance(obj, random.Random)
        or (torch is not None and isinstance(obj, torch.Generator))
        or (np is not None and isinstance(obj, np.random.RandomState | np.random.Generator))
    )


class _Missing:
    """A slot the live container does not have (a key the loop added)."""


_MISSING = _Missing()


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
        if live is _MISSING or self.replaced(path):
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
        if kind == "data_source":
            for p, st in state.get("rngs", {}).items():
                Restorer().into(_attr_path(live, p), st, p)
            return live
        if kind == "module":
            return self._module(live, state, path)
        if kind == "optimizer":
            return _optimizer(live, state)
        if kind in ("scheduler", "stateful"):
            live.load_state_dict(
                copy.deepcopy(state["state"]) if kind == "scheduler" else state["state"]
            )
            return live
        if kind == "deque":
            if not isinstance(live, collections.deque) or live.maxlen != state.get(
                "maxlen", live.maxlen
            ):
                return self.fresh(state, path)
            items = [
                self.child(live[i] if i < len(live) else _MISSING, s, item(path, i))
                for i, s in enumerate(state["items"])
            ]
            live.clear()
            live.extend(items)
            return live
        if kind == "tensor":
            torch = _torch()
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
        if kind == "channel":
            # not state: the live channel stays (``channels``), at the level it had
            level = state.get("level")
            if level is not None and channels.level(live) not in (None, level):
                live.setLevel(level)
            return live
        if kind == "file":
            if state["position"] is not None and isinstance(live, io.IOBase) and not live.closed:
                live.seek(state["position"])
            return live
        if kind in ("generator", "np_randomstate", "random"):
            (live.set_state if kind != "random" else live.setstate)(state["state"])
            return live
        if kind == "np_generator":
            live.bit_generator.state = state["state"]
            return live
        if kind == "ndarray":
            value = state["value"]
            if (
                getattr(live, "shape", None) == value.shape
                and getattr(live, "dtype", None) == value.dtype
            ):
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
            if not isinstance(live, list):  # the slot held something else before (None)
                return self.fresh(state, path)
            live[:] = [
                self.child(live[i] if i < len(live) else _MISSING, s, item(path, i))
                for i, s in enumerate(state["items"])
            ]
            return live
        if kind == "tuple":
            if isinstance(live, tuple) and len(live) == len(state["items"]):
                return _container(
                    state,
                    [
                        self.child(x, s, item(path, i))
                        for i, (x, s) in enumerate(zip(live, state["items"], strict=True))
                    ],
                )
            return self.fresh(state, path)
        if kind == "dict":
            items = state["items"]
            if not isinstance(live, dict):  # the slot held something else before (None)
                return self.fresh(state, path)
            for k in [k for k in live if k not in items]:
                del live[k]
            for k, s in items.items():
                live[k] = self.child(live.get(k, _MISSING), s, item(path, k))
            if list(live) != list(
                items
            ):  # the loop reordered keys (`move_to_end`, pop and re-insert)
                ordered = {k: live[k] for k in items}
                live.clear()
                live.update(ordered)
            return live
        if kind == "object":
            if live is None or not hasattr(live, "__dict__"):
                if "cls" in state:
                    return self.fresh(state, path)
                raise Unrestorable(f"cannot restore a {type(live).__name__} from an object's state")
            d = vars(live)
            for k, s in state["items"].items():
                d[k] = self.child(d.get(k, _MISSING), s, attr(path, k))
            return live
        raise Unrestorable(f"unknown state kind {kind}")

    def _module(self, live: Any, state: dict[str, Any], path: str) -> Any:
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
                    d[k] = self.child(d.get(k, _MISSING), v, attr(attr(path, name), k))
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
                torch = _torch()
                t = torch.nn.Parameter(t.detach(), requires_grad=state["requires_grad"])
            elif state["requires_grad"] and t.is_floating_point():
                t = t.detach().requires_grad_(True)
            if t.requires_grad:
                t.grad = state["grad"]
            return t
        if kind in ("list", "tuple"):
            return _container(
                state, [self.fresh(s, item(path, i)) for i, s in enumerate(state["items"])]
            )
        if kind == "deque":
            return collections.deque(
                (self.fresh(s, item(path, i)) for i, s in enumerate(state["items"])),
                state.get("maxlen"),
            )
        if kind == "dict":
            return _container(
                state, {k: self.fresh(v, item(path, k)) for k, v in state["items"].items()}
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
            g = _torch().Generator()
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


def _unrebuildable(path: str, kind: str) -> str:
    return (
        f"`{path}` holds a {kind.replace('_', ' ')} the loop put there; flortrain restores one only into"
        " the object that was there before"
    )


def _optimizer(live: Any, state: dict[str, Any]) -> Any:
    """``load_state_dict``, keeping the live ``param_groups`` list and dicts: it makes new ones,
    and a name the script took for a group before the loop (``group = opt.param_groups[0]``,
    then ``group["lr"] *= 0.5`` each epoch) would then change a dict the optimizer no longer
    used."""
    torch = _torch()
    groups = live.param_groups
    originals = list(groups)
    live.load_state_dict(state["state"])
    loaded = live.param_groups
    for i, (group, new) in enumerate(zip(originals, loaded, strict=False)):
        # load_state_dict rebuilds each group with "params" last; the script's groups had
        # them first. Keep the live order: a resumed run's groups are then the record's,
        # down to what iterating one or digesting it sees.
        order = list(group)
        items = dict(new)
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
    torch = _torch()
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


def snapshot_equal(a: Any, b: Any) -> bool:
    """Exact comparison of two captured states (used by the alias watch)."""
    torch = _torch()
    if torch is not None and isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(snapshot_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return (
            isinstance(b, list | tuple)
            and len(a) == len(b)
            and all(snapshot_equal(x, y) for x, y in zip(a, b, strict=True))
        )
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
            [
                [(_fp(p), _fp(p.grad)) for p in g["params"] if id(p) not in owned]
                for g in obj.param_groups
            ],
        )
    return _fp(obj)


def _plain_attrs_raw(module: Any, torch: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_")
        and k != "training"
        and not isinstance(v, torch.nn.Module | torch.nn.Parameter)
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
        return (
            "T",
            v.untyped_storage().data_ptr(),
            v.storage_offset(),
            tuple(v.shape),
            v.dtype,
            version,
        )
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
