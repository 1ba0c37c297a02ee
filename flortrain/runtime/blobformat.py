"""The checkpoint blob format, and the state digests ``diff`` compares.

``torch.save`` pickles each tensor through Python-level reducers and persistent ids, which
dominates the cost of a checkpoint whose state is many small tensors and flags (a small GPT and
its AdamW: ~100 tensors, ~3,000 Python objects). Every millisecond a checkpoint holds training
up makes the adaptive period sparser (Flor Eq. 4), and a sparse record replays slowly. A blob is:

    b"G" | header length (8 bytes, little endian) | pickle(header) | inline tensor bytes

The payload is split into *parts* (each named object, augmented object and rebound name of the
block, then the rest: RNG states, registry bookkeeping). Each part's *skeleton* is the part with
every tensor replaced by a local index. The header holds the pickled skeletons, each part's map
from local to global tensor index, each tensor's dtype, shape and size, and where its bytes are:
inline after the header (16-byte aligned, viewed in place when read), or, for a large tensor the
background materializer wrote, in the store's content-addressed objects (``objects/ab/<name>``,
:mod:`flortrain.store.content`: a frozen embedding table is written once, however many
checkpoints hold it; see :mod:`flortrain.runtime.materializer`). Tensors sharing memory (a
parameter in a module's ``state_dict`` and in the optimizer's ``params``) are stored once.

The split (:func:`stage`) is what the training thread pays for; hashing and writing are left to
whoever writes the blob. A part's digest hashes its skeleton, pickled without a memo (so equal
values give equal bytes whatever object identities the process happened to share), and its
tensors' dtypes, shapes and names (XXH3-128). Each tensor of a part also gets a digest of its own,
keyed by the part's name and the tensor's path in it (``extra:module#0/weight``,
``objects:opt/state.0.momentum_buffer``, ``names:w/grad``), so that a part that differs is
reported by the first tensor in it that does. ``diff`` and ``verify`` compare them where a run
executes a checkpointed instance (:mod:`flortrain.runtime.digest`). Sets are stored sorted by ``repr``:
their iteration order follows string hashing, which differs in every process.

A payload this format cannot take (a sparse, quantized or meta tensor; a tensor subclass; a
self-referencing structure) raises :class:`Unsupported`: the caller falls back to
``torch.save``. Objects other than plain containers are pickled the ordinary way (a tensor
inside one too: correct, only slower).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import pickle
import sys
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flortrain.runtime.state import library_module
from flortrain.store import content

MAGIC = b"G"
_ALIGN = 16
#: The payload sections whose entries are digested one by one.
SECTIONS = ("objects", "extra", "names")

#: A part's name, its skeleton's digest, its local-to-global tensor map, and the path of each
#: tensor reference in it (in the skeleton's order) with the reference's local index.
Skeleton = tuple[str | None, str, list[int], list[tuple[str, int]]]


class _Ref:
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
        return (_Ref, (self.i, self.leaf, self.view))


class _Set:
    """A set or frozenset, its elements sorted by ``repr`` (a process-independent order)."""

    __slots__ = ("frozen", "items")

    def __init__(self, frozen: bool, items: list[Any]) -> None:
        self.frozen = frozen
        self.items = items

    def __reduce__(self) -> tuple[Any, tuple[bool, list[Any]]]:
        return (_Set, (self.frozen, self.items))


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


class _Module:
    """A library module held in the state (``cfg = {"lib": math}``, a list of backends), stored by
    its name (:func:`~flortrain.runtime.state.library_module`): a module object cannot be pickled,
    and refusing it would leave every checkpoint of such a loop unwritten. Unpickling imports the
    name, which gives back the object ``sys.modules`` holds: the one the state held. Its ``repr`` is
    its name, so a set of modules sorts the same in every process (:class:`_Set`)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (importlib.import_module, (self.name,))

    def __repr__(self) -> str:
        return f"_Module({self.name!r})"


class Pickler(pickle.Pickler):
    """``pickle.Pickler`` storing a library module by name, as :class:`_Module` does: for the
    payloads that do not take this format (a script without torch, the ``torch.save``
    fallback, through :data:`PICKLE_MODULE`)."""

    def reducer_override(self, obj: Any) -> Any:
        if (name := library_module(obj)) is not None:
            return _Module(name).__reduce__()
        return NotImplemented


def pickle_dumps(obj: Any) -> bytes:
    """``pickle.dumps`` with :class:`Pickler`."""
    buf = io.BytesIO()
    Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


#: what ``torch.save(pickle_module=...)`` needs of a pickle module, with :class:`Pickler`
PICKLE_MODULE = types.SimpleNamespace(
    __name__=__name__,
    Pickler=Pickler,
    Unpickler=pickle.Unpickler,
    dump=pickle.dump,
    load=pickle.load,
)


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
            return _Set(t is frozenset, sorted((self._split(x, local) for x in v), key=repr))
        if isinstance(v, types.ModuleType) and (name := library_module(v)) is not None:
            return _Module(name)
        torch = self.torch
        if isinstance(v, torch.Tensor):
            if (
                t not in (torch.Tensor, torch.nn.Parameter)
                or v.layout is not torch.strided
                or (v.is_quantized or v.device.type == "meta")
            ):
                raise Unsupported(f"a {t.__name__} ({v.layout})")
            local.append(self._tensor(v.detach()))
            ref = _Ref(len(local) - 1)
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
        and each member becomes a view of it (``_Ref.view``). Copied one by one, ``head =
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


def _refs(v: Any) -> list[_Ref]:
    """Every tensor reference in a skeleton, a leaf's gradient's included."""
    out: list[_Ref] = []
    stack = [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is _Ref:
            out.append(x)
            if x.leaf is not None and x.leaf[2] is not None:
                stack.append(x.leaf[2])
        elif t is dict or t is OrderedDict:
            stack.extend(x.values())
        elif t is list or t is tuple:
            stack.extend(x)
        elif t is _Set:
            stack.extend(x.items)
    return out


def _paths(v: Any, path: str, out: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Each tensor reference in a skeleton, as (its path, its local index), in skeleton order:
    dict keys joined by dots, sequence positions as numbers, a leaf's gradient as ``grad``."""
    t = type(v)
    if t is _Ref:
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
    elif t is _Set:
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


def part_digests(
    skeletons: list[Skeleton],
    metas: list[tuple[str, tuple[int, ...], int]],
    tensor_names: list[str],
) -> dict[str, str]:
    """Each named part's digest: its skeleton's, and the dtype, shape and name
    (``store/content.py``) of its tensors; then each tensor's below it, ``part/path`` (a part
    that is one tensor, a rebound ``w``, has none: the part names it)."""
    out: dict[str, str] = {}
    for name, digest, local, paths in skeletons:
        if name is None:
            continue
        h = hashlib.blake2b(digest.encode(), digest_size=16)
        for g in local:
            dtype, shape, _ = metas[g]
            h.update(f"{dtype}{shape}{tensor_names[g]}".encode())
        out[name] = "f" + h.hexdigest()  # "f": this format's digest
        for path, i in paths:
            if path:
                dtype, shape, _ = metas[local[i]]
                t = hashlib.blake2b(
                    f"{dtype}{shape}{tensor_names[local[i]]}".encode(), digest_size=8
                )
                out[f"{name}/{path}"] = "t" + t.hexdigest()  # "t": one tensor's bytes
    return out


def tensor_bytes(t: Any, torch: Any) -> memoryview:
    """A tensor's bytes, without a copy when it is a contiguous CPU tensor."""
    return memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).cast("B")


def tensor_name(t: Any, torch: Any) -> str:
    """The name of a tensor's bytes (:func:`tensor_bytes`, ``store/content.py``): the name of its
    object."""
    return content.name(tensor_bytes(t, torch))


def header(
    parts: bytes, metas: list[tuple[str, tuple[int, ...], int]], table: list[tuple[str, Any]]
) -> bytes:
    """The head of a blob: MAGIC, the header's length, the header. ``table[g]`` places tensor g:
    ``("i", offset)`` in the blob's own bytes after the header, ``("x", name)`` in the store's
    content-addressed objects, ``("k", name)`` nowhere: a module tensor unchanged since the
    main loop's entry, which a replay's own prologue makes again (``ChangeTracker.enter``)."""
    h = pickle.dumps((parts, metas, table), protocol=5)
    return MAGIC + len(h).to_bytes(8, "little") + h


def inline(raws: list[Any]) -> tuple[list[int], list[Any]]:
    """The blob's bytes after its header: each tensor's offset there, and the chunks to write
    (each tensor's bytes, padded to the alignment that lets a reader view it in place)."""
    offsets: list[int] = []
    chunks: list[Any] = []
    off = 0
    for r in raws:
        offsets.append(off)
        chunks.append(r)
        pad = -len(r) % _ALIGN
        if pad:
            chunks.append(b"\0" * pad)
        off += len(r) + pad
    return offsets, chunks


def dumps(payload: dict[str, Any], torch: Any) -> tuple[bytes, dict[str, str]]:
    """A self-contained blob of a checkpoint payload (every tensor inline) and its part digests."""
    st = stage(payload, torch)
    raws = [tensor_bytes(t, torch) for t in st.tensors]
    names = [content.name(r) for r in raws]
    offsets, chunks = inline(raws)
    head = header(st.parts, st.metas, [("i", off) for off in offsets])
    return b"".join([head, *chunks]), part_digests(st.skeletons, st.metas, names)


def digests(payload: dict[str, Any], torch: Any) -> dict[str, str]:
    """The part digests :func:`dumps` would give, without building the blob."""
    st = stage(payload, torch)
    names = [tensor_name(t, torch) for t in st.tensors]
    return part_digests(st.skeletons, st.metas, names)


def loads(
    data: bytes,
    torch: Any,
    objects: Callable[[str], bytes | None] | None = None,
    live: Callable[[str, int], bytes | memoryview | None] | None = None,
) -> dict[str, Any]:
    """The payload of a blob. ``objects(name)`` reads a content-addressed tensor, verified against
    its name (``store/content.py``; None when it is missing or does not verify:
    :class:`MissingObject` is raised). ``live(name, nbytes)`` is asked for one the store does not
    have: a tensor the checkpoint only named, because it was unchanged since the main loop's entry
    (``ChangeTracker.enter``)."""
    (parts_bytes, metas, table), body = _read_header(data)
    parts = pickle.loads(parts_bytes)
    buf = bytearray(memoryview(data)[body:])  # one copy, writable: tensors view it in place
    tensors = []
    for (dtype, shape, nbytes), (where, arg) in zip(metas, table, strict=True):
        if not nbytes:
            raw = torch.empty(0, dtype=torch.uint8)
        elif where == "i":
            raw = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=arg)
        elif where == "k":
            obj = live(arg, nbytes) if live is not None else None
            if obj is None or len(obj) != nbytes:
                raise MissingObject(
                    f"it names a {nbytes}-byte module tensor unchanged since the main loop's entry"
                    f" (name {arg[:12]}) that no live module tensor matches: the code before the"
                    " loop made it differently this time (an unseeded initialization?)"
                )
            raw = torch.frombuffer(bytearray(obj), dtype=torch.uint8)
        else:
            obj = objects(arg) if objects is not None else None
            if obj is None or len(obj) != nbytes:
                raise MissingObject(f"tensor object {arg[:12]} is missing or corrupt")
            raw = torch.frombuffer(
                bytearray(obj), dtype=torch.uint8
            )  # a copy: callers may write it
        tensors.append(raw.view(getattr(torch, dtype)).reshape(shape))
    payload: dict[str, Any] = {s: {} for s in SECTIONS}
    for path, skeleton, local in parts:
        value = _join(skeleton, [tensors[g] for g in local])
        if path:
            payload[path[0]][path[1]] = value
        else:
            payload.update(value)
    return payload


def object_refs(data: bytes) -> list[str]:
    """The sha256 of each content-addressed object a blob refers to, from its header alone: what
    a replay's read-ahead (``store.blobs``) reads before the blob is loaded. A blob of another
    format (pickled, or ``torch.save``'s) refers to none."""
    if data[:1] != MAGIC:
        return []
    (_, _, table), _ = _read_header(data)
    return [arg for where, arg in table if where == "x"]


def _read_header(data: bytes) -> tuple[Any, int]:
    """A blob's unpickled header (skeleton parts, metas, table) and where its inline bytes start."""
    n = int.from_bytes(data[1:9], "little")
    return pickle.loads(data[9 : 9 + n]), 9 + n


class MissingObject(Exception):
    """A content-addressed tensor a blob refers to is missing or does not verify."""


def _join(v: Any, tensors: list[Any]) -> Any:
    t = type(v)
    if t is _Ref:
        x = tensors[v.i]
        if v.view is not None:
            x = x.as_strided(*v.view)
        if v.leaf is not None:
            param, requires_grad, grad = v.leaf
            if param:
                x = sys.modules["torch"].nn.Parameter(x, requires_grad=requires_grad)
            elif requires_grad and (x.is_floating_point() or x.is_complex()):
                x.requires_grad_(True)
            if grad is not None and x.requires_grad:
                x.grad = _join(grad, tensors)
        return x
    if t is dict or t is OrderedDict:
        return t((k, _join(x, tensors)) for k, x in v.items())
    if t is list:
        return [_join(x, tensors) for x in v]
    if t is tuple:
        return tuple(_join(x, tensors) for x in v)
    if t is _Set:
        items = [_join(x, tensors) for x in v.items]
        return frozenset(items) if v.frozen else set(items)
    return v
