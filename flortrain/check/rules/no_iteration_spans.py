"""Training main loops without iteration boundary state: a replay cannot jump over iterations."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.plan import no_iteration_spans


class NoIterationSpans(Rule):
    code = f"{Family.REPLAY}002"
    name = "no-iteration-spans"
    severity = Severity.WARNING
    message = "no iteration spans"
    hint = "change the statement the reason names, or move it into a function of this file"
    doc = (
        "A replay jumps over whole iterations of a main loop in which no probe can fire, from"
        " boundary checkpoints that hold what an iteration carries to the next. When the main"
        " loop's own body has no changeset (the reason names the statement), there are no such"
        " checkpoints: a probe in the main loop's body makes the replay run every iteration, and"
        " only the memoized loops inside it are skipped. The message is the one"
        " `flortrain instrument --explain` prints. Main loops of scripts that never call"
        " `backward()` or `step()` are not reported."
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
    )
    invalid = (
        Invalid(
            """
            def main(model, opt, loader, report):
                for epoch in range(3):
                    for x, y in loader:
                        opt.zero_grad()
                        model(x).sum().backward()
                        opt.step()
                    report(model)
            """,
            line=2,
            col=5,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        p = plan_facts.plan(unit)
        if p is None:
            return
        for m in plan_facts.training_mains(p).values():
            if m.boundary is None:
                yield Hit(
                    line=m.span.line,
                    col=m.span.col,
                    message=f"main loop {m.id}: {no_iteration_spans(m.no_boundary)}",
                )
