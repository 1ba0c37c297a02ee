"""An index of a parsed script: its functions (scopes), classes, imported names, loops, and how
calls resolve to module-local functions and methods.

Everything later analyses ask ("which function does ``self.fit()`` call?", "is ``loss`` used outside
this loop?") is answered here once, so analyses stay small pure functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import CodeRange, PositionProvider

from flortrain.static.expressions import names_of
from flortrain.static.source import Source

if TYPE_CHECKING:
    from flortrain.static.liveness import Liveness

MODULE = "<module>"

Loop = cst.For | cst.While


@dataclass
class Scope:
    """A function (or the module body): where names are bound and loops live."""

    qualname: str
    node: cst.FunctionDef | cst.Module
    cls: str | None  # qualname of the class a method belongs to
    params: list[str] = field(default_factory=list)
    # names declared `global` or `nonlocal` (neither is local to this scope)
    declared_global: set[str] = field(default_factory=set)
    # the `nonlocal` subset: such a name lives in an enclosing *function*, not in the module, so it
    # is restored by plain assignment in this scope, never through ``globals()``
    declared_nonlocal: set[str] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)  # names bound anywhere in this scope
    loops: list[Loop] = field(default_factory=list)
    # every Name occurrence that belongs to this scope, with its line
    names: list[tuple[str, int]] = field(default_factory=list)
    # name -> local class qualname, from `name = Class(...)`
    types: dict[str, str] = field(default_factory=dict)
    # name -> the value of each binding of it here (None: bound otherwise than by `=` or `with ..
    # as`), for ``static/sinks``
    assigned: dict[str, list[cst.BaseExpression | None]] = field(default_factory=dict)

    @property
    def body(self) -> Sequence[cst.BaseStatement | cst.SimpleStatementSuite]:
        """The statements of the scope. A one-line body (``def f(x): return x``) is the suite node
        itself: a fresh node made here would have no position, and analyses ask for lines."""
        if isinstance(self.node, cst.Module):
            return self.node.body
        body = self.node.body
        if isinstance(body, cst.IndentedBlock):
            return body.body
        assert isinstance(body, cst.SimpleStatementSuite)
        return [body]

    def self_attr(self, expr: cst.BaseExpression) -> str | None:
        """The attribute ``expr`` names on a method's own instance (``self.x``), if it does."""
        if (
            isinstance(expr, cst.Attribute)
            and isinstance(expr.value, cst.Name)
            and self.cls is not None
            and self.params
            and expr.value.value == self.params[0]
        ):
            return expr.attr.value
        return None

    def is_local(self, name: str) -> bool:
        if self.qualname == MODULE:
            return True
        return name in self.bound and name not in self.declared_global


@dataclass
class ClassInfo:
    qualname: str
    bases: list[str]
    methods: dict[str, str] = field(default_factory=dict)  # name -> scope qualname
    attr_types: dict[str, str] = field(default_factory=dict)  # self.attr -> class qualname
    # self.attr -> the method and the value of each assignment to it (None: `+=` and the like)
    attr_assigned: dict[str, list[tuple[str, cst.BaseExpression | None]]] = field(
        default_factory=dict
    )


class Program:
    """The index. Build with :func:`index`."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.pos = source.wrapper.resolve(PositionProvider)
        self.scopes: dict[str, Scope] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.imported: set[str] = set()  # names bound by import statements at module level
        #: what each imported name stands for, by dotted import path, wherever it is imported
        #: (``SummaryWriter`` -> ``torch.utils.tensorboard.SummaryWriter``); a name imported
        #: from two places is left out
        self.import_origins: dict[str, str] = {}
        self._origin_clashes: set[str] = set()
        self.loop_scope: dict[Loop, Scope] = {}
        self.loop_parent: dict[Loop, Loop | None] = {}
        self.class_body_loops: set[Loop] = set()
        # each node's calls (:meth:`calls_in`), found once: the analyses ask again for every loop
        # and every function a loop reaches, and libcst builds a node's ``children`` anew on
        # each access (a 2,400-line file took 5.2 s to instrument before, a third of it here)
        self._calls: dict[cst.CSTNode, tuple[cst.Call, ...]] = {}
        #: an imported project module (its importers read its names after its body ran), not
        #: the script run as ``__main__``
        self.exports = False
        self._liveness: Liveness | None = None

    @property
    def liveness(self) -> Liveness:
        """Which names are live at each loop's exit (:mod:`flortrain.static.liveness`)."""
        if self._liveness is None:
            from flortrain.static.liveness import Liveness

            self._liveness = Liveness(self, self.exports)
        return self._liveness

    def import_origin(self, name: str) -> str | None:
        """The dotted path an imported name stands for (None: not imported, or from two places)."""
        return None if name in self._origin_clashes else self.import_origins.get(name)

    # -- positions -------------------------------------------------------------------------
    def range(self, node: cst.CSTNode) -> CodeRange:
        return self.pos[node]

    def line(self, node: cst.CSTNode) -> int:
        return self.pos[node].start.line

    def code(self, node: cst.CSTNode) -> str:
        return self.source.code(node)

    # -- call resolution -------------------------------------------------------------------
    def resolve_call(
        self, call: cst.Call, scope: Scope
    ) -> tuple[str, cst.BaseExpression | None] | None:
        """The module-local function a call runs, and the receiver bound to its ``self``."""
        func = call.func
        if isinstance(func, cst.Name):
            name = func.value
            owner = self.binding_scope(scope, name)
            if owner is not None and owner.qualname != MODULE:
                # a function defined in this or an enclosing function (`main.step` called from
                # `main` or from a sibling nested in `main`)
                nested = f"{owner.qualname}.{name}"
                return (nested, None) if nested in self.scopes else None
            if name in self.scopes:
                return name, None
            if name in self.classes:
                init = self.method(name, "__init__")
                return (init, None) if init else None
            return None
        if isinstance(func, cst.Attribute):
            cls = self.type_of(func.value, scope)
            if cls is not None:
                m = self.method(cls, func.attr.value)
                if m is not None:
                    return m, func.value
        return None

    def binding_scope(self, scope: Scope, name: str) -> Scope | None:
        """The scope whose variable ``name`` is, seen from ``scope`` (Python's lexical lookup; class
        bodies are skipped as Python skips them). None for builtins and undefined names."""
        module = self.scopes[MODULE]
        qual = scope.qualname
        current: Scope | None = scope
        while current is not None and current is not module:
            if current.is_local(name):
                return current
            if name in current.declared_global and name not in current.declared_nonlocal:
                break  # `global name`
            current = None
            while "." in qual:  # the next enclosing function (class qualnames are not scopes)
                qual = qual.rsplit(".", 1)[0]
                if qual in self.scopes:
                    current = self.scopes[qual]
                    break
        return module if name in module.bound else None

    def method(self, cls: str, name: str, _seen: frozenset[str] = frozenset()) -> str | None:
        info = self.classes.get(cls)
        if info is None or cls in _seen:
            return None
        if name in info.methods:
            return info.methods[name]
        for base in info.bases:
            m = self.method(base, name, _seen | {cls})
            if m is not None:
                return m
        return None

    def type_of(self, expr: cst.BaseExpression, scope: Scope) -> str | None:
        """The local class an expression is an instance of, when assignments make it plain."""
        if isinstance(expr, cst.Name):
            if (
                scope.cls is not None
                and isinstance(scope.node, cst.FunctionDef)
                and scope.params
                and expr.value == scope.params[0]
            ):
                return scope.cls
            if expr.value in scope.types:
                return scope.types[expr.value]
            return self.scopes[MODULE].types.get(expr.value)
        if isinstance(expr, cst.Attribute):
            owner = self.type_of(expr.value, scope)
            if owner is not None and owner in self.classes:
                return self.classes[owner].attr_types.get(expr.attr.value)
        if (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Name)
            and expr.func.value in self.classes
        ):
            return expr.func.value
        return None

    def calls_in(self, nodes: Sequence[cst.CSTNode]) -> Iterator[cst.Call]:
        """Calls made by these statements, not counting bodies of nested defs and lambdas, in
        source order."""
        for n in nodes:
            yield from self._calls_below(n)

    def _calls_below(self, node: cst.CSTNode) -> tuple[cst.Call, ...]:
        # keyed by the node itself (libcst nodes hash and compare by identity), so an entry
        # keeps its node alive and can never answer for another node at a reused address
        found = self._calls.get(node)
        if found is None:
            if isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Lambda):
                found = ()
            else:
                own: tuple[cst.Call, ...] = (node,) if isinstance(node, cst.Call) else ()
                found = own + tuple(c for child in node.children for c in self._calls_below(child))
            self._calls[node] = found
        return found

    def callees(self, nodes: Sequence[cst.CSTNode], scope: Scope) -> Iterator[str]:
        for call in self.calls_in(nodes):
            r = self.resolve_call(call, scope)
            if r is not None:
                yield r[0]

    def reachable(self, nodes: Sequence[cst.CSTNode], scope: Scope) -> set[str]:
        """Local functions reachable from these statements through calls, transitively."""
        seen: set[str] = set()
        stack = list(self.callees(nodes, scope))
        while stack:
            q = stack.pop()
            if q in seen or q not in self.scopes:
                continue
            seen.add(q)
            s = self.scopes[q]
            stack.extend(self.callees(list(s.body), s))
        return seen


class _Indexer(cst.CSTVisitor):
    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.scope_stack: list[Scope] = []
        self.class_stack: list[ClassInfo] = []
        self.loop_stack: list[list[Loop]] = [[]]
        # whether the innermost enclosing definition is a class body (loops there are not memoized)
        self.in_class_body: list[bool] = [False]
        self._with_names: set[int] = set()  # `with .. as` names, whose values WithItem noted

    @property
    def scope(self) -> Scope:
        return self.scope_stack[-1]

    def visit_Module(self, node: cst.Module) -> None:
        s = Scope(MODULE, node, None)
        self.prog.scopes[MODULE] = s
        self.scope_stack.append(s)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        outer = self.class_stack[-1].qualname + "." if self.class_stack else ""
        if self.scope.qualname != MODULE and not self.class_stack:
            outer = self.scope.qualname + "."
        qual = outer + node.name.value
        bases = [a.value.value for a in node.bases if isinstance(a.value, cst.Name)]
        self.prog.classes[qual] = ClassInfo(qual, bases)
        self.class_stack.append(self.prog.classes[qual])
        self.scope.bound.add(node.name.value)
        self._binds(node.name.value, None)
        self.in_class_body.append(True)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.class_stack.pop()
        self.in_class_body.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        # The def's own name, decorators, defaults and annotations are evaluated where the def
        # runs, not inside the function: uses of the enclosing scope (a `def closure():` inside a
        # loop is not a use of `closure` by some other scope).
        for part in (*node.decorators, *_param_parts(node.params), node.returns):
            if part is not None:
                for n in _names(part):
                    self.scope.names.append((n.value, self.prog.line(n)))
        cls = self.class_stack[-1] if self.in_class_body[-1] and self.class_stack else None
        if cls is not None:
            qual = f"{cls.qualname}.{node.name.value}"
            cls.methods.setdefault(node.name.value, qual)
        elif self.scope.qualname != MODULE:
            qual = f"{self.scope.qualname}.{node.name.value}"
            self.scope.bound.add(node.name.value)
        else:
            qual = node.name.value
            self.scope.bound.add(node.name.value)
        if cls is None:
            self._binds(node.name.value, None)
        params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        if isinstance(node.params.star_arg, cst.Param):
            params.append(node.params.star_arg.name.value)
        params += [p.name.value for p in node.params.kwonly_params]
        if node.params.star_kwarg is not None:
            params.append(node.params.star_kwarg.name.value)
        s = Scope(qual, node, cls.qualname if cls else None, params=params)
        s.bound.update(params)
        for p in params:
            s.assigned.setdefault(p, []).append(None)
        # Later definitions with the same name win, as at run time.
        self.prog.scopes[qual] = s
        self.scope_stack.append(s)
        self.loop_stack.append([])
        self.in_class_body.append(False)
        node.body.visit(self)
        return False

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scope_stack.pop()
        self.loop_stack.pop()
        self.in_class_body.pop()

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        # A lambda's parameters are its own; its body's free names still count as uses.
        for n in _names(node.body):
            self.scope.names.append((n.value, self.prog.line(n)))
        return False

    def _visit_loop(self, node: Loop) -> None:
        parent = self.loop_stack[-1][-1] if self.loop_stack[-1] else None
        self.prog.loop_parent[node] = parent
        self.prog.loop_scope[node] = self.scope
        if self.in_class_body[-1]:
            self.prog.class_body_loops.add(node)
        self.scope.loops.append(node)
        self.loop_stack[-1].append(node)

    def visit_For(self, node: cst.For) -> None:
        self._visit_loop(node)
        self.scope.bound.update(names_of(node.target))
        self._bind_target(node.target, None)

    def leave_For(self, original_node: cst.For) -> None:
        self.loop_stack[-1].pop()

    def visit_While(self, node: cst.While) -> None:
        self._visit_loop(node)

    def leave_While(self, original_node: cst.While) -> None:
        self.loop_stack[-1].pop()

    def visit_Global(self, node: cst.Global) -> None:
        self.scope.declared_global.update(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.scope.declared_global.update(n.name.value for n in node.names)
        self.scope.declared_nonlocal.update(n.name.value for n in node.names)

    def visit_Name(self, node: cst.Name) -> None:
        self.scope.names.append((node.value, self.prog.line(node)))

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        # `x.model` does not use a variable called `model`: only the value side holds names.
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Assign(self, node: cst.Assign) -> bool:
        if self.in_class_body[-1]:
            return self._class_attribute(node.value)
        for t in node.targets:
            names = names_of(t.target)
            self.scope.bound.update(names)
            self._note_type(t.target, node.value)
            self._bind_target(t.target, node.value)
        return True

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if self.in_class_body[-1]:
            return self._class_attribute(node.annotation, node.value)
        self.scope.bound.update(names_of(node.target))
        if node.value is not None:
            self._note_type(node.target, node.value)
            self._bind_target(node.target, node.value)
        return True

    def _class_attribute(self, *parts: cst.CSTNode | None) -> bool:
        """A class body's ``loss: float`` or ``lr = 0.1`` binds a class attribute, not a name of
        the scope around the class: only its annotation and value are uses there. Counted as a
        use, a dataclass field ``loss`` would make the loop's own ``loss`` look read after the
        loop, and a main loop's boundaries would be refused for it."""
        for part in parts:
            if part is not None:
                part.visit(self)
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.scope.bound.update(names_of(node.target))
        self._bind_target(node.target, None)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.scope.bound.update(names_of(node.target))
        self._bind_target(node.target, None)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name, node.item)
            self._with_names.add(id(node.asname))

    def visit_AsName(self, node: cst.AsName) -> None:
        self.scope.bound.update(names_of(node.name))
        if id(node) not in self._with_names:  # `except .. as e`, `import .. as m`
            self._bind_target(node.name, None)

    def _binds(self, name: str, value: cst.BaseExpression | None) -> None:
        scope = self.scope
        if name in scope.declared_global and name not in scope.declared_nonlocal:
            scope = self.prog.scopes[MODULE]
        scope.assigned.setdefault(name, []).append(value)

    def _bind_target(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        """Note a binding's value by name (``static/sinks``); a name among several targets
        (``a, b = ..``) gets no value of its own."""
        if isinstance(target, cst.Name):
            self._binds(target.value, value)
        elif isinstance(target, cst.Tuple | cst.List | cst.StarredElement):
            for n in names_of(target):
                self._binds(n, None)
        elif (
            isinstance(target, cst.Attribute)
            and isinstance(target.value, cst.Name)
            and self.scope.cls is not None
            and self.scope.params
            and target.value.value == self.scope.params[0]
        ):
            attrs = self.prog.classes[self.scope.cls].attr_assigned
            attrs.setdefault(target.attr.value, []).append((self.scope.qualname, value))

    def _origin(self, name: str, origin: str) -> None:
        if self.prog.import_origins.get(name, origin) != origin:
            self.prog._origin_clashes.add(name)
        self.prog.import_origins[name] = origin

    def visit_CompFor(self, node: cst.CompFor) -> None:
        pass  # comprehension variables live in their own scope

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            if alias.asname is not None:
                names = list(names_of(alias.asname.name))
            else:
                top: cst.BaseExpression = alias.name
                while isinstance(top, cst.Attribute):
                    top = top.value
                names = [top.value] if isinstance(top, cst.Name) else []
                for n in names:
                    self._binds(n, None)
                    self._origin(n, n)
            full = _dotted(alias.name)
            if alias.asname is not None and full is not None:
                for n in names:
                    self._origin(n, full)
            self.scope.bound.update(names)
            if self.scope.qualname == MODULE:
                self.prog.imported.update(names)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            target = alias.asname.name if alias.asname else alias.name
            names = list(names_of(target))
            if alias.asname is None:
                for n in names:
                    self._binds(n, None)
            base = _dotted(node.module) if node.module is not None and not node.relative else None
            name = _dotted(alias.name)
            if base is not None and name is not None:
                for n in names:
                    self._origin(n, f"{base}.{name}")
            self.scope.bound.update(names)
            if self.scope.qualname == MODULE:
                self.prog.imported.update(names)

    def _note_type(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return
        cls = value.func.value
        if cls not in self.prog.classes:
            return
        if isinstance(target, cst.Name):
            self.scope.types[target.value] = cls
        elif (
            isinstance(target, cst.Attribute)
            and isinstance(target.value, cst.Name)
            and self.scope.cls is not None
            and self.scope.params
            and target.value.value == self.scope.params[0]
        ):
            self.prog.classes[self.scope.cls].attr_types[target.attr.value] = cls


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr.value}"
    return None


def _param_parts(params: cst.Parameters) -> Iterator[cst.CSTNode]:
    """Default values and annotations of a def's parameters."""
    star = params.star_arg if isinstance(params.star_arg, cst.Param) else None
    for p in (
        *params.posonly_params,
        *params.params,
        *params.kwonly_params,
        star,
        params.star_kwarg,
    ):
        if p is None:
            continue
        if p.default is not None:
            yield p.default
        if p.annotation is not None:
            yield p.annotation


def _names(node: cst.CSTNode) -> Iterator[cst.Name]:
    if isinstance(node, cst.Name):
        yield node
    for c in node.children:
        yield from _names(c)


def index(source: Source, exports: bool = False) -> Program:
    prog = Program(source)
    prog.exports = exports
    source.wrapper.visit(_Indexer(prog))
    return prog
