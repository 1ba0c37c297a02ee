"""Value-only names: rebound loop outputs that nothing after the loop can use for autograd.

A tensor that leaves a loop with its autograd graph (``loss`` of the last micro-step) cannot be
checkpointed faithfully: restored, it is a detached leaf, and a later ``backward()`` through it
would miss the loop's part of the graph. But most such names are read afterwards only as
numbers (nanoGPT's ``lossf = loss.item() * gradient_accumulation_steps``), and for those the
detached value is indistinguishable from the original. This module proves that, conservatively:

- every read of the name outside the loop, in its scope, is a *value read*: it flows through
  out-of-place tensor methods and arithmetic into ``.item()``, ``.tolist()``, ``.detach()``,
  ``float()``, ``int()`` or an f-string field with a format spec (``f"{x.norm():.4f}"``), none
  of which can reach the graph;
- inside the loop, the name is rebound unconditionally (in order, through ``with`` blocks)
  before any read that is not a value read (``hidden = hidden.detach()`` is fine), so a later
  instance of the loop never builds on the restored value;
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
#: methods that reach or extend the graph itself, whatever their result
_GRAPH_METHODS = frozenset({"backward", "register_hook", "retain_grad", "requires_grad"})


def value_only(prog: Program, scope: Scope, loop: Loop, name: str) -> bool:
    """Whether ``name``, rebound by ``loop``, is only ever read as a number outside it."""
    if name in scope.declared_global or read_elsewhere(prog, scope, name):
        return False
    rng = prog.range(loop)
    start, end = rng.start.line, rng.end.line
    for node, parents in occurrences(scope.node, name):
        line = prog.line(node)
        if start <= line <= end:
            continue  # the loop itself: see _rebinds_first
        if is_target(parents):
            continue
        if not value_read(node, parents):
            return False
    return _rebinds_first(loop.body, name)


def read_elsewhere(prog: Program, scope: Scope, name: str) -> bool:
    for other in prog.scopes.values():
        if other is scope:
            continue
        if any(n == name for n, _ in other.names) and not other.is_local(name):
            binder = prog.binding_scope(other, name)
            if binder is scope or (binder is None and scope.qualname == MODULE):
                return True
    return False


def occurrences(root: cst.CSTNode, name: str) -> Iterator[tuple[cst.Name, list[cst.CSTNode]]]:
    """Every ``Name`` node spelling ``name`` in the scope, with its ancestors (nearest last),
    not entering nested functions or classes (their own scopes). A lambda's occurrences are
    reported with the lambda among the ancestors (and so are never value reads)."""
    names, parent = _index(root)
    for node in names.get(name, ()):
        chain: list[cst.CSTNode] = []
        up = parent.get(node)
        while up is not None:
            chain.append(up)
            up = parent.get(up)
        chain.reverse()
        yield node, chain


#: one walk per scope, shared by every name asked about (the analyses ask about many)
_INDEXES: dict[cst.CSTNode, tuple[dict[str, list[cst.Name]], dict[cst.CSTNode, cst.CSTNode]]] = {}


def _index(root: cst.CSTNode) -> tuple[dict[str, list[cst.Name]], dict[cst.CSTNode, cst.CSTNode]]:
    """The ``Name`` nodes under ``root`` by spelling, and each node's parent (up to ``root``)."""
    hit = _INDEXES.get(root)
    if hit is not None:
        return hit
    names: dict[str, list[cst.Name]] = {}
    parent: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            names.setdefault(node.value, []).append(node)
        if node is not root and isinstance(node, cst.FunctionDef | cst.ClassDef):
            continue
        for child in node.children:
            if isinstance(node, cst.Attribute) and child is node.attr:
                continue  # `obj.name` is an attribute, not the name
            parent[child] = node
            stack.append(child)
    if len(_INDEXES) >= 64:  # the import hook analyses one module after another
        _INDEXES.clear()
    _INDEXES[root] = (names, parent)
    return names, parent


def is_target(parents: Sequence[cst.CSTNode]) -> bool:
    """Whether the occurrence is bound by an assignment (``loss = 0``, ``logits, loss = f()``)."""
    for p in reversed(parents):
        if isinstance(p, cst.AssignTarget):
            return True
        if not isinstance(p, cst.Tuple | cst.List | cst.Element | cst.StarredElement):
            return False
    return False


def value_read(node: cst.Name, parents: Sequence[cst.CSTNode]) -> bool:
    """Whether this read of a tensor only feeds a number out: it flows through out-of-place tensor
    methods and arithmetic (``hidden.norm()``, ``loss * 4``) into a sink that leaves autograd
    (``.item()``, ``.tolist()``, ``.detach()``, ``float()``/``int()``, a formatted f-string field)."""
    if any(isinstance(p, cst.Lambda) for p in parents):
        return False
    child: cst.CSTNode = node
    for i in range(len(parents) - 1, -1, -1):
        p = parents[i]
        if p is child:
            continue  # the call of a method handled at its attribute
        up = parents[i - 1] if i > 0 else None
        if (
            isinstance(p, cst.Attribute)
            and p.value is child
            and isinstance(up, cst.Call)
            and up.func is p
        ):
            method = p.attr.value
            if method in _VALUE_METHODS:
                return True
            if method.endswith("_") or method in _GRAPH_METHODS:
                return False
            child = up  # an out-of-place tensor method: its result carries the graph on
            continue
        if isinstance(p, cst.Call) and child is not p.func:
            return (
                isinstance(p.func, cst.Name)
                and p.func.value in _VALUE_FUNCTIONS
                and len(p.args) == 1
            )
        if isinstance(p, cst.Arg):
            child = p
            continue
        if isinstance(p, cst.BinaryOperation | cst.UnaryOperation):
            child = p
            continue
        if isinstance(p, cst.FormattedStringExpression):
            return p.expression is child and p.format_spec is not None
        return False
    return False


def reads_only_values(node: cst.CSTNode, name: str) -> bool:
    """Whether every read of ``name`` in ``node`` (a probe) is a value read (targets excluded)."""
    return all(
        is_target(parents) or value_read(n, parents) for n, parents in occurrences(node, name)
    )


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return any(True for _ in occurrences(node, name))


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
    """Whether each instance of the loop rebinds ``name`` unconditionally before any read that
    is not a value read: then a later instance never uses the restored value for autograd."""
    for s in _statements(body):
        if not _mentions(s, name):
            continue
        if not reads_only_values(s, name):
            return False
        if isinstance(s, cst.Assign) and any(_binds(t.target, name) for t in s.targets):
            return True
    return False


def _binds(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, cst.Tuple | cst.List):
        return any(_binds(e.value, name) for e in target.elements)
    return False
