"""``flortrain check`` end to end: configuration, files, findings, fixes, output, exit code."""

from __future__ import annotations

import os

import click

from flortrain.check.config import CheckConfig
from flortrain.check.finding import Finding, Severity
from flortrain.check.fix import apply
from flortrain.check.report import render
from flortrain.check.runner import check_text, discover
from flortrain.errors import FlortrainError, Located

#: rounds of fixing a file: a fix can make room for another (ruff loops the same way)
_FIX_ROUNDS = 10


def run(paths: list[str], fmt: str, fix: bool) -> int:
    for p in paths:
        if not os.path.exists(p):
            raise FlortrainError("no such file or directory", Located(p), "FT001")
    config = CheckConfig()
    findings: list[Finding] = []
    for path in discover(paths):
        found = check_text(path, None, config)
        if fix and any(f.fix is not None and f.fix.safe for f in found):
            found = _fix_file(path, found, config)
        findings.extend(found)
    click.echo(render(findings, fmt))
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


def _fix_file(path: str, found: list[Finding], config: CheckConfig) -> list[Finding]:
    """Fix ``path`` in place, round after round, and return what is left to report."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for _ in range(_FIX_ROUNDS):
        new, n = apply(text, found)
        if n == 0:
            break
        after = check_text(path, new, config)
        if any(f.code == "CHK001" for f in after):
            break  # a fix that breaks the file is never written
        text, found = new, after
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return found
