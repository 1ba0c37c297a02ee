"""``[tool.flortrain.check]`` in pyproject.toml, as ruff reads ``[tool.ruff.lint]``: which rules
run, on which files, and how severe. Selection is in layers (the file, then the command line);
in a layer the most specific prefix wins, and on a tie ``ignore`` does (ruff's resolution)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flortrain.check.globs import matches

#: the newest torch release whose op lists ship with flortrain
TORCH_VERSION = "2.13"

#: never descended into (ruff's defaults, plus flortrain's own store); ``exclude`` replaces them,
#: ``extend-exclude`` adds to them
DEFAULT_EXCLUDE = (
    ".bzr",
    ".direnv",
    ".eggs",
    ".git",
    ".hg",
    ".ipynb_checkpoints",
    ".mypy_cache",
    ".nox",
    ".pytest_cache",
    ".ruff_cache",
    ".svn",
    ".tox",
    ".venv",
    "__pycache__",
    "__pypackages__",
    "_build",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
    ".flortrain",
    "*.egg-info",
)


@dataclass(frozen=True)
class Selection:
    """One layer of rule selection. ``select=None``: this layer keeps the previous layer's."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def decide(self, code: str, before: bool) -> bool:
        state = False if self.select is not None else before
        best = -1
        for prefixes, on in ((self.select or (), True), (self.extend_select, True)):
            for p in prefixes:
                if _covers(p, code) and _weight(p) > best:
                    best, state = _weight(p), on
        for p in self.ignore:
            if _covers(p, code) and _weight(p) >= best:
                best, state = _weight(p), False
        return state


def _covers(prefix: str, code: str) -> bool:
    return prefix == "ALL" or code.startswith(prefix)


def _weight(prefix: str) -> int:
    return 0 if prefix == "ALL" else len(prefix)


@dataclass(frozen=True)
class CheckConfig:
    select: tuple[str, ...] | None = None  # code prefixes; None: every rule (``[]``: none)
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    #: torch release the op lists are taken from (``"2.13"``), never read from an installed torch
    torch_version: str = TORCH_VERSION
    severity: dict[str, str] = field(default_factory=dict)  # code or prefix -> "error" | "warning"
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, prefixes)
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    #: files named on the command line are excluded too (``--force-exclude``)
    force_exclude: bool = False
    #: the directory globs are relative to (the configuration file's)
    root: str = "."
    #: the pyproject.toml this came from ("" for the defaults)
    source: str = ""
    #: the command line's layer, over the file's
    overrides: tuple[Selection, ...] = ()

    def enabled(self, code: str) -> bool:
        state = Selection(self.select, self.extend_select, self.ignore).decide(code, True)
        for layer in self.overrides:
            state = layer.decide(code, state)
        return state

    def ignored_in(self, code: str, relpath: str) -> bool:
        """``per-file-ignores``: ``code`` is off in the file at ``relpath`` (relative to root)."""
        return any(
            any(_covers(p, code) for p in codes) and _file_matches(glob, relpath)
            for glob, codes in self.per_file_ignores
        )

    def severity_of(self, code: str) -> str | None:
        """The configured severity of ``code``: the most specific prefix that names it."""
        best = max((p for p in self.severity if _covers(p, code)), key=_weight, default=None)
        return None if best is None else self.severity[best]

    def excluded(self, relpath: str) -> bool:
        return any(matches(p, relpath) for p in (*self.exclude, *self.extend_exclude))


def _file_matches(glob: str, relpath: str) -> bool:
    """A ``!``-prefixed pattern matches the files the rest of it does not (ruff's negation)."""
    if glob.startswith("!"):
        return not matches(glob[1:], relpath)
    return matches(glob, relpath)
