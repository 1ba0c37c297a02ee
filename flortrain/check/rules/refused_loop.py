"""Training loops the static pass will not memoize: they run as plain code on every replay."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.changeset.rules.escapes import YIELDS
from flortrain.static.plan import not_memoized


class RefusedLoop(Rule):
    code = f"{Family.REPLAY}001"
    name = "refused-loop"
    severity = Severity.WARNING
    message = "loop not memoized"
    hint = "change the statement the reason names, or move it out of the loop into a function of this file"
    doc = (
        "A loop inside a training main loop that the static pass cannot give a changeset (a call"
        " it has no side-effect estimate for, `return` or `yield` inside it, `for ... else`, a"
        " name rebound after the loop mutated it in place, ...) runs as plain code on every"
        " replay: correct, but nothing is skipped there. The message is the plan's own reason,"
        " as `flortrain instrument --explain` and `record` print it. Loops outside training"
        " (setup, a final evaluation, the nests of a script that never calls `backward()` or"
        " `step()`) are not reported, nor a generator's loop (`yield` inside it): a data source the"
        " training loop iterates, which no replay could skip. The pass sees one file: a call into another module is taken"
        " to change nothing the loop names (library functions), and what such a call does change"
        " is left to record's run-time watches."
    )
    valid = (
        Valid(
            """
            def main(model, opt, loader):
                for epoch in range(3):
                    for x, y in loader:
                        opt.zero_grad()
                        model(x).sum().backward()
                        opt.step()
            """
        ),
        # a loop outside training: setup, not a finding
        Valid(
            """
            def prepare(rows, step_fn):
                for r in rows:
                    for c in r:
                        step_fn(c)
            """
        ),
        # a generator the training loop iterates: a data source, not a finding
        Valid(
            """
            def main(model, opt):
                def batches():
                    for i in range(5):
                        yield i
                for epoch in range(3):
                    for x in batches():
                        model(x).backward()
                        opt.step()
            """
        ),
    )
    invalid = (
        Invalid(
            """
            def main(model, opt, loader, step_fn):
                for epoch in range(3):
                    for x, y in loader:
                        step_fn(model, opt, x, y)
                    for x, y in loader:
                        opt.zero_grad()
                        model(x).sum().backward()
                        opt.step()
                        if y is None:
                            return
            """,
            line=3,
            col=9,
        ),
        Invalid(
            """
            def main(model, opt, loader):
                for epoch in range(3):
                    for x, y in loader:
                        opt.zero_grad()
                        model(x).sum().backward()
                        opt.step()
                        if y is None:
                            return
            """,
            line=3,
            col=9,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        p = plan_facts.plan(unit)
        if p is None:
            return
        mains = plan_facts.training_mains(p)
        for r in p.refused:
            if r.main in mains and not r.reason.endswith(YIELDS):
                yield Hit(line=r.span.line, col=r.span.col, message=not_memoized(r.reason))
