"""The materializer that writes on the training thread (``FLORTRAIN_MATERIALIZER=sync``, and a
checkpoint too large for the staging arena)."""

from __future__ import annotations

from typing import Any

from flortrain.checkpoint.blob import serialize
from flortrain.checkpoint.interface import Callbacks, Prepared
from flortrain.store.rows import RecordSink


class SyncMaterializer:
    """Serialize, write, commit on the training thread: the blob first, the row last."""

    def __init__(self, store: RecordSink, run_id: int, callbacks: Callbacks) -> None:
        self.store = store
        self.run_id = run_id
        self.cb = callbacks

    def prepare(self, key: str, block_id: str, payload: dict[str, Any]) -> Prepared:
        """No estimate: only serializing would tell the size, and that is the cost."""
        return Prepared(key, block_id, payload)

    def stage(self, prepared: Prepared) -> float:
        return self.submit(prepared.key, prepared.block_id, prepared.payload)

    def submit(self, key: str, block_id: str, payload: dict[str, Any]) -> float:
        data, dig = serialize(payload)
        self.write(key, data, dig)
        return 0.0

    def write(self, key: str, data: bytes, dig: dict[str, str]) -> None:
        try:
            rel, sha = self.store.write_blob(self.run_id, key, data)
        except OSError as e:
            self.cb.lost(key, f"{e.strerror or e}")
            return
        self.store.commit_checkpoint(self.run_id, key, rel, sha, len(data))
        self.cb.committed(key, dig)

    def poll(self) -> None:
        return None

    def loop_entered(self, tensors: list[Any]) -> None:
        pass  # every checkpoint holds all its bytes

    def flush(self) -> None:
        return None

    def hand_off(self) -> tuple[int, list[str]] | None:
        return None  # everything is committed already
