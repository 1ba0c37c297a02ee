"""Files in, findings out: parsing, every enabled rule, severities, ``# noqa`` and per-file
ignores.

One file's failure (unreadable, a syntax error) is a finding for that file (CHK001, never
suppressed); the others are still checked. Nothing a rule does runs the user's code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from flortrain.check.config import CheckConfig
from flortrain.check.discovery import discover
from flortrain.check.finding import Finding, Severity
from flortrain.check.noqa import Suppressions
from flortrain.check.pyproject import Configs
from flortrain.check.rule import Hit, Rule
from flortrain.check.rules import all_rules
from flortrain.check.unit import Unit
from flortrain.errors import FlortrainError
from flortrain.static.plan import Plan
from flortrain.static.source import Source, parse
from flortrain.static.text import read_text

UNPARSABLE = "CHK001"
#: a rule failed on a file: the checker's bug, reported so the file does not pass unchecked
CRASHED = "CHK002"


def check_text(
    path: str,
    text: str | None,
    config: CheckConfig,
    rules: Sequence[type[Rule]] | None = None,
    parsed: tuple[Source, Plan] | None = None,
) -> list[Finding]:
    """Every finding in one file (``text`` stands for its content when given), in line order.
    ``parsed``: that text already parsed and analysed (record's static pass), not done again."""
    try:
        if text is None:
            text = read_text(path)
        source = parse(path, text) if parsed is None else parsed[0]
    except FlortrainError as e:
        return [unparsable(path, text, e)]
    unit = Unit(source, config, parsed[1] if parsed is not None else None)
    relpath = os.path.relpath(os.path.abspath(path), config.root).replace(os.sep, "/")
    noqa = Suppressions(text)
    out: list[Finding] = []
    for rule_cls in all_rules() if rules is None else rules:
        if not config.enabled(rule_cls.code) or config.ignored_in(rule_cls.code, relpath):
            continue
        try:
            found = [
                _finding(unit, rule, hit) for rule in (rule_cls(),) for hit in rule.check(unit)
            ]
        except Exception as e:  # one rule's bug on one file must not end the whole check
            if os.environ.get("FLORTRAIN_DEBUG"):
                raise
            out.append(_crashed(path, rule_cls, e))
            continue
        out.extend(f for f in found if not noqa.covers(f.line, f.code))
    out.sort(key=lambda f: (f.line, f.col, f.code))
    return out


def unparsable(path: str, text: str | None, e: FlortrainError) -> Finding:
    """CHK001 for a file that cannot be read or parsed, with the offending line when known."""
    where = e.where
    line = where.line if where else 0
    lines = (text or "").splitlines()
    return Finding(
        path,
        line,
        where.col if where else 0,
        UNPARSABLE,
        e.message,
        Severity.ERROR,
        "the file is not checked until it parses",
        source_line=lines[line - 1] if 0 < line <= len(lines) else "",
    )


def _crashed(path: str, rule: type[Rule], e: Exception) -> Finding:
    what = e.message if isinstance(e, FlortrainError) else f"{type(e).__name__}: {e}"
    return Finding(
        path,
        0,
        0,
        CRASHED,
        f"{rule.code} failed on this file ({what})",
        Severity.ERROR,
        f"report it to flortrain; `--ignore {rule.code}` skips the rule meanwhile",
    )


def _finding(unit: Unit, rule: Rule, hit: Hit) -> Finding:
    end_line = end_col = 0
    if hit.node is not None:
        line, col = unit.where(hit.node)
        end = unit.positions[hit.node].end
        end_line, end_col = end.line, end.column + 1
    else:
        line, col = hit.line, hit.col
    severity = rule.severity
    if rule.cuda_error and unit.uses_cuda:
        severity = Severity.ERROR
    if hit.severity is not None:
        severity = hit.severity
    override = unit.config.severity_of(rule.code)
    if override is not None:
        severity = Severity(override)
    return Finding(
        unit.path,
        line,
        col,
        rule.code,
        hit.message or rule.message,
        severity,
        rule.hint,
        hit.fix,
        end_line,
        end_col,
    )


def check_paths(paths: Iterable[str], config: CheckConfig) -> list[Finding]:
    """Every finding in ``paths`` (files or directories) under one configuration (for callers
    such as ``record``, which have no command line to take a configuration from)."""

    out: list[Finding] = []
    for path in discover(paths, Configs(fixed=config)):
        out.extend(check_text(path, None, config))
    return out
