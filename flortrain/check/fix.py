"""Applying fixes: each finding's edits, all or none, never two that overlap; the result must
still parse, or the file is left as it was."""

from __future__ import annotations

from collections.abc import Iterable

from flortrain.check.finding import Edit, Finding


def apply(text: str, findings: Iterable[Finding], unsafe: bool = False) -> tuple[str, int]:
    """``text`` with the fixes of ``findings`` applied (only safe ones unless ``unsafe``), and
    how many findings were fixed. A fix overlapping one already taken waits for the next round
    (the caller re-checks the new text, as ruff does)."""
    taken: list[Edit] = []
    fixed = 0
    for f in findings:
        if f.fix is None or not (f.fix.safe or unsafe):
            continue
        if any(_overlaps(e, t) for e in f.fix.edits for t in taken):
            continue
        taken.extend(f.fix.edits)
        fixed += 1
    out = text
    for e in sorted(taken, key=lambda e: (e.start, e.end), reverse=True):
        out = out[: e.start] + e.replacement + out[e.end :]
    return out, fixed


def _overlaps(a: Edit, b: Edit) -> bool:
    if a.start == a.end == b.start == b.end:
        return True
    return a.start < b.end and b.start < a.end
