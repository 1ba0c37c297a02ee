"""Probe isolation: a hindsight statement must not perturb the training it observes.

Inside the guard, RNG streams, train/eval mode of every live module and the grad mode are saved
and put back afterwards; modules a probe creates are not registered (registry ids stay aligned
with the record). What a probe prints is marked as probe output so ``diff`` can exclude it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
        modes = [(m, [sub.training for sub in m.modules()]) for _, m in session.registry.root_modules()]
        grad = torch.is_grad_enabled()
    session.probe_depth += 1
    session.registry.paused += 1
    try:
        yield
    finally:
        session.probe_depth -= 1
        session.registry.paused -= 1
        rng.restore(saved)
        for m, flags in modes:
            for sub, flag in zip(m.modules(), flags, strict=False):
                sub.training = flag
        if torch is not None and grad is not None:
            torch.set_grad_enabled(grad)
