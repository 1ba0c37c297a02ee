"""Checkpoint state digests: what ``diff`` compares where a replay re-executes a checkpointed
instance.

Printed output and RNG streams catch most unfaithful replays, but not all: a loop that restores
the wrong weights may print nothing until much later, or never. So the record stores, for every
checkpoint, a digest of each part of the state it captured (each named object, each augmented
object, each rebound name), and a replay that *executes* an instance the record
checkpointed (it is probed) digests the same parts at the same point. Equal state gives equal
digests; ``diff`` reports any part that differs. Parts are compared only where both runs have
them: the record's alias watch may have learned extra objects the replay does not name.

Checkpoints written in flortrain's own format are digested while they are written (see
:mod:`flortrain.checkpoint.codec`); this module is the fallback for payloads that format does
not take: a canonical walk, tensors by dtype, shape and raw bytes, containers element-wise,
other values by ``repr`` (exact for ints, floats and strings). Record and replay digest a
payload the same way, since the same payload shape takes the same path.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

_SCALARS = frozenset({int, float, bool, str, type(None)})


def _flat(x: Any) -> bool:
    """A value whose ``repr`` is exact and cheap: a scalar, or a tuple of scalars (a shape)."""
    return type(x) in _SCALARS or (type(x) is tuple and all(type(y) in _SCALARS for y in x))


def _numpy_dtypes_of(torch: Any) -> frozenset[Any]:
    """The dtypes a tensor can be viewed as a NumPy array in (built once torch is loaded)."""
    global _numpy_dtypes
    if _numpy_dtypes is None:
        _numpy_dtypes = frozenset(
            {
                torch.float32,
                torch.float64,
                torch.float16,
                torch.int64,
                torch.int32,
                torch.int16,
                torch.int8,
                torch.uint8,
                torch.bool,
                torch.complex64,
                torch.complex128,
            }
        )
    return _numpy_dtypes


_numpy_dtypes: frozenset[Any] | None = None


def state_digests(payload: dict[str, Any]) -> dict[str, str]:
    """One digest per part of a checkpoint payload (see :mod:`flortrain.runtime.checkpointable`)."""
    out: dict[str, str] = {}
    for section in ("objects", "extra", "names"):
        for key, value in payload.get(section, {}).items():
            out[f"{section}:{key}"] = "w" + _digest(value)  # "w": the walk's digest
    # The RNG streams are left out: a stream the script never seeded holds OS entropy, different in
    # every process; the main-loop boundary digests compare the streams that matter.
    return out


def _digest(value: Any) -> str:
    h = hashlib.blake2b(digest_size=16)
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, v: Any) -> None:
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        try:
            if t.device.type == "cpu" and t.is_contiguous() and t.dtype in _numpy_dtypes_of(torch):
                h.update(t.numpy().data)  # the bytes in place, no copy
            else:
                h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        except (RuntimeError, TypeError):  # sparse, quantized, meta: fall back on the printed form
            h.update(repr(t).encode())
    elif np is not None and isinstance(v, np.ndarray):
        h.update(f"A{v.dtype}{v.shape}".encode())
        h.update(v.tobytes() if v.dtype != object else repr(v.tolist()).encode())
    elif isinstance(v, dict) and all(_flat(x) for x in v.values()):
        h.update(repr(sorted(v.items(), key=repr)).encode())  # a captured plain value, a flag dict
    elif isinstance(v, dict):
        h.update(b"{")
        for k in sorted(v, key=repr):
            h.update(repr(k).encode())
            _feed(h, v[k])
        h.update(b"}")
    elif isinstance(v, list | tuple) and all(_flat(x) for x in v):
        h.update(repr(v).encode())  # flags, shapes, param ids: one update, not one per element
    elif isinstance(v, list | tuple):
        h.update(b"[" if isinstance(v, list) else b"(")
        for x in v:
            _feed(h, x)
        h.update(b"]")
    elif isinstance(v, set | frozenset):  # element order follows string hashing: per process
        h.update(b"<")
        for r in sorted(repr(x) for x in v):
            h.update(r.encode())
        h.update(b">")
    else:
        h.update(repr(v).encode())
