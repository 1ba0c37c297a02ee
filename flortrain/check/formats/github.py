"""``--output-format github``: workflow commands, so a GitHub Actions run annotates the diff
(``::error file=train.py,line=2,col=10,title=DET101::message``; warnings as ``::warning``)."""

from __future__ import annotations

from flortrain.check.finding import Finding
from flortrain.check.report import Report


def render(report: Report) -> str:
    return "\n".join(annotation(f) for f in report.findings)


def annotation(f: Finding) -> str:
    props = [f"file={_property(f.path)}"]
    if f.line:
        props.append(f"line={f.line}")
        if f.col:
            props.append(f"col={f.col}")
        if f.end_line:
            props += [f"endLine={f.end_line}", f"endColumn={f.end_col}"]
    props.append(f"title={f.code}")
    message = f"{f.message}\nhint: {f.hint}" if f.hint else f.message
    return f"::{f.severity} {','.join(props)}::{_data(message)}"


def _data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(s: str) -> str:
    return _data(s).replace(":", "%3A").replace(",", "%2C")
