"""Flor's library augmentation: the live objects a block changes beyond its named changeset.

The changeset rules see names. An optimizer in a changeset also updates its model's parameters;
a scheduler drives its optimizer; an optimizer that stepped or a data loader iterated during the
block changed state no statement names; and the alias watch may have learned that a block
changes a module by a path the rules cannot follow. Each joins the block's checkpoints by its
registry id (``module#3``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from flortrain.runtime.registry import Registry, kind

#: (registry kind, registry id, the live object)
Augmented = list[tuple[str, int, Any]]


def augmentation(
    registry: Registry,
    objs: list[Any],
    learned: Iterable[int],
    on_loader: Callable[[int, Any], None],
) -> Augmented:
    """The objects beyond ``objs`` a block changes, each once; ``on_loader`` sees every data
    loader that joins."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    covered = {id(o) for o in objs}
    out: Augmented = []

    def add(obj: Any) -> None:
        i = registry.id_of(obj) if id(obj) not in covered else None
        if i is None:
            return
        covered.add(id(obj))
        out.append((kind(obj, torch), i, obj))
        if isinstance(obj, torch.optim.Optimizer):
            for _, m in registry.modules_of(obj):
                add(m)
        elif out[-1][0] == "loader":
            on_loader(i, obj)

    for o in objs:
        if isinstance(o, torch.optim.Optimizer):
            for _, m in registry.modules_of(o):
                add(m)
        elif isinstance(getattr(o, "optimizer", None), torch.optim.Optimizer):
            add(o.optimizer)
    for i in sorted(registry.stepped | registry.iterated):
        add(registry.get(i))
    for i in sorted(learned):
        obj = registry.get(i)
        if obj is not None:
            add(obj)
    return out
