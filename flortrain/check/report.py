"""Findings as people and tools read them."""

from __future__ import annotations

from collections.abc import Sequence

from flortrain.check.finding import Finding, Severity

FORMATS = ("concise",)


def render(findings: Sequence[Finding], fmt: str) -> str:
    if fmt == "concise":
        return concise(findings)
    raise ValueError(fmt)


def concise(findings: Sequence[Finding]) -> str:
    lines = [f.concise() for f in findings]
    errors = sum(f.severity is Severity.ERROR for f in findings)
    warnings = len(findings) - errors
    if findings:
        lines.append(f"Found {errors} error(s) and {warnings} warning(s).")
    else:
        lines.append("All checks passed.")
    return "\n".join(lines)
