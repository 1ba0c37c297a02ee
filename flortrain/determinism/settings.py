"""The deterministic settings a ``--deterministic`` run applies before the script's first line.

RepDL and the Two Sigma note: bitwise repeatability needs every source of variation pinned, not
only the random streams. So the training process (record, replay and each parallel-replay
worker alike, from the settings stored with the run) sets ``CUBLAS_WORKSPACE_CONFIG`` before
torch may start CUDA, asks torch for deterministic algorithms (``warn_only``: an op with no
deterministic implementation warns, once per op, instead of raising, since a record must not
fail where a plain run would not), turns cuDNN's autotuner off and its deterministic mode on,
pins the intra-op thread count, seeds python's, numpy's and torch's global streams from the
run seed (a script that seeds them itself overrides it), and keys DataLoaders and pools
(:mod:`flortrain.determinism.loaders`, :mod:`flortrain.determinism.examples`).
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from flortrain.determinism import examples, loaders
from flortrain.determinism.report import Rewritten

#: the run seed when ``--seed`` is not given: two deterministic records agree by default
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Settings:
    """What is stored with the run (its meta, ``deterministic``) and applied again by replay."""

    seed: int = DEFAULT_SEED
    threads: int | None = None
    warn_only: bool = True
    cublas_workspace: str = ":4096:8"

    def as_meta(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Settings | None:
        d = meta.get("deterministic")
        return None if not isinstance(d, dict) else cls(**d)


def apply(settings: Settings, uses_torch: bool) -> None:
    """Apply ``settings`` in this process, before the script runs."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", settings.cublas_workspace)
    examples.run_seed = settings.seed
    examples.install_builtin()
    random.seed(settings.seed)
    try:
        import numpy as np
    except ImportError:
        np = None  # type: ignore[assignment]
    if np is not None:
        np.random.seed(settings.seed & 0xFFFFFFFF)
    if not uses_torch:
        return
    import torch

    torch.use_deterministic_algorithms(True, warn_only=settings.warn_only)
    warnings.filterwarnings("once", message=r".*does not have a deterministic implementation")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    loaders.install()


def said_rewrite(script: str, rewritten: Rewritten | None) -> None:
    """One line on stderr for what the rewrite changed, one per draw it left as written."""
    if rewritten is None:
        return
    print(f"flortrain: deterministic: {rewritten.summary()}", file=sys.stderr)
    for left in rewritten.left:
        print(f"flortrain: {script}:{left}; left as written (not per-example)", file=sys.stderr)


def deterministic(meta: dict[str, Any], uses_torch: bool) -> None:
    """A replay of a record: the record's settings, if it was deterministic."""
    settings = Settings.from_meta(meta)
    if settings is not None:
        apply(settings, uses_torch)
