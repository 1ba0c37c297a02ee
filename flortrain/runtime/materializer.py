"""Materialization: turning a captured checkpoint into a committed blob in the store.

One interface, so the fork-based background materializer (Flor thesis, Chapter 4) can replace
the synchronous one without touching SkipBlocks: ``submit`` takes a payload that references live
tensors and must be done with them (serialized, or safely forked) before it returns; ``flush``
waits for everything submitted and reports failures. The synchronous materializer serializes and
writes on the training thread.
"""

from __future__ import annotations

import io
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

from flortrain.runtime import blobformat
from flortrain.runtime.digest import state_digests
from flortrain.store.db import Store


@dataclass
class Materialized:
    key: str
    nbytes: int
    seconds: float  # time the training thread spent (the M_i of Flor's Eq. 4)
    digests: dict[str, str]  # per part of the state, for `diff`


class Materializer(Protocol):
    def submit(self, key: str, payload: dict[str, Any]) -> Materialized: ...

    def flush(self) -> None: ...


def serialize(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The blob of a payload and the digests of its parts (:mod:`flortrain.runtime.digest`).

    flortrain's own tensor format when the script uses torch (see
    :mod:`flortrain.runtime.blobformat`; it digests while it writes), else ``torch.save`` when the
    payload needs it, or plain pickle; the leading byte says which."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return blobformat.dumps(payload, torch)
        except blobformat.Unsupported:
            buf = io.BytesIO()
            torch.save(payload, buf)
            return b"T" + buf.getvalue(), state_digests(payload)
    return b"P" + pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL), state_digests(payload)


def deserialize(data: bytes) -> dict[str, Any]:
    if data[:1] == b"P":
        out: dict[str, Any] = pickle.loads(data[1:])
        return out
    import torch

    if data[:1] == blobformat.MAGIC:
        loaded: dict[str, Any] = blobformat.loads(data, torch)
        return loaded
    out = torch.load(io.BytesIO(data[1:]), weights_only=False, map_location="cpu")
    return out


class SyncMaterializer:
    """Serialize, write, commit: the blob first, the row that makes it a checkpoint last."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.store = store
        self.run_id = run_id

    def submit(self, key: str, payload: dict[str, Any]) -> Materialized:
        t0 = time.perf_counter()
        data, digests = serialize(payload)
        rel, sha = self.store.write_blob(self.run_id, key, data)
        self.store.commit_checkpoint(self.run_id, key, rel, sha, len(data))
        return Materialized(key, len(data), time.perf_counter() - t0, digests)

    def flush(self) -> None:
        return None
