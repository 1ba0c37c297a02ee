"""For people: ``path:line:col: CODE message`` (what editors and ruff's users parse), ``[*]``
before the message when ``--fix`` can fix it, then the severity and the hint on the next line; a
syntax error shows its line with a caret under the column. A summary line ends the output."""

from __future__ import annotations

from flortrain.check.finding import Finding
from flortrain.check.fix import applicable
from flortrain.check.report import Report


def render(report: Report) -> str:
    out: list[str] = []
    for f in report.findings:
        out.extend(finding(f, report.unsafe_fixes))
    out.append(summary(report))
    return "\n".join(out)


def finding(f: Finding, unsafe: bool) -> list[str]:
    mark = "[*] " if applicable(f, unsafe) else ""
    where = f"{f.path}:{f.line}:{f.col}" if f.line else f.path  # an unreadable file: no line
    lines = [f"{where}: {f.code} {mark}{f.message}"]
    if f.source_line:
        shown = f.source_line.replace("\t", " ")  # one column per character, as col counts
        lines += [f"    {shown}", "    " + " " * max(f.col - 1, 0) + "^"]
    lines.append(f"  [{f.severity}] hint: {f.hint}" if f.hint else f"  [{f.severity}]")
    return lines


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary(report: Report) -> str:
    fixed = f"Fixed {plural(report.fixed, 'finding')}. " if report.fixed else ""
    if not report.findings:
        return f"{fixed}All checks passed."
    text = (
        f"{fixed}Found {plural(report.errors, 'error')} and {plural(report.warnings, 'warning')}."
    )
    safe = sum(applicable(f, False) for f in report.findings)
    unsafe = sum(applicable(f, True) for f in report.findings) - safe
    if report.unsafe_fixes:
        safe, unsafe = safe + unsafe, 0
    if safe:
        text += f" [*] {safe} fixable with --fix."
    if unsafe:
        text += f" ({unsafe} more with --fix --unsafe-fixes.)"
    return text
