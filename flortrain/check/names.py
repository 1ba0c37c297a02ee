"""What a name or dotted expression stands for, by import path, from one pass over the file.

libcst's ``QualifiedNameProvider`` answers the same question through its full scope analysis,
which costs several passes over the tree and most of a check's time on a real script. Rules ask
a narrower question ("is this ``numpy.random.default_rng``?"), which an import table per scope
answers: the innermost function scope that binds the name's head decides, as Python's lookup
does (class bodies are skipped, as they are for the methods inside them). The same pass records
each node's parent and every call, which rules ask for too.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field

import libcst as cst

from flortrain.static.expressions import names_of

_BUILTINS = frozenset(dir(builtins))

Scoped = cst.Module | cst.FunctionDef | cst.Lambda | cst.ClassDef


@dataclass
class _Scope:
    node: Scoped
    parent: _Scope | None
    prefix: str  # "" at module level, "f.<locals>." inside f
    #: local name -> dotted paths (two when ``try: import a as x / except: import b as x``)
    imports: dict[str, set[str]] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)  # names bound otherwise
    #: a class body: its names are seen by its own statements, not by the methods inside it
    is_class: bool = False


class Names(cst.CSTVisitor):
    """Build with :func:`resolve_names`; then :meth:`qualified` answers for any node."""

    def __init__(self) -> None:
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.calls: list[cst.Call] = []
        self._scope_of: dict[cst.CSTNode, _Scope] = {}
        self._stack: list[cst.CSTNode] = []
        self._scopes: list[_Scope] = []
        self._classes: list[str] = []

    # -- the pass ----------------------------------------------------------------------------
    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parents[node] = self._stack[-1]
        self._stack.append(node)
        if self._scopes:
            self._scope_of[node] = self._scopes[-1]
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self._stack.pop()

    def visit_Module(self, node: cst.Module) -> None:
        s = _Scope(node, None, "")
        self._scopes.append(s)
        self._scope_of[node] = s

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._current.bound.add(node.name.value)
        self._classes.append(node.name.value)
        self._push(node, self._current.prefix)
        self._current.is_class = True

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()
        self._scopes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        outer = self._current
        outer.bound.add(node.name.value)
        inside = ".".join([*self._classes, node.name.value]) if outer.is_class else node.name.value
        prefix = f"{outer.prefix if not outer.is_class else ''}{inside}.<locals>."
        self._push(node, prefix)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scopes.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._push(node, f"{self._current.prefix}<lambda>.<locals>.")

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._scopes.pop()

    def visit_Param(self, node: cst.Param) -> None:
        self._current.bound.add(node.name.value)

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_Import(self, node: cst.Import) -> None:
        for a in node.names:
            full = _dotted(a.name)
            if a.asname is not None and isinstance(a.asname.name, cst.Name):
                self._import(a.asname.name.value, full)
            else:
                head = full.split(".")[0]
                self._import(head, head)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        # a relative import keeps its dots (``.utils.f``), as libcst spells it
        base = "." * len(node.relative) + (_dotted(node.module) if node.module else "")
        for a in node.names:
            name = _dotted(a.name)
            local = (
                a.asname.name.value
                if a.asname is not None and isinstance(a.asname.name, cst.Name)
                else name
            )
            self._import(local, f"{base}.{name}" if not base.endswith(".") else base + name)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        parent = self._stack[-2] if len(self._stack) > 1 else None
        if not isinstance(parent, cst.ImportAlias):
            self._bind(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Global(self, node: cst.Global) -> None:
        pass  # a global name resolves in the module: not bound here

    @property
    def _current(self) -> _Scope:
        return self._scopes[-1]

    def _push(self, node: Scoped, prefix: str) -> None:
        s = _Scope(node, self._current, prefix)
        self._scopes.append(s)
        self._scope_of[node] = s

    def _import(self, local: str, path: str) -> None:
        self._current.imports.setdefault(local, set()).add(path)

    def _bind(self, target: cst.CSTNode) -> None:
        self._current.bound.update(names_of(target))

    # -- queries -----------------------------------------------------------------------------
    def qualified(self, node: cst.CSTNode) -> set[str]:
        """``node`` as dotted paths: ``numpy.random.default_rng`` for an imported name,
        ``builtins.print`` for a builtin, ``f.<locals>.rng.normal`` for a local (libcst's
        spelling); calls and subscripts in the chain are looked through
        (``DataLoader(d).foo``, ``sd[k].copy_``)."""
        chain = _chain(node)
        if not chain:
            return set()
        head, rest = chain[0], chain[1:]
        scope = self._scope_of.get(node)
        first = True
        while scope is not None:
            if first or not scope.is_class:
                if head in scope.imports:
                    return {".".join([p, *rest]) for p in scope.imports[head]}
                if head in scope.bound:
                    return {scope.prefix + ".".join(chain)}
            first = False
            scope = scope.parent
        if head in _BUILTINS:
            # libcst stops at a builtin's call: ``open(p).read`` is ``builtins.open``
            return {f"builtins.{head}" if _through_call(node) else ".".join(["builtins", *chain])}
        return set()


def resolve_names(module: cst.Module) -> Names:
    names = Names()
    module.visit(names)
    return names


def _chain(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, cst.Attribute):
        base = _chain(node.value)
        return [*base, node.attr.value] if base else []
    if isinstance(node, cst.Call):
        return _chain(node.func)
    if isinstance(node, cst.Subscript):
        return _chain(node.value)
    return []


def _through_call(node: cst.CSTNode) -> bool:
    while isinstance(node, cst.Attribute | cst.Subscript):
        node = node.value
    return isinstance(node, cst.Call)


def _dotted(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""
