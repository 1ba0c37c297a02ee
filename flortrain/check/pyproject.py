"""Finding and reading ``[tool.flortrain.check]``, as ruff finds ``[tool.ruff]``: each file is
governed by the nearest pyproject.toml above it that has the table (one without it is passed
over), or by ``--config`` for every file. A bad table is one line naming the file, exit 2."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flortrain.check.config import CheckConfig, Selection
from flortrain.check.rules import all_rules
from flortrain.errors import FlortrainError, Located

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


class _Reader:
    """Reads the values of one file's table, each refusal one line naming that file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def bad(self, message: str) -> FlortrainError:
        return FlortrainError(f"[tool.flortrain.check] {message}", Located(self.path), "FT070")

    def strings(self, key: str, value: Any, codes: bool) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.bad(f"{key} must be a list of strings")
        if codes:
            for v in value:
                if not known_prefix(v):
                    raise self.bad(f"{key}: unknown rule code or prefix {v!r}")
        return tuple(value)

    def codes(self, key: str, value: Any) -> tuple[str, ...]:
        return self.strings(key, value, codes=True)

    def globs(self, key: str, value: Any) -> tuple[str, ...]:
        return self.strings(key, value, codes=False)

    def per_file_ignores(self, key: str, value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
        if not isinstance(value, dict):
            raise self.bad("per-file-ignores must be a table of glob = [codes]")
        return tuple((glob, self.codes(f"{key} {glob!r}", c)) for glob, c in value.items())

    def severity(self, key: str, value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise self.bad('severity must be a table of code = "error" | "warning"')
        for code, level in value.items():
            if not known_prefix(code):
                raise self.bad(f"severity: unknown rule code or prefix {code!r}")
            if level not in ("error", "warning"):
                raise self.bad(f'severity {code!r} must be "error" or "warning", not {level!r}')
        return dict(value)

    def torch_version(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(r"\d+\.\d+", value):
            raise self.bad(f'torch-version must be a "MAJOR.MINOR" string, not {value!r}')
        return value

    def flag(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.bad(f"{key} must be true or false")
        return value


#: every key the table may have, as ruff spells its own, and how its value is read (in the
#: order they are validated, so the first bad key of a table is the one reported)
READERS: dict[str, Callable[[_Reader, str, Any], Any]] = {
    "select": _Reader.codes,
    "extend-select": _Reader.codes,
    "ignore": _Reader.codes,
    "exclude": _Reader.globs,
    "extend-exclude": _Reader.globs,
    "per-file-ignores": _Reader.per_file_ignores,
    "severity": _Reader.severity,
    "torch-version": _Reader.torch_version,
    "force-exclude": _Reader.flag,
}
KEYS = frozenset(READERS)


def load(path: str, table: dict[str, Any]) -> CheckConfig:
    """``table`` (read from ``path``) as a configuration, every key and code validated."""
    reader = _Reader(path)
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise reader.bad(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    changes = {
        key.replace("-", "_"): read(reader, key, table[key])
        for key, read in READERS.items()
        if key in table
    }
    config = CheckConfig(root=os.path.dirname(os.path.abspath(path)), source=path)
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
