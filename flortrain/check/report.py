"""What one ``flortrain check`` found: the findings, the fixes applied and the texts they are
offsets into (rendered by :mod:`flortrain.check.formats`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flortrain.check.finding import Finding, Severity


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
