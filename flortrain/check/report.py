"""What one ``flortrain check`` found, and its rendering in the format asked for."""

from __future__ import annotations

from dataclasses import dataclass, field

from flortrain.check.finding import Finding, Severity

FORMATS = ("concise", "json", "github", "sarif")


@dataclass
class Report:
    findings: list[Finding]
    fixed: int = 0  # findings ``--fix`` fixed
    unsafe_fixes: bool = False  # ``--unsafe-fixes``: unsafe fixes count as available
    #: the checked text of each file whose findings carry fixes (edits are offsets into it)
    texts: dict[str, str] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(f.severity is Severity.ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return len(self.findings) - self.errors


def render(report: Report, fmt: str) -> str:
    from flortrain.check.formats import concise, github, json_format, sarif

    renderers = {
        "concise": concise.render,
        "json": json_format.render,
        "github": github.render,
        "sarif": sarif.render,
    }
    return renderers[fmt](report)
