"""The order a script's calls and assignments run in, as far as its text says: statements in
source order, each call to a function of the script or of a project module it imports walked
into where it is first called, a project module's body walked where it is first imported.

Rules that ask "was the stream seeded before this draw?" or "was the variable set before CUDA
started?" read this one sequence. It is an approximation, stated in the rules' docs: both arms
of an ``if`` run, a loop body runs once, a function is walked at its first call only, and calls
the pass cannot resolve (a callable passed as an argument, a library's own code) are not
followed. Steps in another file are reported at the call or import in the checked file that
leads there.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from flortrain.check.project import script_module
from flortrain.check.unit import Unit
from flortrain.static.program import MODULE, Scope

#: nodes a step can be
Node = cst.Call | cst.Assign | cst.AugAssign | cst.AnnAssign
#: how deep calls are followed
_DEPTH = 12


@dataclass(frozen=True, eq=False)
class Step:
    unit: Unit  # the file the node is in
    node: Node
    scope: Scope  # the function (or module body) it runs in, in ``unit.program``
    #: where to report it in the checked file: the node itself, or the call or import there
    #: that leads to another file
    anchor: cst.CSTNode
    reached: bool = True  # False: a function the walk never called (run later, implicitly)


def steps(unit: Unit) -> tuple[Step, ...]:
    """The checked file's steps in execution order; then, for a script (a ``__main__`` guard
    or a loop at module level), the steps of the functions the walk did not reach but that may
    run (``forward``, ``__getitem__``, callbacks: :func:`_live`), ``reached=False``."""
    found = _STEPS.get(unit)
    if found is None:
        walk = _Walk(unit)
        walk.scope(unit, unit.program.scopes[MODULE], None, 0)
        out = walk.out
        if is_script(unit):
            live = _live(unit, walk)
            for qual, scope in unit.program.scopes.items():
                if qual in live:
                    out.extend(
                        Step(unit, n, scope, n, reached=False)
                        for n in nodes(unit, scope)
                        if not isinstance(n, cst.Import | cst.ImportFrom)
                    )
        found = tuple(out)
        _STEPS[unit] = found
    return found


_STEPS: weakref.WeakKeyDictionary[Unit, tuple[Step, ...]] = weakref.WeakKeyDictionary()


def _live(unit: Unit, walk: _Walk) -> set[str]:
    """Functions of the file the walk did not call that may still run: the methods of a class
    the path names (``Aug()`` makes ``Aug.__getitem__`` live, for the DataLoader), functions it
    hands on by name (``model.apply(init_weights)``), and, in turn, what those name. Others
    (a ``__main__`` block that only prepares data leaves the training code dead) are not."""
    prog = unit.program
    reached = {q for path, q in walk.seen if path == unit.path}
    names: set[str] = set()
    for step in walk.out:
        if step.unit is unit:
            names |= _references(step.node)
    live: set[str] = set()
    while True:
        classes = {c for c in prog.classes if c.rsplit(".", 1)[-1] in names}
        stack = list(classes)
        while stack:  # a live class's bases hold methods it runs
            for base in prog.classes[stack.pop()].bases:
                if base in prog.classes and base not in classes:
                    classes.add(base)
                    stack.append(base)
        new = {m for c in classes for m in prog.classes[c].methods.values()}
        for qual in prog.scopes:
            if qual != MODULE and qual.rsplit(".", 1)[-1] in names:
                outer = qual.rsplit(".", 1)[0] if "." in qual else MODULE
                if outer == MODULE or outer in reached or outer in live or outer in classes:
                    new.add(qual)
        new -= reached | live
        new &= set(prog.scopes)
        if not new:
            return live
        live |= new
        for qual in new:
            for node in nodes(unit, prog.scopes[qual]):
                names |= _references(node)


def _references(node: cst.CSTNode) -> set[str]:
    """Names a call or an assignment hands on: its callee, its arguments, the value assigned
    (the last part of a dotted name: ``self._init_weights`` names ``_init_weights``)."""
    values: list[cst.BaseExpression] = []
    if isinstance(node, cst.Call):
        values = [node.func, *(a.value for a in node.args)]
    elif isinstance(node, cst.Assign | cst.AnnAssign | cst.AugAssign) and node.value is not None:
        values = [node.value]
        if isinstance(node.value, cst.List | cst.Tuple | cst.Dict | cst.Set):
            values += [e.value for e in node.value.elements if isinstance(e, cst.BaseElement)]
    out: set[str] = set()
    for v in values:
        if isinstance(v, cst.Name):
            out.add(v.value)
        elif isinstance(v, cst.Attribute):
            out.add(v.attr.value)
    return out


def every_call(unit: Unit) -> Iterator[tuple[Scope, cst.Call]]:
    """Every call of the file with the function it is in (see :func:`nodes`), reached or not."""
    for scope in unit.program.scopes.values():
        for node in nodes(unit, scope):
            if isinstance(node, cst.Call):
                yield scope, node


def is_script(unit: Unit) -> bool:
    """The file runs as a program: a ``if __name__ == "__main__":`` block or a loop at module
    level. A module of helpers has no path of its own: its functions run when a script calls
    them, after whatever that script did first."""
    for stmt in unit.module.body:
        if isinstance(stmt, cst.For | cst.While):
            return True
        if isinstance(stmt, cst.If) and "__main__" in unit.source.code(stmt.test):
            return True
    return False


def callee(unit: Unit, scope: Scope, call: cst.Call) -> tuple[Unit, Scope] | None:
    """The function of the script or of a project module that ``call`` runs (a class's
    ``__init__`` for ``Class(...)``, ``forward`` for ``model(x)``), or None."""
    prog = unit.program
    resolved = prog.resolve_call(call, scope)
    if resolved is not None and resolved[0] in prog.scopes:
        return unit, prog.scopes[resolved[0]]
    cls = prog.type_of(call.func, scope) if not isinstance(call.func, cst.Call) else None
    if cls is not None:
        for name in ("forward", "__call__"):
            m = prog.method(cls, name)
            if m is not None and m in prog.scopes:
                return unit, prog.scopes[m]
    for qual in unit.called(call):
        if "." not in qual:
            continue
        dotted, name = qual.rsplit(".", 1)
        other = script_module(unit, dotted)
        if other is None:
            continue
        p = other.program
        if name in p.scopes:
            return other, p.scopes[name]
        if name in p.classes:
            init = p.method(name, "__init__")
            if init is not None:
                return other, p.scopes[init]
    return None


class _Walk:
    def __init__(self, root: Unit) -> None:
        self.root = root
        self.out: list[Step] = []
        self.seen: set[tuple[str, str]] = set()
        self.imported: set[str] = set()

    def scope(self, unit: Unit, scope: Scope, anchor: cst.CSTNode | None, depth: int) -> None:
        self.seen.add((unit.path, scope.qualname))
        for node in nodes(unit, scope):
            here = anchor if anchor is not None else node
            if isinstance(node, cst.Import | cst.ImportFrom):
                self._import(unit, node, here, depth)
                continue
            self.out.append(Step(unit, node, scope, here))
            if isinstance(node, cst.Call) and depth < _DEPTH:
                target = callee(unit, scope, node)
                if target is None:
                    continue
                t_unit, t_scope = target
                if (t_unit.path, t_scope.qualname) in self.seen:
                    continue
                inner = anchor if anchor is not None or t_unit is self.root else node
                self.scope(t_unit, t_scope, inner, depth + 1)

    def _import(
        self, unit: Unit, node: cst.Import | cst.ImportFrom, anchor: cst.CSTNode, depth: int
    ) -> None:
        names: list[str] = []
        if isinstance(node, cst.Import):
            names = [unit.source.code(a.name) for a in node.names]
        elif node.module is not None and not node.relative:
            names = [unit.source.code(node.module)]
        for dotted in names:
            other = script_module(self.root, dotted)
            if other is None or other.path in self.imported:
                continue
            self.imported.add(other.path)
            self.scope(other, other.program.scopes[MODULE], anchor, depth + 1)


Visited = Node | cst.Import | cst.ImportFrom
_NODES: weakref.WeakKeyDictionary[Unit, dict[str, tuple[Visited, ...]]] = (
    weakref.WeakKeyDictionary()
)


def nodes(unit: Unit, scope: Scope) -> tuple[Visited, ...]:
    """The scope's calls, assignments and imports in source order (a statement before the
    calls inside it), not counting nested functions; calls in a class body belong to the
    scope around the class (they run where it is defined), those in a lambda to the scope the
    lambda is written in."""
    return _by_scope(unit).get(scope.qualname, ())


def _by_scope(unit: Unit) -> dict[str, tuple[Visited, ...]]:
    """Built from facts the unit has anyway: its calls (one pass, shared with other rules) are
    placed in the innermost function whose range holds them; only statement lists are walked
    for assignments and imports, never expressions."""
    found = _NODES.get(unit)
    if found is not None:
        return found
    prog = unit.program
    functions = sorted(
        (
            (prog.range(s.node).start, prog.range(s.node).end, q)
            for q, s in prog.scopes.items()
            if isinstance(s.node, cst.FunctionDef)
        ),
        key=lambda f: (f[0].line, f[0].column),
    )

    def owner(node: cst.CSTNode) -> str:
        start = prog.range(node).start
        at = (start.line, start.column)
        inner = MODULE
        for begin, end, qual in functions:
            if (begin.line, begin.column) > at:
                break
            if at < (end.line, end.column):
                inner = qual  # later starts are nested deeper (or siblings after)
        return inner

    keyed: dict[str, list[tuple[tuple[int, int, int], Visited]]] = {}
    for stmt in _statements(unit.module):
        start = prog.range(stmt).start
        keyed.setdefault(owner(stmt), []).append(((start.line, start.column, 0), stmt))
    for call in unit.calls:
        start = prog.range(call).start
        keyed.setdefault(owner(call), []).append(((start.line, start.column, 1), call))
    found = {q: tuple(n for _, n in sorted(v, key=lambda kv: kv[0])) for q, v in keyed.items()}
    _NODES[unit] = found
    return found


def _statements(node: cst.CSTNode) -> Iterator[Visited]:
    """Assignments and imports under ``node``, through compound statements' bodies only."""
    for child in node.children:
        if isinstance(child, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            for small in child.body:
                if isinstance(
                    small, cst.Assign | cst.AugAssign | cst.AnnAssign | cst.Import | cst.ImportFrom
                ):
                    yield small
        elif not isinstance(child, cst.BaseExpression):
            yield from _statements(child)
