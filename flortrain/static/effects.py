"""What a stretch of code changes, in the terms of its own scope: the record the changeset rules,
the hooks summary and the interprocedural mapping hand each other.

It sits at the bottom of the changeset analysis (it imports only the plan's records), so every
rule can name it without importing the walker that applies the rules, or another rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flortrain.static.plan import Change

#: the rule number of a change mapped from a callee, a hook or a function handed to a call
RULE_CALLEE = 7


class NoEstimate(Exception):
    """A statement for which no safe changeset exists: the loop is refused."""


@dataclass
class Effects:
    """What a stretch of code changes, in the terms of its own scope."""

    changes: dict[str, Change] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    aliases: dict[str, str] = field(default_factory=dict)  # loop-scoped name -> object it views
    # loop variable -> the objects it takes in turn (`for m in (meter_a, meter_b):`)
    takes: dict[str, list[str]] = field(default_factory=dict)
    reaches: set[str] = field(default_factory=set)
    #: channels written to (``log``, ``self.writer``) -> their kind: outputs, not changes
    outputs: dict[str, str] = field(default_factory=dict)
    #: iterators advanced (``next(it)``, ``it.__next__()``) -> the line that first does it
    advanced: dict[str, int] = field(default_factory=dict)
