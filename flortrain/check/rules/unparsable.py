"""A file the checker cannot read or parse: reported, never silently skipped."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit


class Unparsable(Rule):
    """The runner reports this one itself, before any rule runs (a unit needs a parse)."""

    code = f"{Family.CHECK}001"
    name = "unparsable-file"
    severity = Severity.ERROR
    message = "syntax error"
    hint = "the file is not checked until it parses"
    doc = (
        "A file that cannot be read (a missing or undecodable file) or parsed (a syntax error,"
        " or syntax newer than the static pass knows) is an error at the offending line, shown"
        " with a caret under the column; the other files are still checked. It cannot be"
        " suppressed with `# noqa` or deselected: a file no rule could look at must not pass."
    )
    valid = (Valid("x = 1\n"),)
    invalid = (Invalid("for x in range(3)\n    print(x)\n", line=1, col=18),)

    def check(self, unit: Unit) -> Iterator[Hit]:
        return iter(())
