"""Live module tensors found by the hash of their bytes.

A checkpoint's tensor that was unchanged since the main loop's entry when it was taken is not in
the store, only named by the hash of its bytes (``ChangeTracker.enter``): the replay's prologue
made it again. Its bytes are those of the live module tensor of that size that hashes to that
name. A tensor is hashed once per version, so a replay restoring many checkpoints pays once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from flortrain.checkpoint import versions
from flortrain.checkpoint.codec import tensor_bytes, tensor_name


class LiveTensors:
    def __init__(self) -> None:
        #: id -> (tensor, version, name) of each tensor hashed
        self._names: dict[int, tuple[Any, int, str]] = {}

    def find(self, tensors: Iterable[Any], sha: str, nbytes: int) -> memoryview | None:
        """The bytes of the tensor among ``tensors`` named ``sha``, or None (the checkpoint
        then cannot be used, and what it would have restored runs again). The view is of the
        live tensor: the loader copies it at once."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        for t in tensors:
            if t.nbytes != nbytes:
                continue
            try:
                version = t._version
            except RuntimeError:
                continue
            known = self._names.get(id(t))
            if known is None or known[0] is not t or known[1] != version or versions.untrusted(t):
                known = self._names[id(t)] = (t, version, tensor_name(t, torch))
            if known[2] == sha:
                return tensor_bytes(t, torch)
        return None
