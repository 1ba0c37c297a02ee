"""What the session asks of a materializer, and what it hands one: the seam between deciding a
checkpoint (``period.py``, asked by the session) and executing it.

:meth:`Materializer.prepare` lays a checkpoint out and prices it (a :class:`Prepared` with its
:class:`~flortrain.checkpoint.staging.Estimate`); the caller decides; :meth:`Materializer.stage`
executes. Nothing here calls back into the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from flortrain.checkpoint.staging import Estimate, Layout


@dataclass
class Prepared:
    """A checkpoint laid out, not staged: :meth:`Materializer.stage` executes it. ``estimate``
    is None where nothing tells the cost short of writing it (the training thread writes it)."""

    key: str
    block_id: str
    payload: dict[str, Any]
    estimate: Estimate | None = None
    layout: Layout | None = None
    fallback: bool = False  # a payload flortrain's format cannot hold: ``torch.save`` it


class Materializer(Protocol):
    """Executes checkpoints; deciding whether to take one is the caller's (``period.py``):
    :meth:`prepare` says what it will cost, :meth:`stage` does it."""

    def prepare(self, key: str, block_id: str, payload: dict[str, Any]) -> Prepared:
        """Lay a checkpoint out; its :class:`Estimate` once the changed bytes are known, before
        anything is copied. Nothing is staged: a prepared checkpoint may be dropped."""

    def stage(self, prepared: Prepared) -> float:
        """Stage a prepared checkpoint; when this returns, training may change anything the
        payload refers to. The checkpoint is committed later, or reported lost. Returns the
        seconds the writer will take for it (an estimate, :func:`writer_speed`; 0 when it was
        written here)."""

    def submit(self, key: str, block_id: str, payload: dict[str, Any]) -> float:
        """:meth:`prepare` and :meth:`stage`, for a checkpoint taken whatever it costs."""

    def poll(self) -> None:
        """Commit what the writer has finished (cheap: called at every main-loop iteration)."""

    def loop_entered(self, tensors: list[Any]) -> None:
        """The main loop begins with these module tensors (:meth:`ChangeTracker.enter`)."""

    def flush(self) -> None:
        """Wait for everything submitted, commit it, and stop."""

    def hand_off(self) -> tuple[int, list[str]] | None:
        """Stop without waiting: the writer sends what it still holds to the launcher, which
        commits it (``flortrain/process/launcher.py``). The writer's pid and the keys handed over; None
        where that cannot be (no launcher, no writer): :meth:`flush` then."""


Committed = Callable[[str, dict[str, str]], None]


Lost = Callable[[str, str], None]


@dataclass
class Callbacks:
    committed: Committed
    lost: Lost
    warn: Callable[[str], None]
