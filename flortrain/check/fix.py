"""Applying fixes: each finding's edits, all or none, never two that overlap, round after round
until nothing is left to fix. A round whose text no longer parses is retried one fix at a time,
and a fix that breaks the file is dropped, so what is written always parses. The rounds are
bounded and a text seen before ends them, so a fix that undoes another cannot loop forever."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from flortrain.check.finding import Edit, Finding

#: rounds of fixing a file: a fix can make room for another (ruff loops the same way)
ROUNDS = 10


def apply(text: str, findings: Iterable[Finding], unsafe: bool = False) -> tuple[str, int]:
    """``text`` with the fixes of ``findings`` applied (only safe ones unless ``unsafe``), and
    how many findings were fixed. A fix overlapping one already taken waits for the next round
    (the caller re-checks the new text, as ruff does)."""
    taken: list[Edit] = []
    fixed = 0
    for f in findings:
        if not applicable(f, unsafe):
            continue
        assert f.fix is not None
        if any(_overlaps(e, t) for e in f.fix.edits for t in taken):
            continue
        taken.extend(f.fix.edits)
        fixed += 1
    out = text
    for e in sorted(taken, key=lambda e: (e.start, e.end), reverse=True):
        out = out[: e.start] + e.replacement + out[e.end :]
    return out, fixed


def applicable(f: Finding, unsafe: bool) -> bool:
    return f.fix is not None and (f.fix.safe or unsafe)


def _overlaps(a: Edit, b: Edit) -> bool:
    if a.start == a.end == b.start == b.end:
        return True
    return a.start < b.end and b.start < a.end


@dataclass(frozen=True)
class Fixed:
    text: str  # the fixed text (the original when nothing could be fixed)
    findings: list[Finding]  # what is left to report in it
    fixed: int  # findings fixed
    converged: bool  # False: the rounds ran out with fixes still applicable


def fix_text(
    text: str,
    found: Sequence[Finding],
    recheck: Callable[[str], list[Finding]],
    unsafe: bool = False,
) -> Fixed:
    """Fix ``text`` (whose findings are ``found``) round after round; ``recheck`` gives the
    findings of a new text, with CHK001 when it does not parse."""
    seen = {text}
    total = 0
    current = list(found)
    for _ in range(ROUNDS):
        todo = [f for f in current if applicable(f, unsafe)]
        if not todo:
            return Fixed(text, current, total, True)
        new, n = apply(text, todo, unsafe)
        after = recheck(new)
        if _broken(after):
            new, n, after = _one_by_one(text, todo, recheck, unsafe)
        if n == 0 or new in seen:
            return Fixed(text, current, total, n == 0)
        seen.add(new)
        text, current, total = new, after, total + n
    return Fixed(text, current, total, not any(applicable(f, unsafe) for f in current))


def _broken(findings: Sequence[Finding]) -> bool:
    return any(f.code == "CHK001" for f in findings)


def _one_by_one(
    text: str,
    todo: Sequence[Finding],
    recheck: Callable[[str], list[Finding]],
    unsafe: bool,
) -> tuple[str, int, list[Finding]]:
    """The first single fix that leaves ``text`` parsing (the others wait for a later round)."""
    for f in todo:
        new, n = apply(text, [f], unsafe)
        after = recheck(new)
        if n and not _broken(after):
            return new, n, after
    return text, 0, []


def write(path: str, text: str) -> None:
    """Write a fixed file back in the encoding it was read in (a BOM or a coding cookie is kept)
    and with its own line endings."""
    import io
    import tokenize

    with open(path, "rb") as f:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(f.read()).readline)
    with open(path, "w", encoding=encoding, newline="") as f:
        f.write(text)
