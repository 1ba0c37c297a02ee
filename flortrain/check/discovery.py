"""Which files a ``flortrain check PATH...`` covers: a directory stands for the ``.py`` files below
it, in sorted order, minus what its configuration excludes; a file named on the command line is
checked even when excluded (pre-commit names every staged file), unless ``--force-exclude``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from flortrain.check.config import CheckConfig
from flortrain.check.pyproject import Configs


def relative(path: str, config: CheckConfig) -> str:
    """``path`` relative to the configuration's root, ``/``-separated, as globs match it."""
    rel = os.path.relpath(os.path.abspath(path), config.root)
    return rel.replace(os.sep, "/")


def discover(paths: Iterable[str], configs: Configs, force_exclude: bool = False) -> Iterator[str]:
    for p in paths:
        if _forced_out(p, configs.for_file(p), force_exclude):
            continue
        if os.path.isdir(p):
            yield from _walk(p, configs)
        else:
            yield p


def _walk(top: str, configs: Configs) -> Iterator[str]:
    for root, dirs, files in os.walk(top):
        config = configs.for_dir(root)
        dirs[:] = sorted(
            d for d in dirs if not config.excluded(relative(os.path.join(root, d), config))
        )
        for f in sorted(files):
            path = os.path.join(root, f)
            if f.endswith(".py") and not config.excluded(relative(path, config)):
                yield os.path.normpath(path)


def _forced_out(path: str, config: CheckConfig, force: bool) -> bool:
    """An explicit path is excluded only under force-exclude: when it, or a directory between it
    and the configuration's root, matches an exclude pattern."""
    if not (force or config.force_exclude):
        return False
    rel = relative(path, config)
    if rel == ".":
        return False
    if rel.startswith("../"):
        return config.excluded(os.path.basename(path))
    parts = rel.split("/")
    return any(config.excluded("/".join(parts[: i + 1])) for i in range(len(parts)))
