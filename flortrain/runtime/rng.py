"""Global random number streams: the part of training state no changeset names.

A skipped block must leave every global stream where the recorded block left it (a DataLoader
draws its shuffle order and worker seeds from torch's stream), and a probe must leave them where
it found them. CUDA streams are captured when CUDA is available (untested here: no GPU).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import sys
from typing import Any


def capture() -> dict[str, Any]:
    """Every global stream's state, copied. numpy's is taken only once ``numpy.random`` is
    imported: numpy (2.x) imports it lazily, on first use, and seeds the legacy stream from OS
    entropy then, so a script that has not imported it cannot have drawn from it. Asking for its
    state would import it for the script, about 40 ms at the first capture. (Constructing a
    torch optimizer imports it anyway, through ``torch._dynamo``; from then on every capture pays
    ``get_state``, about 40 µs: docs/runtime.md.) A stream first captured midway counts its
    first state as its initial one (``Session._boundary_digests``); :func:`restore` leaves a
    stream the checkpoint does not hold alone."""
    state: dict[str, Any] = {"random": random.getstate()}
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        state["numpy"] = np_random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_initialized() and torch.cuda.is_available():  # the cheap test first
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(state["random"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def encode(state: dict[str, Any]) -> bytes:
    """Stable bytes for hashing and storing (tensors as raw bytes, not pickled objects)."""
    flat: dict[str, Any] = {}
    for k, v in state.items():
        if k == "torch":
            flat[k] = bytes(v.numpy().tobytes())
        elif k == "cuda":
            flat[k] = [bytes(t.numpy().tobytes()) for t in v]
        elif k == "numpy":
            flat[k] = (v[0], v[1].tobytes(), *v[2:])
        else:
            flat[k] = v
    return pickle.dumps(flat, protocol=4)


#: The digest recorded for a stream still in its start-of-process (entropy) state.
UNTOUCHED = "untouched"


def digest_map(
    state: dict[str, Any], memo: dict[str, tuple[bytes, str]] | None = None
) -> dict[str, str]:
    """A short digest of each stream's state. ``memo`` (stream -> the bytes its state last
    encoded to, and their digest) spares hashing a stream whose state is the last one seen: a
    digest is a function of those bytes, and a stream the script does not draw from between two
    iterations (most, in a fine-tuning loop) then costs encoding its state and comparing bytes.

    The memo keeps the encoded bytes, not the captured objects: Python's state is 625 int objects
    scattered through the heap, and after a training step has evicted them, comparing a new
    capture with the last one item by item would cost a cache miss an item; a few KB of
    contiguous bytes compare in a fraction of that."""
    out = {}
    for k, v in state.items():
        data = encode({k: v})
        last = memo.get(k) if memo is not None else None
        if last is not None and last[0] == data:
            out[k] = last[1]
            continue
        out[k] = hashlib.sha256(data).hexdigest()[:32]
        if memo is not None:
            memo[k] = (data, out[k])
    return out


def dumps_digests(digests: dict[str, str]) -> str:
    """Per-stream digests as JSON, as the store keeps them at every main-loop boundary. A stream
    the script never uses (numpy's global one, seeded from OS entropy at import) differs between
    processes and must not count as a divergence; ``diff`` compares only streams that move during
    the record, and not where the record left them untouched."""
    return json.dumps(digests, sort_keys=True)
