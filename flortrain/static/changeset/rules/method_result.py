"""Rule 1: a method's result assigned changes the receiver and the targets."""

from __future__ import annotations

from flortrain.static.changeset.rule import Case, ChangesetRule, P, R


class MethodResult(ChangesetRule):
    number = 1
    name = "method-result"
    pattern = "`v1, .., vn = obj.method(...)`"
    change = "`{obj, v1, .., vn}`"
    doc = (
        "The method may change its receiver, and the targets are rebound. Applied with rule 4 by"
        " `method_call` (the two differ only in whether the result is assigned); a method of a"
        " local class is a callee instead, and known library behaviour refines it."
    )
    cases = (
        Case(
            "rule1",
            """
            for epoch in range(3):
                for b in loader:
                    out = model.forward(b)
            print(out)
        """,
            {("model", P), ("out", R)},
        ),
        Case(
            "rule1-tuple-targets",
            """
            for epoch in range(3):
                for b in loader:
                    first, second = queue.pop_two()
            print(first, second)
        """,
            {("queue", P), ("first", R), ("second", R)},
        ),
    )
