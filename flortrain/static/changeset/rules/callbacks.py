"""Callbacks: a function handed to a call may be called by it, so its effects count there."""

from __future__ import annotations

import libcst as cst

from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, P, R, Refused
from flortrain.static.changeset.rules import callees
from flortrain.static.effects import RULE_CALLEE
from flortrain.static.expressions import root
from flortrain.static.plan import Change


class Callbacks(ChangesetRule):
    name = "callbacks"
    pattern = (
        "a local function or a lambda passed to a call (`opt.step(closure)`, `model.apply(init)`)"
    )
    change = "what it changes that the caller can name, as if it were called there"
    doc = (
        "`opt.step(closure)` runs `closure` (LBFGS), `model.apply(init)` runs `init`. A lambda's"
        " changes through its own parameters are not counted: those are whatever the caller"
        " passes (a hook's module and outputs, a callback's arguments). A function or class"
        " defined inside the loop and used after it is refused: pickled by reference, it would"
        " come back as whatever the name holds when the checkpoint is read."
    )
    cases = (
        Case(
            "lbfgs-closure-defined-in-the-loop",
            """
            evals = 0
            for epoch in range(3):
                for b in loader:
                    def closure():
                        global evals
                        evals += 1
                        opt.zero_grad()
                        return loss_fn(model(b))
                    loss = opt.step(closure)
                print(evals, loss)
        """,
            {("evals", R), ("opt", P), ("loss", R), ("b", R)},
        ),  # `b`: the closure reads it
        Case(
            "module-level-closure-passed-by-name",
            """
            seen = []

            def closure():
                seen.append(1)
                return 0.0

            for epoch in range(3):
                for b in loader:
                    opt.step(closure)
        """,
            {("seen", P), ("opt", P)},
        ),
        Case(
            "lambda-callback-changes-a-global",
            """
            log = []
            for epoch in range(3):
                for b in loader:
                    model.apply(lambda m: log.append(type(m)))
        """,
            {("log", P), ("model", P)},
        ),
        Case(
            "lambda-callback-changing-only-its-argument",
            """
            for epoch in range(3):
                for b in loader:
                    model.apply(lambda m: m.reset_parameters())
        """,
            {("model", P)},
        ),
        Case(
            "pure-key-function-adds-nothing",
            """
            def by_loss(r):
                return r[1]

            for epoch in range(3):
                for b in loader:
                    best = sorted(results, key=by_loss)
                print(best)
        """,
            {("best", R)},
        ),
        Case(
            "function-defined-in-the-loop-and-used-after-refuses",
            """
            for epoch in range(3):
                for b in loader:
                    loss = step(b)
                    def report(v, l=loss):
                        return (v, l)
                print(report("end"))
        """,
            Refused("function `report` is defined inside the loop and used after it"),
        ),
        Case(
            "class-defined-in-the-loop-and-used-after-refuses",
            """
            for epoch in range(3):
                for b in loader:
                    class Marker:
                        pass
                print(Marker)
        """,
            Refused("class `Marker` is defined inside the loop"),
        ),
        Case(
            "function-defined-in-the-loop-used-only-inside-is-dropped",
            """
            for epoch in range(3):
                for b in loader:
                    def scaled(v):
                        return v * 2
                    total = scaled(b)
                print(total)
        """,
            {("total", R)},
        ),
    )


def passed_function(w: Walk, value: cst.BaseExpression, line: int) -> None:
    """Count the effects of a function handed to a call, called with no arguments we can see."""
    if isinstance(value, cst.Lambda):
        for ch in lambda_changes(w, value, line):
            w.add(ch.expr, ch.restore, RULE_CALLEE, line, ch.is_global)
    elif isinstance(value, cst.Name):
        call = cst.Call(func=value)
        resolved = w.prog.resolve_call(call, w.scope)
        if resolved is not None:
            callees.map_callee(w, call, resolved[0], None, line)


def lambda_changes(w: Walk, lam: cst.Lambda, line: int) -> list[Change]:
    """What a lambda's body changes, except through its own parameters."""
    sub = w.walker(w.scope, w.callee_stack)
    sub.expr_effects(lam.body, line)
    w.fx.reaches.update(sub.fx.reaches)
    p = lam.params
    star = [p.star_arg] if isinstance(p.star_arg, cst.Param) else []
    params = {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params, *star)}
    if p.star_kwarg is not None:
        params.add(p.star_kwarg.name.value)
    return [ch for ch in sub.fx.changes.values() if ch.is_global or root(ch.expr) not in params]
