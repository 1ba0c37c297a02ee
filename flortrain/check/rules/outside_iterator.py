"""Memoized loops that advance an iterator made before them: no checkpoint holds its position."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.expressions import dotted
from flortrain.static.plan import outside_iterator
from flortrain.static.program import Program, Scope

#: calls that make an iterator (not a container a ``for`` makes a fresh iterator of)
_ITERATORS = frozenset({"iter", "map", "filter", "zip", "enumerate", "reversed", "open"})
_ITERATOR_MODULES = ("itertools.", "csv.reader", "csv.DictReader")
#: header calls that advance the iterators they are given
_PASSING = frozenset({"zip", "enumerate", "islice", "chain", "map", "filter", "tqdm"})


class OutsideIterator(Rule):
    code = f"{Family.REPLAY}004"
    name = "outside-iterator"
    severity = Severity.WARNING
    message = "the loop iterates an iterator made before it, whose position no checkpoint holds"
    hint = "iterate a container the loop header makes an iterator of (`for x in loader`), not a name holding one"
    doc = (
        "A generator or other iterator made before a loop and advanced by it (`for x in gen`,"
        " `zip(range(3), gen)`, `islice(gen, 3)`, `next(it)` in the body) has its position in"
        " its own frame, where no checkpoint reaches: a skipped instance would leave it where it"
        " was. Record sees the iterator at each instance's entry and stops checkpointing that"
        " loop and its main loop's iterations, with the same reason; so the replay is exact but"
        " executes them. An iterator the header makes from a container (`enumerate(loader)`) is"
        " fresh at each instance and is not reported. Statically a name is an iterator when every"
        " binding of it is `iter(..)`, `map`/`filter`/`zip`/`enumerate`/`reversed`/`open`, an"
        " `itertools` or `csv` reader call, a generator expression or a call of a generator"
        " function of this file; an iterator returned by another module's function is not known,"
        " nor one reached deeper than one attribute (`self.data.stream`), which record does not"
        " see either: a replay that skips such a loop would be wrong, and only `diff` tells."
    )
    valid = (
        Valid(
            """
            for epoch in range(2):
                for x in loader:
                    model(x).backward()
                    opt.step()
            """
        ),
        Valid(
            """
            for epoch in range(2):
                for i, x in enumerate(loader):
                    model(x).backward()
                    opt.step()
            """
        ),
    )
    invalid = (
        Invalid(
            """
            def batches():
                while True:
                    yield 1
            stream = batches()
            for epoch in range(2):
                for x in zip(range(3), stream):
                    model(x).backward()
                    opt.step()
            """,
            line=6,
            col=5,
        ),
        Invalid(
            """
            it = iter(loader)
            for epoch in range(2):
                for step in range(3):
                    x = next(it)
                    model(x).backward()
                    opt.step()
            """,
            line=3,
            col=5,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        for t in plan_facts.training_loops(unit):
            b, loop, scope, prog = t.block, t.loop, t.scope, t.program
            for name in _advanced(prog, scope, loop):
                if _iterator_name(prog, scope, name):
                    yield Hit(line=b.span.line, col=b.span.col, message=outside_iterator(name))
                    break


def _advanced(prog: Program, scope: Scope, loop: cst.For | cst.While) -> Iterator[str]:
    """Names the loop advances: iterated by its header (directly or through ``zip``...), or
    passed to ``next()`` in its body."""
    if isinstance(loop, cst.For):
        stack: list[cst.BaseExpression] = [loop.iter]
        while stack:
            e = stack.pop()
            if isinstance(e, cst.Name | cst.Attribute):
                yield prog.code(e)
            elif isinstance(e, cst.Call) and (dotted(e.func) or "").rsplit(".", 1)[-1] in _PASSING:
                stack.extend(a.value for a in e.args if a.keyword is None)
    for call in prog.calls_in(list(_body(loop))):
        if isinstance(call.func, cst.Name) and call.func.value == "next" and call.args:
            arg = call.args[0].value
            if isinstance(arg, cst.Name | cst.Attribute):
                yield prog.code(arg)


def _body(loop: cst.For | cst.While) -> list[cst.CSTNode]:
    return [loop.body]


def _iterator_name(prog: Program, scope: Scope, expr: str) -> bool:
    parts = expr.split(".")
    values: list[cst.BaseExpression | None]
    if len(parts) == 1:
        owner = prog.binding_scope(scope, expr)
        values = owner.assigned.get(expr, []) if owner is not None else []
    elif len(parts) == 2 and scope.cls is not None and scope.params and parts[0] == scope.params[0]:
        info = prog.classes.get(scope.cls)
        values = [v for _, v in info.attr_assigned.get(parts[1], [])] if info else []
    else:
        return False
    return bool(values) and all(v is not None and _makes_iterator(prog, scope, v) for v in values)


def _makes_iterator(prog: Program, scope: Scope, value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.GeneratorExp):
        return True
    if not isinstance(value, cst.Call):
        return False
    name = dotted(value.func) or ""
    head = name.split(".")[0]
    origin = prog.import_origin(head)
    full = origin + name[len(head) :] if origin else name
    if name in _ITERATORS or full.startswith(_ITERATOR_MODULES):
        return True
    resolved = prog.resolve_call(value, scope)
    return (
        resolved is not None
        and resolved[0] in prog.scopes
        and _generator(prog.scopes[resolved[0]].node)
    )


def _generator(node: cst.CSTNode) -> bool:
    """Whether a function's own body yields (not a nested function's)."""
    stack = list(node.children) if isinstance(node, cst.FunctionDef) else []
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Yield):
            return True
        if not isinstance(n, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            stack.extend(n.children)
    return False
