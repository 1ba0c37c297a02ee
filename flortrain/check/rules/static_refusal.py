"""Files the static pass refuses whole: ``record`` would stop before training starts."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit


class StaticRefusal(Rule):
    code = f"{Family.REPLAY}008"
    name = "static-refusal"
    severity = Severity.ERROR
    message = "record refuses this file"
    hint = "split the construct the message names (a long chain of `+` into a list and a join)"
    doc = (
        "Record runs the static pass over the script and each project module it imports before"
        " training. A file the pass refuses as a whole (`FT004`, nested too deeply for its"
        " recursive walks: a thousand-term string concatenation) stops record with that one"
        " line, or leaves the module imported plainly. `flortrain check` reports the same"
        " refusal, with its `FT0xx` code, as a finding. Syntax errors are `CHK001`. Refusals of"
        " a replay's probes (`FT022`-`FT025`) concern the probed script, not this one, and are"
        " given by `flortrain replay`."
    )
    valid = (Valid("x = 'a' + 'b' + 'c'\n"),)
    invalid = (
        Invalid(
            "x = "
            + "+".join(["1"] * 600)
            + "\nfor i in range(2):\n    for j in range(2):\n        pass\n",
            line=1,
            col=1,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        found = plan_facts.plan_or_refusal(unit)
        if isinstance(found, Exception):
            where = found.where
            yield Hit(
                line=max(where.line if where else 0, 1),
                col=max(where.col if where else 0, 1),
                message=f"record refuses this file: {found.code} {found.message}",
            )
