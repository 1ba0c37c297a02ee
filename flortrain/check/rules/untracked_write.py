"""Writes to tensor memory behind the version counter's back (``.data``, NumPy views)."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.plan import UNTRACKED


class UntrackedWrite(Rule):
    code = f"{Family.REPLAY}003"
    name = "untracked-write"
    severity = Severity.WARNING
    message = UNTRACKED
    hint = "write through the tensor itself under torch.no_grad() (`p.add_(g, alpha=-lr)`)"
    doc = (
        "Record trusts each tensor's version counter to tell that a large tensor is unchanged"
        " since its last checkpoint, and which modules a loop changed. A write through `.data`"
        " (`p.data.add_(..)`, `p.data[0] = 1`) or through a NumPy view (`t.numpy()[i] = x`)"
        " escapes the counter, so a script with one gets both shortcuts turned off: every"
        " checkpoint copies every tensor. Replays stay exact; records and checkpoints get slower"
        " and larger. Reported where the file has a training main loop (a nest of loops that never"
        " calls `backward()` or `step()` is not reported, though record applies the same rule"
        " to it). Such"
        " writes inside a library the script calls, or through another name for `.data`"
        " (`d = p.data; d.mul_(2)`), are not seen."
    )
    valid = (
        Valid(
            """
            import torch
            for epoch in range(2):
                for x in range(3):
                    loss = model(x)
                    loss.backward()
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(p.grad, alpha=-0.1)
            """
        ),
    )
    invalid = (
        Invalid(
            """
            for epoch in range(2):
                for x in range(3):
                    loss = model(x)
                    loss.backward()
                    for p in model.parameters():
                        p.data.add_(p.grad, alpha=-0.1)
            """,
            line=6,
            col=13,
        ),
        Invalid(
            """
            for epoch in range(2):
                for x in range(3):
                    model(x).backward()
                    w.numpy()[0] = 1.0
            """,
            line=4,
            col=9,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        p = plan_facts.plan(unit)
        if p is None or not plan_facts.training_mains(p):
            return
        for u in p.untracked:
            yield Hit(line=u.line, col=u.col)
