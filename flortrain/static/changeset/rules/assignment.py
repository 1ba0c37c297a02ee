"""Rule 3: an assignment changes its targets; and how each kind of target is restored."""

from __future__ import annotations

import libcst as cst

from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, P, R
from flortrain.static.changeset.rules import aliases
from flortrain.static.effects import NoEstimate
from flortrain.static.expressions import VIEW_ATTRS, is_view, names_of, object_expr
from flortrain.static.plan import Restore


class Assignment(ChangesetRule):
    number = 3
    name = "assignment"
    pattern = "`v1, .., vn = u1, .., um`"
    change = "`{v1, .., vn}`"
    doc = (
        "A name or attribute target is rebound (its value is assigned back when the loop is"
        " skipped); an item or a view's target (`buf[i] = x`, `w.data = ...`) mutates its object"
        " in place. The same targets take the change of rules 1 and 2."
    )
    cases = (
        Case(
            "rule3",
            """
            for epoch in range(3):
                for b in loader:
                    last = b
            print(last)
        """,
            {("last", R)},
        ),
        Case(
            "rule3-swap",
            """
            a, c = 0, 1
            for epoch in range(3):
                for b in loader:
                    a, c = c, a
            print(a, c)
        """,
            {("a", R), ("c", R)},
        ),
        Case(
            "in-place-vs-rebound",
            """
            total = 0
            for epoch in range(3):
                for b in loader:
                    history.append(b)
                    total += b
            print(total)
        """,
            {("history", P), ("total", R)},
        ),
        Case(
            "augmented-assignment-with-a-pure-call",
            """
            running = 0.0
            for epoch in range(3):
                for b in loader:
                    loss = model(b)
                    running += loss.item()
            print(running)
        """,
            {("running", R)},
        ),
        Case(
            "augmented-subscript-is-in-place",
            """
            for epoch in range(3):
                for b in loader:
                    counts[b] += 1
        """,
            {("counts", P)},
        ),
        Case(
            "subscript-target-is-in-place",
            """
            for epoch in range(3):
                for k, v in loader:
                    hist[k] = v
        """,
            {("hist", P)},
        ),
        Case(
            "attribute-target-is-rebound",
            """
            class T:
                def epoch(self):
                    for b in self.loader:
                        self.step += 1

            t = T()
            for epoch in range(3):
                t.epoch()
        """,
            {("self.step", R)},
        ),
        Case(
            "data-attribute-is-a-view-of-its-owner",
            """
            for epoch in range(3):
                for b in loader:
                    model.fc.weight.data = b
        """,
            {("model.fc.weight", P)},
        ),
    )


def assign_target(
    w: Walk,
    t: cst.BaseExpression,
    value: cst.BaseExpression,
    line: int,
    rule: int,
    augmented: bool,
) -> None:
    """Record what assigning ``value`` to ``t`` changes, under ``rule`` (1, 2 or 3)."""
    if isinstance(t, cst.Name):
        _assign_name(w, t.value, value, line, rule, augmented, len(names_of(t)) == 1)
    elif isinstance(t, cst.Attribute):
        expr = object_expr(t, w.module)
        if expr is None:
            raise NoEstimate(f"line {line}: assignment to an attribute of an unnamed object")
        if t.attr.value in VIEW_ATTRS:
            w.add_target_object(expr, line, rule)
        else:
            w.add(expr, Restore.REBOUND, rule, line)
    elif isinstance(t, cst.Subscript):
        obj = object_expr(t.value, w.module)
        if obj is None:
            raise NoEstimate(f"line {line}: item assignment into an unnamed object")
        w.add_target_object(obj, line, rule)
    else:
        raise NoEstimate(f"line {line}: unsupported assignment target")


def _assign_name(
    w: Walk,
    name: str,
    value: cst.BaseExpression,
    line: int,
    rule: int,
    augmented: bool,
    single: bool,
) -> None:
    if not augmented and single:
        w.fx.takes.pop(name, None)
        src = aliases.alias_source(w, value) if is_view(value) else None
        if src is not None:
            w.fx.aliases[name] = src
        else:
            w.fx.aliases.pop(name, None)
    was_bound = name in w.fx.bound
    w.bind([name])
    if augmented and was_bound and name in w.fx.aliases:
        return  # `w += 1` on a view of an outer object: charged to that object already
    w.add(name, Restore.REBOUND, rule, line, is_global=w.is_global(name))
