"""``--output-format sarif``: SARIF 2.1.0, as code-scanning services read it: the rule registry
as ``tool.driver.rules`` and one result per finding."""

from __future__ import annotations

import json
import os
from typing import Any

from flortrain import __version__
from flortrain.check.finding import Finding
from flortrain.check.report import Report
from flortrain.check.rules import all_rules

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render(report: Report) -> str:
    rules = all_rules()
    index = {r.code: i for i, r in enumerate(rules)}
    driver = {
        "name": "flortrain",
        "version": __version__,
        "informationUri": "https://pypi.org/project/flortrain/",
        "rules": [
            {
                "id": r.code,
                "name": r.name,
                "shortDescription": {"text": r.message},
                "fullDescription": {"text": r.doc or r.message},
                "help": {"text": r.hint},
                "defaultConfiguration": {"level": str(r.severity)},
            }
            for r in rules
        ],
    }
    run = {
        "tool": {"driver": driver},
        "columnKind": "unicodeCodePoints",
        "results": [_result(f, index) for f in report.findings],
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def _result(f: Finding, index: dict[str, int]) -> dict[str, Any]:
    location: dict[str, Any] = {"artifactLocation": {"uri": _uri(f.path)}}
    if f.line:
        region = {"startLine": f.line, "startColumn": max(f.col, 1)}
        if f.end_line:
            region |= {"endLine": f.end_line, "endColumn": max(f.end_col, 1)}
        location["region"] = region
    out: dict[str, Any] = {
        "ruleId": f.code,
        "level": str(f.severity),
        "message": {"text": f"{f.message} (hint: {f.hint})" if f.hint else f.message},
        "locations": [{"physicalLocation": location}],
    }
    if f.code in index:
        out["ruleIndex"] = index[f.code]
    return out


def _uri(path: str) -> str:
    posix = path.replace(os.sep, "/")
    return "file://" + posix if os.path.isabs(path) else posix
