"""Probe isolation: a hindsight statement must not perturb the training it observes.

Inside the guard, the global RNG streams, the generators of any data loader the probe iterates,
the train/eval mode of every live module and the grad mode are saved and put back afterwards;
modules a probe creates are not registered (registry ids stay aligned with the record). What a
probe prints is marked as probe output so ``diff`` can exclude it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flortrain.checkpoint import capture, restore
from flortrain.runtime import rng
from flortrain.runtime.session import Session


@contextmanager
def isolated(session: Session | None) -> Iterator[None]:
    if session is None:
        yield
        return
    saved = rng.capture()
    torch = sys.modules.get("torch")
    modes: list[tuple[Any, list[bool]]] = []
    grad = None
    if torch is not None:
        modes = [
            (m, [sub.training for sub in m.modules()]) for _, m in session.registry.root_modules()
        ]
        grad = torch.is_grad_enabled()
    # A loader a probe iterates draws from its own generators (the shuffle order, the workers'
    # base seed): saved the moment the probe first iterates it, put back afterwards.
    loaders: dict[int, tuple[Any, dict[str, Any]]] = {}
    outer = session.registry.on_iterate

    def on_iterate(loader: Any) -> None:
        if outer is not None:
            outer(loader)
        if id(loader) not in loaders:
            loaders[id(loader)] = (loader, capture.capture(loader))

    session.registry.on_iterate = on_iterate
    session.probe_depth += 1
    session.registry.paused += 1
    try:
        yield
    finally:
        session.probe_depth -= 1
        session.registry.paused -= 1
        session.registry.on_iterate = outer
        for loader, st in loaders.values():
            restore.restore_into(loader, st)
        rng.restore(saved)
        for m, flags in modes:
            for sub, flag in zip(m.modules(), flags, strict=False):
                sub.training = flag
        if torch is not None and grad is not None:
            torch.set_grad_enabled(grad)
