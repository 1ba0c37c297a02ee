"""Rule 0: rebinding what the loop already mutated in place gives no estimate."""

from __future__ import annotations

import libcst as cst

from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, R, Refused
from flortrain.static.effects import NoEstimate
from flortrain.static.expressions import VIEW_ATTRS, object_expr, root
from flortrain.static.plan import Change, Restore


class Rebinding(ChangesetRule):
    number = 0
    name = "rebinding"
    pattern = "`v = ...` where `v` is already mutated in place by this loop"
    change = "no estimate"
    doc = (
        "Rebinding what the loop already mutated in place leaves the old object (which others may"
        " still reference) changed, and restoring only the new binding misses it: which object to"
        " restore into is ambiguous. It fires when a name or attribute is rebound after it (or"
        " something reached through it, `model.fc`) was mutated in place earlier in the walk,"
        " unless the loop itself bound it; rebinding an accumulator twice (`total += a;"
        " total += b`) is harmless and allowed."
    )
    cases = (
        Case(
            "rule0-mutate-then-rebind",
            """
            for epoch in range(3):
                for b in loader:
                    model.step()
                    model = other
        """,
            Refused("rule 0"),
        ),
        Case(
            "rule0-beats-rule1",
            """
            for epoch in range(3):
                for b in loader:
                    opt.step()
                    opt = factory.make_optimizer()
        """,
            Refused("rule 0: `opt` is rebound"),
        ),
        Case(
            "rule0-attribute-target",
            """
            for epoch in range(3):
                for b in loader:
                    self.opt.step()
                    self.opt = make()
        """,
            Refused("rule 0: `self.opt`"),
        ),
        Case(
            "rule0-name-whose-attribute-was-mutated",
            """
            for epoch in range(3):
                for b in loader:
                    model.fc.reset()
                    model = other
        """,
            Refused("mutated `model.fc` in place"),
        ),
        Case(
            "rule0-not-for-accumulator-rebound-twice",
            """
            total = 0
            for epoch in range(3):
                for b in loader:
                    total += b
                    total += 1
            print(total)
        """,
            {("total", R)},
        ),
        Case(
            "rule0-not-for-object-created-in-loop",
            """
            buf = None
            for epoch in range(3):
                for b in loader:
                    buf = []
                    buf.append(b)
                    buf = buf[-2:]
            print(buf)
        """,
            {("buf", R)},
        ),
        Case(
            "rebound-then-mutated-restores-by-rebinding",
            """
            for epoch in range(3):
                for b in loader:
                    model = fresh_model()
                    model.step()
            print(model)
        """,
            {("model", R)},
        ),
    )


def refuse_rebinding(w: Walk, targets: list[cst.BaseExpression], line: int) -> None:
    """Raise :class:`NoEstimate` when an assignment's target was mutated in place before. An
    object the loop itself created (its root bound in the loop) is exempt."""
    for t in targets:
        expr: str | None = None
        own: str | None = None  # the name whose binding decides the exemption
        if isinstance(t, cst.Name):
            expr, own = w.through_alias(t.value), t.value
        elif isinstance(t, cst.Attribute) and t.attr.value not in VIEW_ATTRS:
            expr = object_expr(t, w.module)
            own = None if expr is None else root(expr)
            if own in w.fx.aliases:
                expr = None  # a view's attribute: charged to the viewed object in place anyway
        if expr is None or own in w.fx.bound:
            continue
        old = _mutated_in_place(w, expr)
        if old is None:
            continue
        at = w.fx.advanced.get(old.expr)
        if at is not None:
            # the recycling idiom (`next(it)`, a fresh `iter(loader)` once it runs out): what
            # stops the loop is the iterator it carries, not the rebinding
            raise NoEstimate(
                f"line {at}: the loop advances `{old.expr}`, an iterator made before it,"
                f" whose position no checkpoint holds (line {line} replaces it)"
            )
        raise NoEstimate(
            f"line {line}: rule 0: `{w.prog.code(t)}` is rebound after the loop mutated"
            f" `{old.expr}` in place"
        )


def _mutated_in_place(w: Walk, expr: str) -> Change | None:
    """An in-place change to ``expr`` or to something reached through it (``model.fc``)."""
    for ch in w.fx.changes.values():
        if ch.restore is Restore.IN_PLACE and (ch.expr == expr or ch.expr.startswith(expr + ".")):
            return ch
    return None
