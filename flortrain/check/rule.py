"""A rule: one hazard, its code, severity and hint, and its own valid and invalid cases.

Each rule lives in its own module under :mod:`flortrain.check.rules` with the examples that
define it (the Fixit pattern): the test suite turns every case into a test, and docs/check.md is
generated from the same cases, so a rule's documentation cannot drift from what it does.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from flortrain.check.finding import Fix, Severity
from flortrain.check.unit import Unit


class Family:
    """Code prefixes, one per family (letters + three digits, as ruff's codes are)."""

    REPLAY = "RPL"  # what makes a run unreplayable or memoization impossible
    RANDOMNESS = "RNG"  # random streams: seeding, sharing across workers and threads
    DETERMINISM = "DET"  # numerics, GPU kernels and the host: what differs run to run
    CHECK = "CHK"  # the checker's own findings (a file it cannot read or parse)


@dataclass(frozen=True)
class Valid:
    """Code the rule must not report."""

    code: str
    #: files beside it (``{"data.py": "..."}``), for rules that follow calls into project modules
    files: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        return dedent(self.code)


@dataclass(frozen=True)
class Invalid:
    """Code the rule must report, at ``line`` (1-based, in the dedented code) and, when given,
    ``col``; ``fixed`` is the text after its fix, when it has one."""

    code: str
    line: int
    col: int = 0
    fixed: str | None = None
    files: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        return dedent(self.code)


def dedent(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n")


@dataclass(frozen=True)
class Hit:
    """What a rule yields: where (a node, or a line and column) and, when the default message
    is not precise enough, a message of its own."""

    node: cst.CSTNode | None = None
    message: str = ""
    fix: Fix | None = None
    line: int = 0
    col: int = 0
    #: this finding's own severity (before configuration overrides), where the rule's depends
    #: on what else the file does or on a caveat of the pattern found
    severity: Severity | None = None


class Rule:
    """Subclass, set the class variables and implement :meth:`check`."""

    code: ClassVar[str]
    name: ClassVar[str]  # kebab-case, as ``--explain`` and docs name it
    severity: ClassVar[Severity]
    message: ClassVar[str]  # the default one-line message
    hint: ClassVar[str]  # one line: how to fix it
    #: a paragraph for docs/check.md: why it matters, and what the static pass cannot know
    doc: ClassVar[str] = ""
    #: a warning that becomes an error where the file uses CUDA (GPU-only hazards)
    cuda_error: ClassVar[bool] = False
    valid: ClassVar[tuple[Valid, ...]] = ()
    invalid: ClassVar[tuple[Invalid, ...]] = ()

    def check(self, unit: Unit) -> Iterator[Hit]:
        raise NotImplementedError
