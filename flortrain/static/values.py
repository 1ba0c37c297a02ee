"""Value-only names: rebound loop outputs that nothing after the loop can use for autograd.

A tensor that leaves a loop with its autograd graph (``loss`` of the last micro-step) cannot be
checkpointed faithfully: restored, it is a detached leaf, and a later ``backward()`` through it
would miss the loop's part of the graph. But most such names are read afterwards only as
numbers (nanoGPT's ``lossf = loss.item() * gradient_accumulation_steps``), and for those the
detached value is indistinguishable from the original. This module proves that, conservatively:

- every read of the name outside the loop, in its scope, is a *value read*: ``x.item()``,
  ``x.tolist()``, ``x.detach()``, ``float(x)``, ``int(x)``, or an f-string field with a format
  spec (``f"{x:.4f}"``), none of which can reach the graph;
- inside the loop, the first statement that mentions the name (in order, through ``with``
  blocks) rebinds it from an expression that does not read it, so a later instance of the loop
  never sees the restored value;
- no other scope (a function reading the global, a closure) and no lambda mentions it.

Anything else (``return loss``, ``print(loss)``, which prints ``grad_fn=``, ``total.backward()``)
is not proved, and a graph-carrying value then makes the instance execute on replay.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

from flortrain.static.program import MODULE, Loop, Program, Scope

_VALUE_METHODS = frozenset({"item", "tolist", "detach"})
_VALUE_FUNCTIONS = frozenset({"float", "int"})


def value_only(prog: Program, scope: Scope, loop: Loop, name: str) -> bool:
    """Whether ``name``, rebound by ``loop``, is only ever read as a number outside it."""
    if name in scope.declared_global or _read_elsewhere(prog, scope, name):
        return False
    rng = prog.range(loop)
    start, end = rng.start.line, rng.end.line
    for node, parents in _occurrences(scope.node, name):
        line = prog.line(node)
        if start <= line <= end:
            continue  # the loop itself: see _rebinds_first
        if _is_target(parents):
            continue
        if not _value_read(node, parents):
            return False
    return _rebinds_first(loop.body, name)


def _read_elsewhere(prog: Program, scope: Scope, name: str) -> bool:
    for other in prog.scopes.values():
        if other is scope:
            continue
        if any(n == name for n, _ in other.names) and not other.is_local(name):
            binder = prog.binding_scope(other, name)
            if binder is scope or (binder is None and scope.qualname == MODULE):
                return True
    return False


def _occurrences(root: cst.CSTNode, name: str) -> Iterator[tuple[cst.Name, list[cst.CSTNode]]]:
    """Every ``Name`` node spelling ``name`` in the scope, with its ancestors (nearest last),
    not entering nested functions or classes (their own scopes). A lambda's occurrences are
    reported with the lambda among the ancestors (and so are never value reads)."""
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode]]] = [(root, [])]
    while stack:
        node, parents = stack.pop()
        if isinstance(node, cst.Name) and node.value == name:
            yield node, parents
        for child in node.children:
            if node is not root and isinstance(node, cst.FunctionDef | cst.ClassDef):
                break
            if isinstance(node, cst.Attribute) and child is node.attr:
                continue  # `obj.name` is an attribute, not the name
            stack.append((child, [*parents, node]))


def _is_target(parents: Sequence[cst.CSTNode]) -> bool:
    """Whether the occurrence is bound by an assignment (``loss = 0``, ``logits, loss = f()``)."""
    for p in reversed(parents):
        if isinstance(p, cst.AssignTarget):
            return True
        if not isinstance(p, cst.Tuple | cst.List | cst.Element | cst.StarredElement):
            return False
    return False


def _value_read(node: cst.Name, parents: Sequence[cst.CSTNode]) -> bool:
    if any(isinstance(p, cst.Lambda) for p in parents):
        return False
    if len(parents) >= 2:
        attr, call = parents[-1], parents[-2]
        if (
            isinstance(attr, cst.Attribute)
            and attr.value is node
            and attr.attr.value in _VALUE_METHODS
            and isinstance(call, cst.Call)
            and call.func is attr
        ):
            return True
        arg, call = parents[-1], parents[-2]
        if (
            isinstance(arg, cst.Arg)
            and isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value in _VALUE_FUNCTIONS
            and len(call.args) == 1
        ):
            return True
    parent = parents[-1] if parents else None
    return isinstance(parent, cst.FormattedStringExpression) and parent.expression is node and (
        parent.format_spec is not None
    )


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return any(True for _ in _occurrences(node, name))


def _statements(body: cst.BaseSuite) -> Iterator[cst.BaseStatement | cst.BaseSmallStatement]:
    """The loop body's statements in order, entering ``with`` blocks (they always run)."""
    if isinstance(body, cst.SimpleStatementSuite):
        yield from body.body
        return
    assert isinstance(body, cst.IndentedBlock)
    for s in body.body:
        if isinstance(s, cst.SimpleStatementLine):
            yield from s.body
        elif isinstance(s, cst.With):
            yield from _statements(s.body)
        else:
            yield s


def _rebinds_first(body: cst.BaseSuite, name: str) -> bool:
    for s in _statements(body):
        if not _mentions(s, name):
            continue
        if not isinstance(s, cst.Assign) or _mentions(s.value, name):
            return False
        return any(_binds(t.target, name) for t in s.targets)
    return False


def _binds(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, cst.Tuple | cst.List):
        return any(_binds(e.value, name) for e in target.elements)
    return False
