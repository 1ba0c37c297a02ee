"""``--output-format json``: a list of findings, one object each, in the schema docs/check.md
gives (fields are only ever added, never renamed). Lines and columns are 1-based, columns count
characters; a fix's edits say where each replacement goes in the checked text."""

from __future__ import annotations

import bisect
import json
from typing import Any

from flortrain.check.finding import Finding
from flortrain.check.report import Report


def render(report: Report) -> str:
    return json.dumps([as_dict(f, report.texts.get(f.path)) for f in report.findings], indent=2)


def as_dict(f: Finding, text: str | None) -> dict[str, Any]:
    fix: dict[str, Any] | None = None
    if f.fix is not None and text is not None:
        starts = _line_starts(text)
        fix = {
            "applicable": "safe" if f.fix.safe else "unsafe",
            "edits": [
                {
                    "start": _position(starts, e.start),
                    "end": _position(starts, e.end),
                    "content": e.replacement,
                }
                for e in f.fix.edits
            ],
        }
    return {
        "path": f.path,
        "line": f.line,
        "col": f.col,
        "end": {"line": f.end_line, "col": f.end_col} if f.end_line else None,
        "code": f.code,
        "severity": str(f.severity),
        "message": f.message,
        "hint": f.hint,
        "fix": fix,
    }


def _line_starts(text: str) -> list[int]:
    starts = [0]
    starts.extend(i + 1 for i, ch in enumerate(text) if ch == "\n")
    return starts


def _position(starts: list[int], offset: int) -> dict[str, int]:
    i = bisect.bisect_right(starts, offset) - 1
    return {"line": i + 1, "col": offset - starts[i] + 1}
