"""Iteration over a set, whose order for strings and most objects changes from run to run."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import plan_facts
from flortrain.check.finding import Edit, Fix, Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.set_kinds import NUMBER, STR, set_kind
from flortrain.check.unit import Unit
from flortrain.static.program import Program, Scope

#: consumers that see their argument's order: ``sorted`` may stand for the first two
_ORDERED = frozenset({"list", "tuple", "enumerate", "zip", "next", "iter", "reversed"})
#: consumers whose result does not depend on the order they are given
_ORDER_FREE = frozenset({"sorted", "set", "frozenset", "len", "min", "max", "sum", "any", "all"})
#: loop bodies whose effect does not depend on the order: adding to a set, storing by key
_ORDER_FREE_METHODS = frozenset({"add", "discard", "remove", "update", "pop"})


class SetOrder(Rule):
    code = f"{Family.DETERMINISM}102"
    name = "set-order"
    severity = Severity.WARNING
    message = (
        "iteration over a set of strings: its order changes with PYTHONHASHSEED from run to run"
    )
    hint = "iterate sorted(...) of it"
    doc = (
        "A set iterates in the order of its elements' hashes. A string's hash is salted per"
        " process (PYTHONHASHSEED), and an object without `__hash__` of its own (a tensor, a"
        " module, a parameter) hashes by its address, so a vocabulary, a list of classes or"
        " parameter groups built by iterating a set come out in another order in the next run:"
        " other indices, other batches, another run that no seed repeats. Integers, floats and"
        " tuples of them hash by value and iterate the same in every run, so they are not"
        " reported. The static pass knows the elements' type only where the text says it (string"
        " literals, `str.split()`, file lines, `range`, `len`); a set of unknown elements is"
        " reported with a message that says so. Order-free uses are not: `sorted`, `len`, `min`,"
        " `max`, `sum`, `in`, set comprehensions, a loop that only adds to a set or stores by key."
        " The fix, `sorted(...)`, is unsafe: elements that do not compare raise `TypeError`."
    )
    valid = (
        Valid("words = {'a', 'b'}\nvocab = sorted(words)\n"),
        Valid("ids = set(range(10))\nfor i in ids:\n    print(i)\n"),
        Valid("seen = set(names)\nn = len(seen)\nok = 'x' in seen\n"),
        Valid("chars = sorted(list(set(open('input.txt').read())))\n"),
        Valid("patterns = set(['add', 'mul'])\nhit = any(n == p for p in patterns)\n"),
        Valid("tags = {'a', 'b'}\nkept = set()\nfor t in tags:\n    kept.add(t.upper())\n"),
    )
    invalid = (
        Invalid(
            "text = open('input.txt').read()\nchars = list(set(text))\n",
            line=2,
            col=14,
            fixed="text = open('input.txt').read()\nchars = sorted(set(text))\n",
        ),
        Invalid(
            "labels = {'cat', 'dog'}\nfor i, name in enumerate(labels):\n    print(i, name)\n",
            line=2,
            col=26,
            fixed="labels = {'cat', 'dog'}\nfor i, name in enumerate(sorted(labels)):\n    print(i, name)\n",
        ),
        Invalid(
            "stoi = {c: i for i, c in enumerate(set(words))}\n",
            line=1,
            col=36,
            fixed="stoi = {c: i for i, c in enumerate(sorted(set(words)))}\n",
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        prog = plan_facts.program(unit)
        if prog is None or not _mentions_sets(unit.text):
            return
        for node, scope in _iterated(unit, prog):
            if _order_dropped(unit, node):
                continue
            kind = set_kind(prog, scope, node, 0)
            if kind is None or kind == NUMBER:
                continue
            message = (
                self.message
                if kind == STR
                else "iteration over a set: unless its elements are numbers, its order changes"
                " from run to run (strings by PYTHONHASHSEED, other objects by address)"
            )
            yield Hit(node, message=message, fix=_fix(unit, node))


def _order_dropped(unit: Unit, node: cst.CSTNode) -> bool:
    """Whether what iterates ``node`` hands its result to a consumer that drops the order
    (``sorted(list(set(t)))``, ``any(p == x for p in patterns)``), through ``list``/``tuple``
    and comprehensions."""
    up = unit.parent(node)
    while up is not None:
        if isinstance(up, cst.CompFor | cst.Arg | cst.GeneratorExp | cst.ListComp):
            up = unit.parent(up)
            continue
        if isinstance(up, cst.Call) and isinstance(up.func, cst.Name):
            if up.func.value in _ORDER_FREE:
                return True
            if up.func.value in ("list", "tuple"):
                up = unit.parent(up)
                continue
        return False
    return False


def _mentions_sets(text: str) -> bool:
    return "set(" in text or "{" in text


def _iterated(unit: Unit, prog: Program) -> Iterator[tuple[cst.BaseExpression, Scope]]:
    """Expressions whose iteration order reaches the program: ``for`` and comprehension
    iterables (not a set comprehension's, nor a loop that only adds or stores by key) and
    arguments of order-keeping consumers."""
    module_scope = prog.scopes["<module>"]
    comps: list[cst.BaseExpression] = []
    for node in unit.positions:  # every node, without another walk of the tree
        if isinstance(node, cst.CompFor) and not isinstance(unit.parent(node), cst.SetComp):
            comps.append(node.iter)  # a set comprehension's result has no order
    for scope in prog.scopes.values():
        for loop in scope.loops:
            if isinstance(loop, cst.For) and not _order_free(loop):
                yield loop.iter, scope
    for call in unit.calls:
        f = call.func
        name = f.value if isinstance(f, cst.Name) else None
        if name in _ORDERED or (
            isinstance(f, cst.Attribute) and f.attr.value in ("join", "fromkeys")
        ):
            for a in call.args:
                if a.keyword is None:
                    yield a.value, _scope_of(unit, prog, call, module_scope)
    for it in comps:
        yield it, _scope_of(unit, prog, it, module_scope)


def _scope_of(unit: Unit, prog: Program, node: cst.CSTNode, default: Scope) -> Scope:
    up = unit.parent(node)
    while up is not None:
        if isinstance(up, cst.FunctionDef):
            for s in prog.scopes.values():
                if s.node is up:
                    return s
        up = unit.parent(up)
    return default


def _order_free(loop: cst.For) -> bool:
    body = loop.body
    if not isinstance(body, cst.IndentedBlock) or loop.orelse is not None:
        return False
    for s in body.body:
        if not isinstance(s, cst.SimpleStatementLine):
            return False
        for small in s.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                f = small.value.func
                if isinstance(f, cst.Attribute) and f.attr.value in _ORDER_FREE_METHODS:
                    continue
            if isinstance(small, cst.Assign) and all(
                isinstance(t.target, cst.Subscript) for t in small.targets
            ):
                continue
            if isinstance(small, cst.Pass | cst.Del):
                continue
            return False
    return True


def _fix(unit: Unit, node: cst.BaseExpression) -> Fix:
    parent = unit.parent(node)
    consumer = unit.parent(parent) if isinstance(parent, cst.Arg) else None
    if (
        isinstance(consumer, cst.Call)
        and isinstance(consumer.func, cst.Name)
        and consumer.func.value == "list"
        and len(consumer.args) == 1
    ):
        start, end = unit.span(consumer.func)
        return Fix((Edit(start, end, "sorted"),), safe=False)
    start, end = unit.span(node)
    return Fix((Edit(start, start, "sorted("), Edit(end, end, ")")), safe=False)
