"""Rule 2: a function's result assigned changes the targets."""

from __future__ import annotations

from flortrain.static.changeset.rule import Case, ChangesetRule, R


class FunctionResult(ChangesetRule):
    number = 2
    name = "function-result"
    pattern = "`v1, .., vn = func(...)`"
    change = "`{v1, .., vn}`"
    doc = (
        "An unknown function is assumed to return a value rather than change its arguments when"
        " its result is assigned. Applied with rule 5 by `function_call`; a module-local function"
        " is a callee instead."
    )
    cases = (
        Case(
            "rule2",
            """
            for epoch in range(3):
                for b in loader:
                    y = compute(b)
            print(y)
        """,
            {("y", R)},
        ),
    )
