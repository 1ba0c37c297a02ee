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
import re
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from flortrain.determinism import MAX_SEED, examples, loaders
from flortrain.determinism.report import Rewritten
from flortrain.store.records import MAX_THREADS, Damaged, count, maybe_count, refuse

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
    def from_meta(
        cls, meta: dict[str, Any], where: str = "the store", run: str = "run"
    ) -> Settings | None:
        """The settings ``run``'s meta holds (None: not deterministic), each field checked: a
        damaged or edited store (``where``) is refused in one line (``FT018``), never applied."""
        if "deterministic" not in meta:
            return None
        d = meta["deterministic"]
        try:
            if not isinstance(d, dict) or not set(d) <= set(_FIELDS):
                raise Damaged(f"{d!r} is not what --deterministic stores")
            warn_only = d.get("warn_only", True)
            if not isinstance(warn_only, bool):
                raise Damaged(f"warn_only {warn_only!r} is not true or false")
            return cls(
                seed=count(d.get("seed", DEFAULT_SEED), "seed", 0, MAX_SEED),
                threads=maybe_count(d.get("threads"), "threads", 1, MAX_THREADS),
                warn_only=warn_only,
                cublas_workspace=_workspace(d.get("cublas_workspace", ":4096:8")),
            )
        except Damaged as e:
            raise refuse(where, f"{run}'s deterministic settings", e) from None


_FIELDS = ("seed", "threads", "warn_only", "cublas_workspace")


def _workspace(value: object) -> str:
    """A ``CUBLAS_WORKSPACE_CONFIG`` value as torch documents it (``:SIZE:COUNT``, repeated)."""
    if not isinstance(value, str) or not re.fullmatch(r"(:[0-9]{1,6}:[0-9]{1,3})+", value):
        raise Damaged(f"cublas_workspace {value!r} is not of the form :4096:8")
    return value


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
