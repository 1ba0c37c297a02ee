"""What a replay's processes must import before the script runs: torch, or not.

Asked twice for one replay, so answered here once: by :func:`~flortrain.replay.preparation.prepare`
(the process that executes installs the torch side of the runtime), and before planning, by the
workers a parallel replay prestarts (each imports torch while the driver plans, or later, on the
clock of its segment). A textual test, as :func:`flortrain.static.text.uses_torch` explains:
importing torch to find out costs seconds.
"""

from __future__ import annotations

from collections.abc import Iterable

from flortrain.static.text import project_uses_torch, uses_torch


def needs_torch(script: str, text: str, cli_probes: Iterable[str]) -> bool:
    """Whether the replay of ``script`` (on disk: ``text``) with these ``--probe`` specs uses
    torch: the script or a project module it imports directly names it (minGPT's ``train.py``
    may leave every torch call to ``mingpt/trainer.py``), or a probe does. A probe spec is not
    Python until it is placed (``6:x``), so it is tested apart from the script."""
    return project_uses_torch(script, text) or any(uses_torch(spec) for spec in cli_probes)


__all__ = ["needs_torch"]
