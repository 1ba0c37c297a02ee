"""Errors that reach the user as one line and exit code 2.

Every boundary (a file, a run, a checkpoint) turns failures into one of these so the CLI can print
``path:line:col CODE message`` without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Located:
    """A position in a user's file, 1-based line and column as editors show them."""

    path: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.path}:{self.line}:{self.col}"
        return self.path


class FlortrainError(Exception):
    """Bad input or an unusable store: reported as one line, exit 2."""

    def __init__(self, message: str, where: Located | None = None, code: str = "FT000") -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.code = code

    def one_line(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        return f"{prefix}{self.code} {self.message}"
