"""What a rule reports: a located finding, its severity and the edit that fixes it, if any."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    """Errors fail the check (exit 1); warnings are printed and pass."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` (character offsets into the file's text) with ``replacement``."""

    start: int
    end: int
    replacement: str


@dataclass(frozen=True)
class Fix:
    """The edits that fix one finding. ``safe``: it cannot change a correct program's meaning
    (applied by ``--fix``); otherwise only ``--unsafe-fixes`` applies it."""

    edits: tuple[Edit, ...]
    safe: bool = True


@dataclass(frozen=True)
class Finding:
    path: str
    line: int  # 1-based
    col: int  # 1-based, as editors show it
    code: str  # "RNG001"
    message: str
    severity: Severity
    hint: str = ""  # one line: how to fix it
    fix: Fix | None = None
    end_line: int = 0  # where the flagged code ends (0: unknown)
    end_col: int = 0
    #: the offending source line, for findings shown with a caret under it (a syntax error)
    source_line: str = ""

    def concise(self) -> str:
        """``path:line:col CODE message``, the shape ruff and flake8 print."""
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"
