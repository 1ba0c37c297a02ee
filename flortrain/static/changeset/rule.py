"""A changeset rule: its place in Flor's Table 2 (or none, for what flortrain adds), the pattern
it matches, what it puts in the changeset, and its own cases.

A case is a small script with one main loop and one candidate inner loop, and either the exact
changeset of that loop as ``{(expr, Restore)}`` or the reason it is refused (a substring). A
wrong changeset is a wrong replay, so every case pins the whole set, not a member of it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

from flortrain.static.plan import Restore

P = Restore.IN_PLACE
R = Restore.REBOUND


@dataclass(frozen=True)
class Refused:
    """The single candidate loop must be refused with a reason containing ``reason``."""

    reason: str


@dataclass(frozen=True)
class Case:
    """A script and what the rule makes of its candidate loop."""

    id: str
    source: str
    expected: Collection[tuple[str, Restore]] | Refused

    @property
    def text(self) -> str:
        return textwrap.dedent(self.source).lstrip("\n")


class ChangesetRule:
    """Subclass and set the class variables; the logic is in the rule's module."""

    #: the rule's row in Flor's Table 2 (0-5, highest precedence first); None: flortrain's own
    number: ClassVar[int | None] = None
    name: ClassVar[str]  # kebab-case, as docs/changeset.md names it
    pattern: ClassVar[str]  # the statements it matches
    change: ClassVar[str]  # what it puts in the changeset (or refuses)
    doc: ClassVar[str] = ""  # why, in a few lines
    cases: ClassVar[tuple[Case, ...]] = ()
