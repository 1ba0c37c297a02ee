"""The side-effect audit: what a loop changed in place that its changeset does not name.

The changeset comes from Flor's static rules (``static/changeset/``), which read effects off the
syntax: assignments, methods called on a name, arguments of known mutating functions. Effects
hidden behind a call the rules cannot see into escape them, and a skipped instance then leaves
that state as the prologue left it, silently: ``seen.add(i)`` (``add`` reads a tensor, but writes
a set), ``early_stop(val_loss)`` (a callable object counting in ``self``), ``step(batch)`` (a
``functools.partial`` holding a stats dict), ``np.add(acc, g, acc)``, ``f.readline()``. Each
such shape would replay wrong with ``diff`` passing, since ``diff`` has no record of what a
probe prints.

So record audits the first instances of each memoized loop and of each main loop (as many as
the alias watch, ``knobs.ALIAS_WATCH_INSTANCES``): before, it takes a shallow image of every
object reachable from the names of the loop's frame (its locals and its module's globals);
after, it takes them again and compares. An object whose image changed, that the changeset's
objects cannot reach, was changed behind the rules' back: the loop is then not checkpointed for
the rest of the run (its instances re-execute on replay, and its main loop's boundaries are not
checkpointed), and record says which name reaches it. Exact, where it would have been wrong.

What an image holds: containers by their items (an item that is an object, by identity: each
object has its own image), plain objects by their attributes, tensors by memory and version
counter (by content where a kernel writes behind the counter, ``versions``), NumPy arrays by a
hash of their bytes (up to :data:`ARRAY_LIMIT`), random generators by their state, files and
iterators over a sequence by their position. Modules, optimizers and data loaders the registry
knows are the alias watch's; one it does not (made some way that neither ``__init__`` nor
``__setstate__`` saw) is imaged as a plain object, so a change to it stops the loop's
checkpoints instead of going unseen. Output channels (a logger, a file open for writing, a
SummaryWriter: ``channels``) are not state. Functions, classes and modules are not entered (the
project's own modules' globals are roots of their own, :func:`roots`). The walk stops after
:data:`BUDGET` objects: what it did not reach is not audited. Instances after the audited ones
are not audited either: a loop that starts changing such state later (at epoch 10) is not
caught (``docs/limitations.md``).

A generator cannot be imaged (its position is in its frame), so an iterator the loop's own
header advances is looked for by name at each instance's entry instead
(:func:`outside_iterator`).
"""

from __future__ import annotations

import ast
import collections
import hashlib
import io
import random
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

from flortrain.checkpoint import versions
from flortrain.checkpoint.channels import is_channel

#: Objects walked per image, at most (a dataset held as a Python list of samples is large).
BUDGET = 200_000
#: NumPy arrays larger than this are not hashed (identity only): not audited.
ARRAY_LIMIT = 64 << 20

_ATOMS = (int, str, bytes, bool, type(None), complex, range)
_NOT_ENTERED = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    types.CoroutineType,
)


def roots(frame: FrameType | None, project: Any = None) -> dict[str, Any]:
    """The names a loop's code can reach state through: its frame's locals and its module's
    globals, and the globals of the project's own modules (``project``: which files are, a
    ``project_files.ProjectFiles``), without dunders and flortrain's own. A helper in ``utils.py``
    counting into its module's ``COUNTS`` changes state no name of the loop's frame reaches
    (``from utils import step_fn``)."""
    if frame is None:
        return {}
    out: dict[str, Any] = {}
    for scope in (frame.f_globals, frame.f_locals):
        for k, v in scope.items():
            if not (k.startswith("__") or k.startswith("_flortrain")):
                out[k] = v
    if project is not None:
        for name, module in project_modules(project).items():
            if vars(module) is frame.f_globals:
                continue
            # the module's namespace itself, whose image shows a global rebound (`global calls;
            # calls += 1` in a helper); then each global, walked first, so that a change inside
            # one is named by it (`utils.COUNTS`)
            out[name] = vars(module)
            for k, v in vars(module).items():
                if not (k.startswith("__") or k.startswith("_flortrain")):
                    out[f"{name}.{k}"] = v
    return out


_PROJECT: dict[str, bool] = {}
#: the last answer of :func:`project_modules`: a copy of ``sys.modules`` then, the project, the
#: answer
_LAST: tuple[dict[str, Any], Any, dict[str, types.ModuleType]] | None = None


def project_modules(project: Any) -> dict[str, types.ModuleType]:
    """The imported modules whose files are the project's (each file judged once). A file under
    an installed or standard prefix is passed over by its name: resolving each of torch's
    ~1,500 module paths would hold the first audited iteration up.

    An audit asks at every loop entry and boundary it audits, and ``sys.modules`` has rarely
    changed since: the last answer stands while a copy of ``sys.modules`` taken with it still
    equals it, which compares each entry by identity first (the copy keeps every module it
    names alive, so no identity passes to a new module meanwhile). The comparison is far
    cheaper than walking every module again."""
    global _LAST
    last = _LAST
    if last is not None and last[1] is project:
        try:
            if last[0] == sys.modules:
                return dict(last[2])
        except Exception:  # a non-module entry whose ``==`` will not say: judge them all again
            pass
    out: dict[str, types.ModuleType] = {}
    excluded = tuple(getattr(project, "excluded", ()))
    snapshot = dict(sys.modules)
    for name, module in snapshot.items():
        ours = _PROJECT.get(name)
        if ours is None:
            path = getattr(module, "__file__", None)
            ours = _PROJECT[name] = (
                isinstance(path, str)
                and name != "__main__"
                and not path.startswith(excluded)
                and project.contains(path)
            )
        if ours and isinstance(module, types.ModuleType):
            out[name] = module
    _LAST = (snapshot, project, out)
    return dict(out)


class Image:
    """Shallow images of every object reachable from some roots, by identity, and the root
    name each was first reached through. The objects are held until the audit ends, so that an
    identity cannot pass to a new object meanwhile."""

    def __init__(
        self,
        named: dict[str, Any],
        leaves: bool = True,
        watched: Callable[[Any], bool] | None = None,
    ) -> None:
        self.shapes: dict[int, Any] = {}
        self.via: dict[int, str] = {}
        self.held: dict[int, Any] = {}
        stack: list[tuple[Any, str]] = [(v, k) for k, v in named.items()]
        while stack and len(self.held) < BUDGET:
            obj, name = stack.pop()
            oid = id(obj)
            if oid in self.shapes or _leaf_atom(obj):
                continue
            try:
                shape, children = _shape(obj, leaves, watched)
            except Exception:  # an object that will not say (a sparse tensor, a closed handle)
                shape, children = ("X",), []
            self.shapes[oid] = shape
            self.via[oid] = name
            self.held[oid] = obj
            stack.extend((c, name) for c in children)


def reachable(objs: Iterable[Any]) -> set[int]:
    """Identities of every object reachable from ``objs`` (the changeset's, which checkpoints
    hold), within the budget."""
    return set(Image({str(i): o for i, o in enumerate(objs)}, leaves=False).shapes)


def changed(
    before: Image,
    after: Image,
    covered: set[int],
    trained: set[int],
    named: dict[int, set[Any]] | None = None,
) -> list[str]:
    """Root names reaching an object whose image changed that ``covered`` (identities) does not
    hold, sorted. A tensor at an address in ``trained`` is a live model's or optimizer's (``w =
    model.fc.weight`` before the loop): the alias watch answers for it. ``named``: attributes
    and keys the changeset names, by owner (``self.global_step`` rebinds an attribute of
    ``self``): an object whose only changes are there changed as the changeset says."""
    names = set()
    for oid, shape in before.shapes.items():
        if oid in covered or oid not in after.shapes or after.shapes[oid] == shape:
            continue
        if shape[0] in ("T", "Tb") and after.held[oid].data_ptr() in trained:
            continue
        if named and oid in named and _slots_changed(shape, after.shapes[oid]) <= named[oid]:
            continue
        names.add(before.via[oid])
    return sorted(names)


def named_slots(exprs: Iterable[str], frame: FrameType | None) -> dict[int, set[Any]]:
    """For each changeset expression that names an attribute or a constant key of an object
    (``self.global_step``, ``stats["n"]``), that object's identity and the attribute or key. The
    owner is evaluated in the loop's frame: it is what the instrumented code reads itself."""
    out: dict[int, set[Any]] = {}
    if frame is None:
        return out
    for expr in exprs:
        try:
            tree = ast.parse(expr, mode="eval").body
            if isinstance(tree, ast.Attribute):
                slot: Any = tree.attr
            elif isinstance(tree, ast.Subscript):
                slot = ast.literal_eval(tree.slice)
            else:
                continue
            owner = eval(
                compile(ast.Expression(tree.value), "<changeset>", "eval"),
                frame.f_globals,
                frame.f_locals,
            )
        except Exception:  # not a plain path, or not bound now
            continue
        out.setdefault(id(owner), set()).add(slot)
    return out


def _slots_changed(a: Any, b: Any) -> set[Any]:
    """The attributes or keys whose items differ between two images of one dict or object
    (anything else: a marker no changeset names)."""
    if a[0] != b[0] or a[0] not in ("D", "O") or a[1] is not b[1]:
        return {_WHOLE}
    old, new = dict(a[2]), dict(b[2])  # (kind, type, ((attribute or key, item), ...))
    return {k for k in old.keys() | new.keys() if old.get(k, _WHOLE) != new.get(k, _WHOLE)}


_WHOLE = object()


def trained_addresses(modules: Iterable[Any], optimizers: Iterable[Any], torch: Any) -> set[int]:
    """Where the tensors of live models (parameters, buffers, gradients) and optimizers (state)
    are."""
    out: set[int] = set()
    for m in modules:
        for t in (*m.parameters(), *m.buffers()):
            out.add(t.data_ptr())
            if t.grad is not None:
                out.add(t.grad.data_ptr())
    for o in optimizers:
        for g in o.param_groups:  # parameters of no module (`SGD([w])`) are the optimizer's
            for t in g["params"]:
                out.add(t.data_ptr())
                if t.grad is not None:
                    out.add(t.grad.data_ptr())
        for st in o.state.values():
            out.update(v.data_ptr() for v in st.values() if isinstance(v, torch.Tensor))
    out.discard(0)
    return out


def _leaf_atom(obj: Any) -> bool:
    return isinstance(obj, (*_ATOMS, float))


def _token(x: Any) -> Any:
    """An item as its container's image holds it: a value by value, an object by identity."""
    if isinstance(x, float):
        return ("f", x.hex()) if x == x else ("f", "nan")
    if isinstance(x, _ATOMS):
        return x
    return ("@", id(x))


def _shape(
    obj: Any, leaves: bool = True, watched: Callable[[Any], bool] | None = None
) -> tuple[Any, list[Any]]:
    """An object's shallow image, and the objects it refers to (walked in turn). ``leaves``:
    whether to image objects that refer to nothing walked (tensors, arrays, generators, files);
    without, only what refers onwards is read, for :func:`reachable`. ``watched``: whether the
    alias watch has a module, optimizer or data loader (the registry knows it); one it does not
    is imaged as a plain object, by its attributes (None: all are the watch's)."""
    if isinstance(obj, dict):
        items = list(obj.items())
        return ("D", type(obj), tuple((_token(k), _token(v)) for k, v in items)), [
            v for _, v in items
        ]
    if isinstance(obj, list | tuple):
        return ("L", type(obj), tuple(_token(x) for x in obj)), list(obj)
    if isinstance(obj, set | frozenset):
        return ("S", frozenset(_token(x) for x in obj)), list(obj)
    if isinstance(obj, collections.deque):
        items = list(obj)
        return ("L", type(obj), tuple(_token(x) for x in items)), items
    if isinstance(obj, _NOT_ENTERED):
        return ("X",), []
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and isinstance(obj, torch.nn.Module | torch.optim.Optimizer | torch.utils.data.DataLoader)
        and (watched is None or watched(obj))
    ):
        return ("X",), []  # the alias watch's
    leaf = _leaf(obj, torch)
    if leaf is not None:
        return (leaf(obj) if leaves else ("X",)), []
    if is_channel(obj):
        return ("X",), []  # where the script writes, not state (``channels``)
    attrs = _attributes(obj)
    if attrs is None:
        return ("X",), []
    return ("O", type(obj), tuple((k, _token(v)) for k, v in attrs)), [v for _, v in attrs]


def _leaf(obj: Any, torch: Any) -> Callable[[Any], Any] | None:
    """How to image an object that refers to nothing the walk enters; None for any other."""
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            return lambda t: tensor_image(t, torch)
        if isinstance(obj, torch.Generator):
            return lambda g: ("G", bytes(g.get_state().numpy().tobytes()))
    if type(obj).__module__.split(".", 1)[0] == "numpy":
        return _numpy
    if isinstance(obj, random.Random):
        return lambda r: ("R", r.getstate())
    if isinstance(obj, _SEQUENCE_ITERATORS):
        return _iterator_position
    if isinstance(obj, io.IOBase):
        # a file open for writing only is a channel: its position moves with the output
        return (lambda f: ("X",)) if is_channel(obj) else (lambda f: ("F", _position(f)))
    return None


#: Iterators over a sequence, whose position ``__reduce__`` tells (``stream = iter(batches)``
#: consumed by ``itertools.islice(stream, 6)`` inside the loop)
_SEQUENCE_ITERATORS: tuple[type, ...] = (
    type(iter([])),
    type(iter(())),
    type(iter(range(0))),
    type(iter("")),
)


def _iterator_position(it: Any) -> Any:
    reduced = it.__reduce__()
    return ("I", reduced[2] if len(reduced) > 2 else "exhausted")


def _attributes(obj: Any) -> list[tuple[str, Any]] | None:
    """An object's attributes from its ``__dict__`` and ``__slots__``; None where it has neither
    (an extension type: not audited)."""
    out: list[tuple[str, Any]] = []
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        out.extend(d.items())
    for cls in type(obj).__mro__:
        for slot in _slots(cls):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out.append((slot, getattr(obj, slot)))
    return out if out or isinstance(d, dict) else None


def _slots(cls: type) -> Iterator[str]:
    s = cls.__dict__.get("__slots__", ())
    yield from ((s,) if isinstance(s, str) else s)


def tensor_image(t: Any, torch: Any) -> Any:
    """A tensor by memory and version counter, or by a digest of its bytes where the counter
    cannot be trusted (``versions``) or there is none (an inference tensor)."""
    try:
        version = t._version
    except RuntimeError:  # an inference tensor
        version = None
    if version is None or versions.untrusted(t):
        return ("Tb", _digest(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
    return ("T", t.data_ptr(), tuple(t.shape), t.dtype, version)


def _numpy(obj: Any) -> Any:
    np = sys.modules["numpy"]
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.nbytes > ARRAY_LIMIT:
            return ("X",)  # not audited: its items are objects, or it is too large to hash
        return ("A", obj.shape, obj.dtype.str, _digest(np.ascontiguousarray(obj)))
    if isinstance(obj, np.random.Generator):
        return ("NG", repr(obj.bit_generator.state))
    if isinstance(obj, np.random.RandomState):
        return ("NR", repr(obj.get_state(legacy=False)))
    if isinstance(obj, np.random.BitGenerator):
        return ("NB", repr(obj.state))
    return ("X",)


def _digest(a: Any) -> str:
    return hashlib.blake2b(memoryview(a).cast("B"), digest_size=16).hexdigest()


def _position(f: Any) -> Any:
    try:
        return None if f.closed else f.tell()
    except (OSError, ValueError):
        return None


#: Iterators whose ``__reduce__`` names the iterators they draw from: ``zip``, ``enumerate``,
#: ``map``, ``filter`` and ``itertools``' (in 3.11-3.13; ``itertools`` warns of its removal).
_WRAPPERS = (zip, enumerate, map, filter)


def _drawn_from(it: Any, depth: int = 0) -> list[Any]:
    """``it`` if it is an iterator (a type with ``__next__``; a list, a range or a DataLoader is
    not: ``for`` iterates a fresh iterator of theirs), and the iterators it draws from."""
    if not hasattr(type(it), "__next__"):
        return []
    out = [it]
    if depth < 4 and (isinstance(it, _WRAPPERS) or type(it).__module__ == "itertools"):
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                reduced = it.__reduce__()
        except Exception:  # no way in: what it draws from stays unseen
            return out
        args = (
            reduced[1]
            if isinstance(reduced, tuple) and len(reduced) > 1 and isinstance(reduced[1], tuple)
            else ()
        )
        for a in args:
            out += _drawn_from(a, depth + 1)
    return out


def outside_iterator(iterable: Any, frame: FrameType) -> str | None:
    """The name by which ``frame`` holds an iterator a ``for`` loop over ``iterable`` advances,
    or None. ``for x in gen``, ``zip(range(3), gen)`` and ``itertools.islice(gen, 3)`` all
    advance ``gen``, a generator made before the loop, which no static rule sees and no image
    can compare (a generator's position is in its frame); a skipped instance would leave it
    where it was. An iterator made by the loop's header from a container
    (``enumerate(loader)``: the DataLoader's fresh iterator) is not held by any name, so it is
    not reported. Names are looked up among the frame's locals and globals and, one level down,
    their attributes (``self.batches``)."""
    drawn = {id(x) for x in _drawn_from(iterable)}
    if not drawn:
        return None
    scopes: list[tuple[str, dict[str, Any]]] = [("", frame.f_locals)]
    if frame.f_globals is not frame.f_locals:
        scopes.append(("", frame.f_globals))
    for prefix, scope in scopes:
        for name, v in list(scope.items()):
            if id(v) in drawn:
                return prefix + name
            attrs = getattr(v, "__dict__", None)
            if type(attrs) is dict and not isinstance(v, _NOT_ENTERED):
                for attr, a in list(attrs.items()):
                    if id(a) in drawn:
                        return f"{name}.{attr}"
    return None
