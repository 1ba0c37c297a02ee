"""The checkpoint blob format, and the state digests computed while writing it.

``torch.save`` pickles each tensor through Python-level reducers and persistent ids, which
dominates the cost of a checkpoint whose state is many small tensors and flags (a small GPT and
its AdamW: ~100 tensors, ~3,000 Python objects: 6.6 ms per checkpoint here, against 2.4 ms in
this format). Every millisecond a checkpoint holds training up makes the adaptive period
sparser (Flor Eq. 4), and a sparse record replays slowly. A blob is:

    b"F" | header length (8 bytes, little endian) | pickle(header) | tensor bytes

The payload is split into *parts* (each named object, augmented object and rebound name of the
block, then the rest: RNG states, registry bookkeeping). Each part's *skeleton* is the part with
every tensor replaced by a local index; the header holds the skeletons, each part's map from
local to global tensor index, and each tensor's dtype, shape and byte offset (16-byte aligned,
so tensors are viewed in place when read). Tensors sharing memory (a parameter in a module's
``state_dict`` and in the optimizer's ``params``) are stored once.

A part's digest is a hash of its skeleton, pickled without a memo (so equal values give equal
bytes whatever object identities the process happened to share), and of its tensors' dtypes,
shapes and bytes. ``diff`` compares them where a replay executes a checkpointed instance (see
:mod:`flortrain.runtime.digest`). Sets are stored sorted by ``repr``: their iteration order
follows string hashing, which differs in every process.

A payload this format cannot take (a sparse, quantized or meta tensor; a tensor subclass; a
self-referencing structure) raises :class:`Unsupported`: the caller falls back to
``torch.save``. Objects other than plain containers are pickled the ordinary way (a tensor
inside one too: correct, only slower). CUDA tensors are copied to the CPU here (untested on
this machine: no GPU).
"""

from __future__ import annotations

import hashlib
import io
import pickle
from collections import OrderedDict
from typing import Any

MAGIC = b"F"
_ALIGN = 16
#: The payload sections whose entries are digested one by one.
SECTIONS = ("objects", "extra", "names")


class _Ref:
    """A tensor's place in a part's skeleton: its index in the part's tensor list."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_Ref, (self.i,))


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


class _Writer:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.tensors: list[Any] = []  # global table, deduplicated
        self.index: dict[tuple[Any, ...], int] = {}
        self.metas: list[tuple[str, tuple[int, ...], int, int]] = []
        self.chunks: list[Any] = []
        self.raw: list[Any] = []  # each global tensor's bytes, for the digests
        self.offset = 0

    def part(self, value: Any) -> tuple[Any, list[int], str]:
        """A part's skeleton, its local-to-global tensor map, and its digest."""
        local: list[int] = []
        skeleton = self._split(value, local)
        h = hashlib.blake2b(digest_size=16)
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=5)
        p.fast = True  # no memo: the bytes depend on values, not on which objects were shared
        try:
            p.dump(skeleton)
        except (RecursionError, ValueError, pickle.PicklingError, TypeError, AttributeError) as e:
            raise Unsupported(str(e)) from None
        h.update(buf.getvalue())
        for g in local:
            dtype, shape, _, _ = self.metas[g]
            h.update(f"{dtype}{shape}".encode())
            h.update(self.raw[g])
        return skeleton, local, "f" + h.hexdigest()  # "f": this format's digest

    def _split(self, v: Any, local: list[int]) -> Any:
        t = type(v)
        if t is dict or t is OrderedDict:  # a state_dict is an OrderedDict
            return t((k, self._split(x, local)) for k, x in v.items())
        if t is list:
            return [self._split(x, local) for x in v]
        if t is tuple:
            return tuple(self._split(x, local) for x in v)
        if t is set or t is frozenset:
            return _Set(t is frozenset, sorted((self._split(x, local) for x in v), key=repr))
        torch = self.torch
        if isinstance(v, torch.Tensor):
            if t not in (torch.Tensor, torch.nn.Parameter) or v.layout is not torch.strided or (
                v.is_quantized or v.device.type == "meta"
            ):
                raise Unsupported(f"a {t.__name__} ({v.layout})")
            local.append(self._tensor(v.detach()))
            return _Ref(len(local) - 1)
        return v

    def _tensor(self, d: Any) -> int:
        key = (d.untyped_storage().data_ptr(), d.storage_offset(), tuple(d.shape), tuple(d.stride()), d.dtype)
        i = self.index.get(key)
        if i is not None:
            return i
        i = self.index[key] = len(self.tensors)
        self.tensors.append(d)
        raw = d.cpu().contiguous().reshape(-1).view(self.torch.uint8).numpy().data
        n = raw.nbytes
        self.metas.append((str(d.dtype).removeprefix("torch."), tuple(d.shape), self.offset, n))
        self.raw.append(raw)
        self.chunks.append(raw)
        pad = -n % _ALIGN
        if pad:
            self.chunks.append(b"\0" * pad)
        self.offset += n + pad
        return i


def dumps(payload: dict[str, Any], torch: Any) -> tuple[bytes, dict[str, str]]:
    """The blob of a checkpoint payload, and the digest of each entry of its sections."""
    w = _Writer(torch)
    parts: list[tuple[tuple[str, ...], Any, list[int]]] = []
    digests: dict[str, str] = {}
    rest = {k: v for k, v in payload.items() if k not in SECTIONS}
    for section in SECTIONS:
        for key, value in payload.get(section, {}).items():
            skeleton, local, digest = w.part(value)
            parts.append(((section, key), skeleton, local))
            digests[f"{section}:{key}"] = digest
    skeleton, local, _ = w.part(rest)
    parts.append(((), skeleton, local))
    try:
        header = pickle.dumps((parts, w.metas), protocol=5)
    except Exception as e:
        raise Unsupported(str(e)) from None
    return b"".join([MAGIC, len(header).to_bytes(8, "little"), header, *w.chunks]), digests


def loads(data: bytes, torch: Any) -> dict[str, Any]:
    n = int.from_bytes(data[1:9], "little")
    parts, metas = pickle.loads(data[9 : 9 + n])
    buf = bytearray(data[9 + n :])  # one copy, writable: tensors view it in place
    tensors = []
    for dtype, shape, off, nbytes in metas:
        raw = (
            torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=off)
            if nbytes
            else torch.empty(0, dtype=torch.uint8)
        )
        tensors.append(raw.view(getattr(torch, dtype)).reshape(shape))
    payload: dict[str, Any] = {s: {} for s in SECTIONS}
    for path, skeleton, local in parts:
        value = _join(skeleton, [tensors[g] for g in local])
        if path:
            payload[path[0]][path[1]] = value
        else:
            payload.update(value)
    return payload


def _join(v: Any, tensors: list[Any]) -> Any:
    t = type(v)
    if t is _Ref:
        return tensors[v.i]
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
