"""The indexing walk: one pass over a parsed script that fills a :class:`Program` (its scopes, the
names each binds and uses, its loops, imports, local classes and the types names hold).

The walk is flortrain's own rather than libcst's ``ScopeProvider`` and ``QualifiedNameProvider``:
it records loops, ``self`` attributes and local class types in the same pass, and the providers
alone cost four to eleven times the whole walk (docs/architecture.md, "Static side").
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.static.expressions import dotted, names_of
from flortrain.static.program import MODULE, ClassInfo, Loop, Program, Scope
from flortrain.static.source import Source


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
        # every base, by its dotted name (or its code: `Generic[T]`); only the script's own
        # classes resolve, the rest tell that the class may inherit what the pass cannot see
        bases = [dotted(a.value) or cst.Module([]).code_for_node(a.value) for a in node.bases]
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
        elif (attr := self.scope.self_attr(target)) is not None and self.scope.cls is not None:
            attrs = self.prog.classes[self.scope.cls].attr_assigned
            attrs.setdefault(attr, []).append((self.scope.qualname, value))

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
            full = dotted(alias.name)
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
            base = dotted(node.module) if node.module is not None and not node.relative else None
            name = dotted(alias.name)
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
        elif (attr := self.scope.self_attr(target)) is not None and self.scope.cls is not None:
            self.prog.classes[self.scope.cls].attr_types[attr] = cls


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
