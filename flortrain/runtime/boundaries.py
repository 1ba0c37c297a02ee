"""Main-loop boundaries at run time: the state at the start of a main-loop iteration.

Record, at the start of every main-loop iteration (:class:`MainBoundary`):
- the carried plain scalars (``iter_num``, ``epoch``, ``best_val_loss`` while a float) go into
  the iteration's row: a few microseconds, so every iteration has them;
- at an adaptive period (the same Eq. 4 as blocks, with the iteration as the unit of compute), a
  *boundary checkpoint* of everything the iteration changes: the main loop's changeset, every
  live root module, optimizer and data loader, and the RNG streams.

A replay that jumps over iterations (:mod:`flortrain.runtime.jumps`) restores one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from flortrain.runtime import identity
from flortrain.runtime.checkpointable import Checkpointable, Getters
from flortrain.runtime.host import CheckpointHost
from flortrain.runtime.registry import kind

_SCALARS = (int, float, bool, str, type(None))


def scalars_json(getters: Getters) -> str | None:
    """The plain scalar values among ``getters`` as JSON (exact types only: a numpy scalar or a
    0-dim tensor is left out, and a guard reading it then counts as firing). Floats round-trip
    exactly through ``repr``; NaN and infinities are written as JSON's usual extensions."""
    out: dict[str, Any] = {}
    for name, get in getters.items():
        try:
            v = get()
        except (NameError, AttributeError):
            continue
        if type(v) in _SCALARS:
            out[name] = v
    return json.dumps(out, allow_nan=True) if out else None


class MainBoundary(Checkpointable):
    """The state at the start of one main-loop iteration. ``previous`` is what the boundary
    before it noted of the objects below that state (the loop's entry first: ``identity``)."""

    def __init__(
        self,
        host: CheckpointHost,
        main_id: str,
        detach_ok: tuple[str, ...],
        index: int = 0,
        previous: dict[str, tuple[Any, int]] | None = None,
    ) -> None:
        super().__init__(main_id, detach_ok, host.registry.count())
        self.jumped_to: int | None = None
        self.index = index  # the iteration whose start this is
        self.previous = previous if previous is not None else {}
        self.observed: identity.BoundaryMarks | None = None

    def marks(self, s: CheckpointHost) -> identity.InstanceMarks | identity.BoundaryMarks | None:
        """Against the previous boundary this record captured (the loop's entry first)."""
        self.observed = identity.BoundaryMarks(self.previous, self.index)
        return self.observed

    def augment(self, s: CheckpointHost, objs: list[Any]) -> list[tuple[str, int, Any]]:
        """Every live root module, optimizer and data loader, on top of the loop's own: an
        iteration is all of training, and a resumed replay needs all of it."""
        out = super().augment(s, objs)
        torch = sys.modules.get("torch")
        if torch is None:
            return out
        have = {i for _, i, _ in out} | {i for o in objs if (i := s.registry.id_of(o)) is not None}
        loaders = [
            (i, o) for i, o in s.registry.live() if isinstance(o, torch.utils.data.DataLoader)
        ]
        for i, obj in [*s.watchable(), *loaders]:
            if i not in have:
                have.add(i)
                out.append((kind(obj, torch), i, obj))
        return out

    def _registry_fits(self, recorded_start: int) -> bool:
        """The jumped iterations may have created modules, optimizers or loaders (a
        ``DataLoader`` built every epoch): their ids are reserved on restore."""
        return recorded_start >= self.registry_start

    def _may_drop(self, ref: str, obj: Any) -> bool:
        """A data loader the replay does not have, because a jumped iteration created it, is
        left out: nothing carried refers to it (a carried name would hold it), so it is never
        iterated again. A missing module or optimizer is training state: the jump is refused."""
        return ref.startswith("loader#") and (
            obj is None or int(ref.split("#", 1)[1]) >= self.registry_start
        )

    def restore(self, s: CheckpointHost, objects: Getters, names: Getters | None = None) -> None:
        assert self.payload is not None
        s.registry.pad(self.payload["registry"]["start"] - s.registry.count())
        super().restore(s, objects, names)

    def jumped(self) -> bool:
        """Whether the replay restored a later iteration's boundary (the generated code then
        reassigns the rebound names)."""
        return self.jumped_to is not None


class NoBoundary:
    """What ``main_iteration`` returns with no session: nothing is ever restored."""

    def jumped(self) -> bool:
        return False


NO_BOUNDARY = NoBoundary()


__all__ = ["NO_BOUNDARY", "MainBoundary", "NoBoundary", "scalars_json"]
