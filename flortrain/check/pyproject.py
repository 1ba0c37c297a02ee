"""Finding and reading ``[tool.flortrain.check]``, as ruff finds ``[tool.ruff]``: each file is
governed by the nearest pyproject.toml above it that has the table (one without it is passed
over), or by ``--config`` for every file. A bad table is one line naming the file, exit 2."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import replace
from typing import Any

from flortrain.check.config import CheckConfig, Selection
from flortrain.check.rules import all_rules
from flortrain.errors import FlortrainError, Located

#: every key the table may have, as ruff spells its own
KEYS = frozenset(
    {
        "select",
        "extend-select",
        "ignore",
        "per-file-ignores",
        "severity",
        "torch-version",
        "exclude",
        "extend-exclude",
        "force-exclude",
    }
)
_FAMILIES = ("RPL", "RNG", "DET", "CHK")
_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)")


def known_prefix(prefix: str) -> bool:
    """``ALL``, a family (``RNG``) or the prefix of a rule's code (``DET1``, ``DET101``)."""

    if prefix == "ALL" or any(f.startswith(prefix) for f in _FAMILIES if prefix):
        return True
    return any(r.code.startswith(prefix) for r in all_rules()) and bool(prefix)


def read_table(path: str) -> dict[str, Any] | None:
    """The ``[tool.flortrain.check]`` table of ``path``, or None when it has none."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        m = _TOML_AT.search(str(e))
        where = Located(path, int(m[1]), int(m[2])) if m else Located(path)
        message = _TOML_AT.sub("", str(e)).strip()
        raise FlortrainError(f"invalid TOML: {message}", where, "FT070") from None
    except OSError as e:
        raise FlortrainError(f"cannot read: {e.strerror}", Located(path), "FT070") from None
    table = data.get("tool", {}).get("flortrain", {}).get("check")
    if table is not None and not isinstance(table, dict):
        raise FlortrainError("[tool.flortrain.check] must be a table", Located(path), "FT070")
    return table


def load(path: str, table: dict[str, Any]) -> CheckConfig:
    """``table`` (read from ``path``) as a configuration, every key and code validated."""

    def bad(message: str) -> FlortrainError:
        return FlortrainError(f"[tool.flortrain.check] {message}", Located(path), "FT070")

    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")

    def strings(key: str, value: Any, codes: bool) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad(f"{key} must be a list of strings")
        if codes:
            for v in value:
                if not known_prefix(v):
                    raise bad(f"{key}: unknown rule code or prefix {v!r}")
        return tuple(value)

    config = CheckConfig(root=os.path.dirname(os.path.abspath(path)), source=path)
    changes: dict[str, Any] = {}
    for key in ("select", "extend-select", "ignore"):
        if key in table:
            changes[key.replace("-", "_")] = strings(key, table[key], codes=True)
    for key in ("exclude", "extend-exclude"):
        if key in table:
            changes[key.replace("-", "_")] = strings(key, table[key], codes=False)
    if "per-file-ignores" in table:
        pfi = table["per-file-ignores"]
        if not isinstance(pfi, dict):
            raise bad("per-file-ignores must be a table of glob = [codes]")
        changes["per_file_ignores"] = tuple(
            (glob, strings(f"per-file-ignores {glob!r}", codes, codes=True))
            for glob, codes in pfi.items()
        )
    if "severity" in table:
        sev = table["severity"]
        if not isinstance(sev, dict):
            raise bad('severity must be a table of code = "error" | "warning"')
        for code, level in sev.items():
            if not known_prefix(code):
                raise bad(f"severity: unknown rule code or prefix {code!r}")
            if level not in ("error", "warning"):
                raise bad(f'severity {code!r} must be "error" or "warning", not {level!r}')
        changes["severity"] = dict(sev)
    if "torch-version" in table:
        tv = table["torch-version"]
        if not isinstance(tv, str) or not re.fullmatch(r"\d+\.\d+", tv):
            raise bad(f'torch-version must be a "MAJOR.MINOR" string, not {tv!r}')
        changes["torch_version"] = tv
    if "force-exclude" in table:
        if not isinstance(table["force-exclude"], bool):
            raise bad("force-exclude must be true or false")
        changes["force_exclude"] = table["force-exclude"]
    return replace(config, **changes)


def cli_selection(
    select: tuple[str, ...], extend_select: tuple[str, ...], ignore: tuple[str, ...]
) -> Selection | None:
    """The command line's layer: ``--select``, ``--extend-select``, ``--ignore``, each
    repeatable and comma-separated as ruff takes them."""

    def split(option: str, values: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(c.strip() for v in values for c in v.split(",") if c.strip())
        for c in out:
            if not known_prefix(c):
                raise FlortrainError(f"{option}: unknown rule code or prefix {c!r}", None, "FT070")
        return out

    s, e, i = (
        split("--select", select),
        split("--extend-select", extend_select),
        split("--ignore", ignore),
    )
    if not (s or e or i):
        return None
    return Selection(s or None, e, i)


class Configs:
    """The configuration of each file: ``--config`` for all, else the nearest table above it
    (looked up once per directory), with the command line's selection over it."""

    def __init__(
        self,
        config_path: str | None = None,
        isolated: bool = False,
        cli: Selection | None = None,
        fixed: CheckConfig | None = None,
    ) -> None:
        self._cli = (cli,) if cli is not None else ()
        self._by_dir: dict[str, CheckConfig] = {}
        self._fixed = fixed
        if config_path is not None:
            table = read_table(config_path)
            if table is None:
                raise FlortrainError(
                    "has no [tool.flortrain.check] table", Located(config_path), "FT070"
                )
            self._fixed = self._over(load(config_path, table))
        elif isolated:
            self._fixed = self._over(CheckConfig(root=os.getcwd()))

    def _over(self, config: CheckConfig) -> CheckConfig:
        return replace(config, overrides=config.overrides + self._cli)

    def for_dir(self, directory: str) -> CheckConfig:
        if self._fixed is not None:
            return self._fixed
        d = os.path.abspath(directory)
        if d in self._by_dir:
            return self._by_dir[d]
        candidate = _shown(os.path.join(d, "pyproject.toml"))
        table = read_table(candidate) if os.path.isfile(candidate) else None
        if table is not None:
            found = self._over(load(candidate, table))
        elif os.path.dirname(d) == d:
            found = self._over(CheckConfig(root=os.getcwd()))
        else:
            found = self.for_dir(os.path.dirname(d))
        self._by_dir[d] = found
        return found

    def for_file(self, path: str) -> CheckConfig:
        return self.for_dir(os.path.dirname(os.path.abspath(path)))


def _shown(path: str) -> str:
    """``path`` as errors name it: relative to the working directory when below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel
