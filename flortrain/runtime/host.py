"""What a loop hook needs from the process it runs in: the host of its blocks.

A SkipBlock and a main-loop boundary are written against these protocols, never against the
session: the session implements them (for a record or a replay), a unit test may drive a block
through any object that does. :class:`CheckpointHost` is what capturing and restoring a
changeset needs; :class:`BlockHost` adds what a loop instance asks as it opens and closes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from enum import StrEnum
from types import FrameType
from typing import Any, Protocol

from flortrain.checkpoint.period import AdaptivePeriod
from flortrain.runtime.audit import Image
from flortrain.runtime.files import Watch
from flortrain.runtime.registry import Registry
from flortrain.store.records import BlockState

Getters = Mapping[str, Callable[[], Any]]

#: A checkpoint the materializer finished at once: ``("committed", digests)`` or ``("lost",
#: reason)``; None while it is pending
Outcome = tuple[str, Any] | None


class State(StrEnum):
    """What a loop instance does (``runtime/skipblock.py``)."""

    RECORD = "record"
    SKIP = "skip"
    EXECUTE = "execute"
    PASSTHROUGH = "passthrough"


class Instance(Protocol):
    """A loop instance as its host sees it: its key, its state, whether control left it."""

    id: str
    key: str
    state: State
    thread: int

    def load(self, host: CheckpointHost, data: bytes) -> str | None: ...

    def left(self, on_stack: set[int]) -> bool: ...

    def abort(self, host: BlockHost) -> None: ...


class CheckpointHost(Protocol):
    """What capturing a changeset's state and restoring it needs."""

    @property
    def registry(self) -> Registry: ...

    def augmentation(self, block_id: str, objs: list[Any]) -> list[tuple[str, int, Any]]: ...

    def watchable(self) -> Iterator[tuple[int, Any]]: ...

    def read_object(self, sha: str) -> bytes | None: ...

    def live_object(self, sha: str, nbytes: int) -> memoryview | None: ...

    def warn_once(self, tag: str, msg: str) -> None: ...


class BlockHost(CheckpointHost, Protocol):
    """What a SkipBlock asks of its host as it opens, runs and closes."""

    def open_block(self, block: Instance) -> State:
        """Give an opening instance its key and state, and track it until it closes."""
        ...

    def close_block(self, block: Instance) -> None: ...

    def block_done(
        self,
        block: Instance,
        state: BlockState,
        digests: dict[str, str] | None = None,
        **costs: Any,
    ) -> None: ...

    def holding(self, defer_signals: bool = True) -> AbstractContextManager[None]: ...

    # -- record: the period, the watches, the checkpoint ---------------------------------------
    @property
    def adaptive(self) -> AdaptivePeriod: ...

    @property
    def files(self) -> Watch | None: ...

    @property
    def track_versions(self) -> bool: ...

    @property
    def background(self) -> float: ...

    @property
    def unnamed_effects(self) -> Mapping[str, str]: ...

    def iteration_elapsed(self) -> float: ...

    def checkpoint(
        self, key: str, block_id: str, payload: Callable[[], dict[str, Any]]
    ) -> Outcome: ...

    def put_checkpointed(
        self, key: str, block_id: str, state: BlockState, outcome: Outcome, **costs: Any
    ) -> None: ...

    def learn(self, block_id: str, registry_id: int, type_name: str) -> None: ...

    def audit_image(self, loop_id: str, frame: FrameType) -> Image | None: ...

    def audit_loop(
        self, loop_id: str, before: Image, frame: FrameType | None, objects: Getters, names: Getters
    ) -> None: ...

    def unnamed_effect(self, loop_id: str, why: str) -> None: ...

    # -- replay ----------------------------------------------------------------------------------
    def recorded(self, key: str) -> bool:
        """Whether the record checkpointed this instance (an executed one's digests compare)."""
        ...

    def restore_files(self, key: str) -> None: ...
