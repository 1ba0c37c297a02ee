"""A checkpoint payload split for staging: each part's skeleton, and the tensors it refers to.

The split (:func:`stage`) is what the training thread pays for before training goes on: every
non-tensor object pickled into its part's skeleton, every tensor replaced by an index into one
table, deduplicated by memory (``codec.py`` says how a blob lays them out). Hashing and writing
are left to whoever writes the blob.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import pickle
import types
from collections import OrderedDict
from typing import Any

from flortrain.checkpoint.kinds import library_module

#: The payload sections whose entries are digested one by one.
SECTIONS = ("objects", "extra", "names")

#: A part's name, its skeleton's digest, its local-to-global tensor map, and the path of each
#: tensor reference in it (in the skeleton's order) with the reference's local index.
Skeleton = tuple[str | None, str, list[int], list[tuple[str, int]]]


class Ref:
    """A tensor's place in a part's skeleton: its index in the part's tensor list, and for a
    leaf that trains (a rebound ``w = (w - lr * g).detach().requires_grad_()``, a new
    ``nn.Parameter``) what its bytes leave out: whether it is a Parameter, ``requires_grad``,
    and its gradient's skeleton. Without them such a name would come back a plain tensor that
    no longer required grad."""

    __slots__ = ("i", "leaf", "view")

    def __init__(
        self,
        i: int,
        leaf: tuple[bool, bool, Any] | None = None,
        view: tuple[Any, ...] | None = None,
    ) -> None:
        self.i = i
        self.leaf = leaf
        #: (shape, stride, offset) into tensor ``i``, a span of storage other tensors of the
        #: payload share (:meth:`_Splitter.share`)
        self.view = view

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Ref, (self.i, self.leaf, self.view))


class SortedSet:
    """A set or frozenset, its elements sorted by ``repr`` (a process-independent order)."""

    __slots__ = ("frozen", "items")

    def __init__(self, frozen: bool, items: list[Any]) -> None:
        self.frozen = frozen
        self.items = items

    def __reduce__(self) -> tuple[Any, tuple[bool, list[Any]]]:
        return (SortedSet, (self.frozen, self.items))


class Unsupported(Exception):
    """The payload holds something this format does not take; use torch.save."""


class Staged:
    """A payload split for writing: what the training thread must produce before it goes on.

    ``parts`` is the pickled list of (path, skeleton, local-to-global tensor map): the snapshot of
    every non-tensor object. ``tensors`` still references the live (detached) tensors, deduplicated
    by memory; the caller copies them before training goes on. ``skeletons`` holds each part's
    skeleton digest, finished into a part digest once the tensors' sha256 are known."""

    __slots__ = ("metas", "parts", "skeletons", "tensors")

    def __init__(
        self,
        parts: bytes,
        skeletons: list[Skeleton],
        metas: list[tuple[str, tuple[int, ...], int]],
        tensors: list[Any],
    ) -> None:
        self.parts = parts
        self.skeletons = skeletons
        self.metas = metas
        self.tensors = tensors

    @property
    def nbytes(self) -> int:
        return sum(m[2] for m in self.metas)


class ModuleName:
    """A library module held in the state (``cfg = {"lib": math}``, a list of backends), stored by
    its name (:func:`~flortrain.checkpoint.kinds.library_module`): a module object cannot be pickled,
    and refusing it would leave every checkpoint of such a loop unwritten. Unpickling imports the
    name, which gives back the object ``sys.modules`` holds: the one the state held. Its ``repr`` is
    its name, so a set of modules sorts the same in every process (:class:`SortedSet`)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (importlib.import_module, (self.name,))

    def __repr__(self) -> str:
        return f"ModuleName({self.name!r})"


#: types whose values hold no tensor and no other object: a sequence of them is its own skeleton
_ATOMS = frozenset({int, float, bool, str, bytes, type(None), complex})


class _Splitter:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.tensors: list[Any] = []  # global table, deduplicated
        self.index: dict[tuple[Any, ...], int] = {}
        self.metas: list[tuple[str, tuple[int, ...], int]] = []
        self.storages: set[int] = set()
        #: two tensors of the table share storage, or one is not contiguous (:meth:`share`)
        self.irregular = False

    def part(self, value: Any) -> tuple[Any, list[int]]:
        """A part's skeleton and its local-to-global tensor map."""
        local: list[int] = []
        return self._split(value, local), local

    def digest(self, skeleton: Any) -> str:
        """A skeleton's digest."""
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=5)
        p.fast = True  # no memo: the bytes depend on values, not on which objects were shared
        try:
            p.dump(skeleton)
        except (RecursionError, ValueError, pickle.PicklingError, TypeError, AttributeError) as e:
            raise Unsupported(str(e)) from None
        return hashlib.blake2b(buf.getbuffer(), digest_size=16).hexdigest()

    def _split(self, v: Any, local: list[int]) -> Any:
        t = type(v)
        if t in _ATOMS:  # most leaves (hyperparameters, flags): before the slower tests below
            return v
        if t is dict:
            return {k: self._split(x, local) for k, x in v.items()}
        if t is OrderedDict:  # a state_dict
            return OrderedDict([(k, self._split(x, local)) for k, x in v.items()])
        if (t is list or t is tuple) and set(map(type, v)) <= _ATOMS:
            # Python's RNG state is 625 ints: splitting it item by item cost more than the rest
            # of a small checkpoint. The skeleton may share an immutable tuple; a list is copied
            # (the snapshot must not change with the live object).
            return list(v) if t is list else v
        if t is list:
            return [self._split(x, local) for x in v]
        if t is tuple:
            return tuple([self._split(x, local) for x in v])
        if t is set or t is frozenset:
            return SortedSet(t is frozenset, sorted((self._split(x, local) for x in v), key=repr))
        if isinstance(v, types.ModuleType) and (name := library_module(v)) is not None:
            return ModuleName(name)
        torch = self.torch
        if isinstance(v, torch.Tensor):
            if (
                t not in (torch.Tensor, torch.nn.Parameter)
                or v.layout is not torch.strided
                or (v.is_quantized or v.device.type == "meta")
            ):
                raise Unsupported(f"a {t.__name__} ({v.layout})")
            local.append(self._tensor(v.detach()))
            ref = Ref(len(local) - 1)
            if t is torch.nn.Parameter or v.requires_grad or v.grad is not None:
                grad = v.grad if v.grad is not None and type(v.grad) is torch.Tensor else None
                ref.leaf = (
                    t is torch.nn.Parameter,
                    v.requires_grad,
                    None if grad is None else self._split(grad, local),
                )
            return ref
        return v

    def _tensor(self, d: Any) -> int:
        ptr = d.untyped_storage().data_ptr()
        key = (ptr, d.storage_offset(), tuple(d.shape), tuple(d.stride()), d.dtype)
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.tensors)
            self.tensors.append(d)
            self.metas.append(_meta(d))
            if d.numel():
                if ptr in self.storages or not d.is_contiguous():
                    self.irregular = True
                self.storages.add(ptr)
        return i

    def share(self, locals_: list[list[int]], skeletons: list[Any]) -> None:
        """Keep the tensors of the payload that share storage views of one another, and a
        non-contiguous tensor its strides: each such group is staged as one span of its storage,
        and each member becomes a view of it (``Ref.view``). Copied one by one, ``head =
        flat[:3]`` would come back a tensor a later ``flat.mul_(2)`` no longer reached, and ``wt =
        x.t()`` would come back contiguous. A group whose span is more
        than twice its members' size (two rows far apart in a big table) stays copied one by one:
        values right, sharing lost (docs/limitations.md)."""
        torch = self.torch
        groups: dict[int, list[int]] = {}
        for g, t in enumerate(self.tensors):
            if t.numel():
                groups.setdefault(t.untyped_storage().data_ptr(), []).append(g)
        geometry: dict[int, tuple[int, tuple[Any, ...]]] = {}
        for members in groups.values():
            ts = [self.tensors[g] for g in members]
            if (len(ts) == 1 and ts[0].is_contiguous()) or len({t.dtype for t in ts}) > 1:
                continue
            lo = min(t.storage_offset() for t in ts)
            hi = max(
                t.storage_offset()
                + 1
                + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
                for t in ts
            )
            if hi - lo > 2 * sum(t.numel() for t in ts) + 1024:
                continue
            base = torch.as_strided(ts[0], (hi - lo,), (1,), lo)
            b = len(self.tensors)
            self.tensors.append(base)
            self.metas.append(_meta(base))
            for g, t in zip(members, ts, strict=True):
                geometry[g] = (b, (tuple(t.shape), tuple(t.stride()), t.storage_offset() - lo))
        if not geometry:
            return
        for skeleton, local in zip(skeletons, locals_, strict=True):
            for ref in _refs(skeleton):
                g = local[ref.i]
                if g in geometry:
                    local[ref.i], ref.view = geometry[g]
        # the members are staged only through their span now: drop them from the table
        keep = [g for g in range(len(self.tensors)) if g not in geometry]
        new = {g: j for j, g in enumerate(keep)}
        self.tensors = [self.tensors[g] for g in keep]
        self.metas = [self.metas[g] for g in keep]
        for local in locals_:
            local[:] = [new[g] for g in local]


def _meta(d: Any) -> tuple[str, tuple[int, ...], int]:
    return (str(d.dtype).removeprefix("torch."), tuple(d.shape), d.numel() * d.element_size())


def _refs(v: Any) -> list[Ref]:
    """Every tensor reference in a skeleton, a leaf's gradient's included."""
    out: list[Ref] = []
    stack = [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is Ref:
            out.append(x)
            if x.leaf is not None and x.leaf[2] is not None:
                stack.append(x.leaf[2])
        elif t is dict or t is OrderedDict:
            stack.extend(x.values())
        elif t is list or t is tuple:
            stack.extend(x)
        elif t is SortedSet:
            stack.extend(x.items)
    return out


def _paths(v: Any, path: str, out: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Each tensor reference in a skeleton, as (its path, its local index), in skeleton order:
    dict keys joined by dots, sequence positions as numbers, a leaf's gradient as ``grad``."""
    t = type(v)
    if t is Ref:
        out.append((path, v.i))
        if v.leaf is not None and v.leaf[2] is not None:
            _paths(v.leaf[2], f"{path}.grad" if path else "grad", out)
    elif t is dict or t is OrderedDict:
        for k, x in v.items():
            _paths(x, f"{path}.{k}" if path else str(k), out)
    elif t is list or t is tuple:
        if not set(map(type, v)) <= _ATOMS:
            for k, x in enumerate(v):
                _paths(x, f"{path}.{k}" if path else str(k), out)
    elif t is SortedSet:
        for k, x in enumerate(v.items):
            _paths(x, f"{path}.{k}" if path else str(k), out)
    return out


def stage(payload: dict[str, Any], torch: Any) -> Staged:
    """Split a checkpoint payload into its pickled skeletons and its tensors (see the module
    docstring). Raises :class:`Unsupported` for what this format cannot take."""
    s = _Splitter(torch)
    parts: list[tuple[tuple[str, ...], Any, list[int]]] = []
    for section in SECTIONS:
        for key, value in payload.get(section, {}).items():
            parts.append(((section, key), *s.part(value)))
    parts.append(((), *s.part({k: v for k, v in payload.items() if k not in SECTIONS})))
    if s.irregular:
        s.share([p[2] for p in parts], [p[1] for p in parts])
    skeletons: list[Skeleton] = [
        # the rest (RNG states, registry) is not compared: not pickled twice for nothing
        (f"{path[0]}:{path[1]}", s.digest(skeleton), local, _paths(skeleton, "", []))
        if path
        else (None, "", local, [])
        for path, skeleton, local in parts
    ]
    try:
        pickled = pickle.dumps(parts, protocol=5)
    except Exception as e:
        raise Unsupported(str(e)) from None
    return Staged(pickled, skeletons, s.metas, s.tensors)
