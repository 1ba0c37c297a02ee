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
checkpoints hold it; see :mod:`flortrain.checkpoint.materializer`). Tensors sharing memory (a
parameter in a module's ``state_dict`` and in the optimizer's ``params``) are stored once.

The split (:func:`stage`) is what the training thread pays for; hashing and writing are left to
whoever writes the blob. A part's digest hashes its skeleton, pickled without a memo (so equal
values give equal bytes whatever object identities the process happened to share), and its
tensors' dtypes, shapes and names (XXH3-128). Each tensor of a part also gets a digest of its own,
keyed by the part's name and the tensor's path in it (``extra:module#0/weight``,
``objects:opt/state.0.momentum_buffer``, ``names:w/grad``), so that a part that differs is
reported by the first tensor in it that does. ``diff`` and ``verify`` compare them where a run
executes a checkpointed instance (:mod:`flortrain.checkpoint.digest`). Sets are stored sorted by ``repr``:
their iteration order follows string hashing, which differs in every process.

A payload this format cannot take (a sparse, quantized or meta tensor; a tensor subclass; a
self-referencing structure) raises :class:`Unsupported`: the caller falls back to
``torch.save``. Objects other than plain containers are pickled the ordinary way (a tensor
inside one too: correct, only slower).
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flortrain.checkpoint.kinds import library_module
from flortrain.checkpoint.skeleton import SECTIONS, ModuleName, Ref, Skeleton, SortedSet, stage
from flortrain.store import content

MAGIC = b"G"
_ALIGN = 16


class Pickler(pickle.Pickler):
    """``pickle.Pickler`` storing a library module by name, as :class:`ModuleName` does: for the
    payloads that do not take this format (a script without torch, the ``torch.save``
    fallback, through :data:`PICKLE_MODULE`)."""

    def reducer_override(self, obj: Any) -> Any:
        if (name := library_module(obj)) is not None:
            return ModuleName(name).__reduce__()
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
    if t is Ref:
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
    if t is SortedSet:
        items = [_join(x, tensors) for x in v.items]
        return frozenset(items) if v.frozen else set(items)
    return v
