"""A payload to a blob and back, in whichever format fits it: flortrain's own (``codec.py``)
when the script uses torch, ``torch.save`` when the payload needs it, plain pickle without
torch. The blob's leading byte says which."""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Callable
from typing import Any

from flortrain.checkpoint import codec, skeleton
from flortrain.checkpoint.digest import state_digests


def serialize(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """A self-contained blob of a payload and the digests of its parts.

    flortrain's own format when the script uses torch (:mod:`flortrain.checkpoint.codec`), else
    ``torch.save`` when the payload needs it, or plain pickle; the leading byte says which."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return codec.dumps(payload, torch)
        except skeleton.Unsupported:
            return torch_save(payload, torch), state_digests(payload)
    return b"P" + codec.pickle_dumps(payload), state_digests(payload)


def digests(payload: dict[str, Any]) -> dict[str, str]:
    """The part digests the record stored for an equal payload (``diff`` compares them)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return codec.digests(payload, torch)
        except skeleton.Unsupported:
            pass
    return state_digests(payload)


def torch_save(payload: dict[str, Any], torch: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf, pickle_module=codec.PICKLE_MODULE)
    return b"T" + buf.getvalue()


def deserialize(
    data: bytes,
    objects: Callable[[str], bytes | None] | None = None,
    live: Callable[[str, int], bytes | memoryview | None] | None = None,
) -> dict[str, Any]:
    """A payload back from its blob; ``objects`` reads the content-addressed tensors it refers to,
    ``live`` those the store does not have (``codec.loads``)."""
    if data[:1] == b"P":
        out: dict[str, Any] = pickle.loads(data[1:])
        return out
    import torch

    if data[:1] == codec.MAGIC:
        loaded: dict[str, Any] = codec.loads(data, torch, objects, live)
        return loaded
    # torch.save's format: tensors and plain containers load without running pickled code; a
    # payload holding other objects (the rare fallback) needs the full unpickler, and comes only
    # from the user's own store
    try:
        out = torch.load(io.BytesIO(data[1:]), weights_only=True, map_location="cpu")
    except Exception:
        out = torch.load(io.BytesIO(data[1:]), weights_only=False, map_location="cpu")
    return out
