"""Files in, findings out: discovery, parsing, every enabled rule, severities.

One file's failure (unreadable, a syntax error) is a finding for that file; the others are still
checked. Nothing a rule does runs the user's code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from flortrain.check.config import CheckConfig
from flortrain.check.finding import Finding, Severity
from flortrain.check.rule import Hit, Rule
from flortrain.check.rules import all_rules
from flortrain.check.unit import Unit
from flortrain.errors import FlortrainError
from flortrain.static.source import parse

#: directories never descended into (ruff's defaults, plus flortrain's own store)
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        "__pycache__",
        "build",
        "dist",
        "node_modules",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".flortrain",
        "site-packages",
    }
)


def discover(paths: Iterable[str]) -> Iterator[str]:
    """``paths`` as files: a directory stands for the ``.py`` files below it, in sorted order."""
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(
                    d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")
                )
                for f in sorted(files):
                    if f.endswith(".py"):
                        yield os.path.normpath(os.path.join(root, f))
        else:
            yield p


def check_text(path: str, text: str | None, config: CheckConfig) -> list[Finding]:
    """Every finding in one file (``text`` stands for its content when given)."""
    try:
        source = parse(path, text)
    except FlortrainError as e:
        where = e.where
        return [
            Finding(
                path,
                where.line if where else 0,
                where.col if where else 0,
                "CHK001",
                e.message,
                Severity.ERROR,
                "the file is not checked until it parses",
            )
        ]
    unit = Unit(source, config)
    out: list[Finding] = []
    for rule_cls in all_rules():
        if not config.enabled(rule_cls.code):
            continue
        rule = rule_cls()
        for hit in rule.check(unit):
            out.append(_finding(unit, rule, hit))
    out.sort(key=lambda f: (f.line, f.col, f.code))
    return out


def _finding(unit: Unit, rule: Rule, hit: Hit) -> Finding:
    if hit.node is not None:
        line, col = unit.where(hit.node)
    else:
        line, col = hit.line, hit.col
    severity = rule.severity
    if rule.cuda_error and unit.uses_cuda:
        severity = Severity.ERROR
    if hit.severity is not None:
        severity = hit.severity
    override = unit.config.severity.get(rule.code)
    if override is not None:
        severity = Severity(override)
    return Finding(
        unit.path, line, col, rule.code, hit.message or rule.message, severity, rule.hint, hit.fix
    )


def check_paths(paths: Iterable[str], config: CheckConfig) -> list[Finding]:
    out: list[Finding] = []
    for path in discover(paths):
        out.extend(check_text(path, None, config))
    return out
