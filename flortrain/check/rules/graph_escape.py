"""Tensors that leave a memoized loop carrying an autograd graph: its instances execute."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.graphs import ADDERS, Graphs, backward_receivers
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.plan import Restore, carries_graph


class GraphEscape(Rule):
    code = f"{Family.REPLAY}005"
    name = "graph-escape"
    severity = Severity.WARNING
    message = "a tensor leaves the loop carrying an autograd graph; it executes on replay"
    hint = "keep what the loop leaves detached (`loss.item()`, `.detach()`), or backward() inside the loop"
    doc = (
        "A checkpoint cannot hold a tensor with an autograd graph: restored, it would be a"
        " detached leaf, and a later `backward()` through it would silently miss the loop's part"
        " of the graph. So when a memoized loop's changeset holds one (REINFORCE's"
        " `saved_log_probs`, `total = total + loss` followed by `total.backward()`), record"
        " executes that loop's instances on replay instead of restoring them, and says so at run"
        " time. Only what the changeset keeps counts: names a path after the loop reads before"
        " rebinding (liveness), and objects changed in place; a name read after the loop only as"
        " a number (`loss.item()`) is stored detached and is not reported. Types are not known"
        " statically: a name may carry a graph when it is bound, outside `torch.no_grad()`, from"
        " a call of a module (an instance of a local `nn.Module` subclass or a `torch.nn` class),"
        " from the name a `backward()` is called on, or from another such name; a model held in"
        " a parameter or an attribute set elsewhere is not recognised."
    )
    valid = (
        # read after the loop only as a number: stored detached
        Valid(
            """
            import torch.nn as nn
            model = nn.Linear(2, 1)
            for epoch in range(2):
                for x in data:
                    loss = model(x).sum()
                    loss.backward()
                print(loss.item())
            """
        ),
        # built under no_grad: no graph
        Valid(
            """
            import torch, torch.nn as nn
            model = nn.Linear(2, 1)
            for epoch in range(2):
                for x in data:
                    model(x).sum().backward()
                with torch.no_grad():
                    for x in data:
                        out = model(x)
                print(out)
            """
        ),
        # a comparison's result has no graph
        Valid(
            """
            import torch.nn as nn
            model = nn.Linear(2, 2)
            for epoch in range(2):
                correct = 0
                for x, y in data:
                    logits = model(x)
                    logits.sum().backward()
                    correct = correct + (logits.argmax(1) == y).sum()
                print(correct)
            """
        ),
    )
    invalid = (
        Invalid(
            """
            import torch.nn as nn
            model = nn.Linear(2, 1)
            for epoch in range(2):
                total = 0
                for x in data:
                    total = total + model(x).sum()
                total.backward()
            """,
            line=5,
            col=5,
        ),
        Invalid(
            """
            import torch.nn as nn
            class Policy(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(2, 2)
                    self.log_probs = []
            policy = Policy()
            def act(state):
                policy.log_probs.append(policy(state).log_softmax(-1)[0])
            for episode in range(3):
                for t in range(10):
                    act(t)
                sum(policy.log_probs).backward()
                del policy.log_probs[:]
            """,
            line=11,
            col=5,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        graphs: Graphs | None = None
        for t in plan_facts.training_loops(unit):
            b, loop, scope, prog = t.block, t.loop, t.scope, t.program
            if graphs is None:
                graphs = Graphs(prog, backward_receivers(unit.calls))
            scopes = [scope, *(prog.scopes[q] for q in b.reaches if q in prog.scopes)]
            for c in b.changeset:
                if c.restore is Restore.REBOUND:
                    hit = (
                        "." not in c.expr
                        and c.expr not in b.values
                        and graphs.binds_graph(scope, c.expr, loop)
                    )
                else:
                    hit = _filled(unit.text, c.expr) and any(
                        c.expr in graphs.tainted(s)[1] for s in scopes
                    )
                if hit:
                    yield Hit(line=b.span.line, col=b.span.col, message=carries_graph(c.expr))
                    break  # one is enough: the instance executes


def _filled(text: str, expr: str) -> bool:
    """Whether the file's text adds to ``expr`` anywhere (a cheap test before the pass)."""
    return f"{expr}[" in text or any(f"{expr}.{m}(" in text for m in ADDERS)
