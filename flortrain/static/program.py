"""An index of a parsed script: its functions (scopes), classes, imported names, loops, and how
calls resolve to module-local functions and methods.

Everything later analyses ask ("which function does ``self.fit()`` call?", "is ``loss`` used outside
this loop?") is answered here once, so analyses stay small pure functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst.metadata import CodeRange, PositionProvider

from flortrain.static.bindings import Bindings
from flortrain.static.source import Source

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

    @cached_property
    def bindings(self) -> Bindings:
        """Every binding of every name in the script (``static/bindings``)."""
        return Bindings(self.source.module)

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
                    return m, self._bound_to(m, cls, func.value, scope)
            if (
                isinstance(func.value, cst.Name)
                and func.value.value in self.classes
                and self.bindings.bound_once(func.value.value)  # its `class` statement alone
            ):
                # `Config.from_args(a)`: through the class, a classmethod's `cls` is the class,
                # a staticmethod's or a plain function's parameters are the arguments
                m = self.method(func.value.value, func.attr.value)
                if m is not None and method_kind(self.scopes[m]) is not None:
                    return m, (func.value if method_kind(self.scopes[m]) == "classmethod" else None)
        return None

    def _bound_to(
        self, method: str, cls: str, receiver: cst.BaseExpression, scope: Scope
    ) -> cst.BaseExpression | None:
        """What ``receiver.method(..)`` binds the method's first parameter to, ``receiver`` being
        an instance of ``cls`` (or ``scope``'s own ``cls``): nothing for a staticmethod (its
        parameters are the arguments); for a classmethod, the class, where it is known (the
        caller's own ``cls``, or a class the script never subclasses: else the receiver, which
        :func:`~flortrain.static.changeset.rules.callees.map_callee` refuses); else the
        receiver."""
        kind = method_kind(self.scopes[method])
        if kind == "staticmethod":
            return None
        if kind != "classmethod":
            return receiver
        own = method_kind(scope) == "classmethod" and scope.params
        if isinstance(receiver, cst.Name) and own and receiver.value == scope.params[0]:
            return receiver
        if "." not in cls and self.bindings.bound_once(cls) and not self.subclassed(cls):
            return cst.Name(cls)
        return receiver

    def subclassed(self, cls: str) -> bool:
        """Whether a class of the script names ``cls`` among its bases."""
        return any(cls in info.bases for info in self.classes.values())

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

    def held_callable(self, cls: str, name: str) -> bool:
        """Whether ``obj.name(...)`` on an instance of the local class ``cls`` calls a callable
        held in an attribute rather than a method: not a method of the class or its local bases,
        and either assigned by their code (``self.act = act``) or not inheritable, all bases
        being the script's. A name that a library base may provide (``zero_grad`` of a
        ``torch.nn.Module`` subclass) is taken for a method of the receiver."""
        if self.method(cls, name) is not None:
            return False
        unseen_base = False
        todo, seen = [cls], set()
        while todo:
            info = self.classes.get(todo.pop())
            if info is None or info.qualname in seen:
                continue
            seen.add(info.qualname)
            if name in info.attr_assigned:
                return True
            unseen_base |= any(b not in self.classes for b in info.bases)
            todo += info.bases
        return not unseen_base

    def type_of(self, expr: cst.BaseExpression, scope: Scope) -> str | None:
        """The local class an expression is an instance of, when assignments make it plain."""
        if isinstance(expr, cst.Name):
            if (
                scope.cls is not None
                and isinstance(scope.node, cst.FunctionDef)
                and scope.params
                and expr.value == scope.params[0]
                and method_kind(scope) != "staticmethod"  # its first parameter is an argument
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


def method_kind(scope: Scope) -> str | None:
    """``"classmethod"``, ``"staticmethod"`` or ``"method"`` for a function decorated with the
    bare builtin or with nothing; None for any other decorator, whose binding is not known."""
    node = scope.node
    if not isinstance(node, cst.FunctionDef):
        return None
    names = [
        d.decorator.value if isinstance(d.decorator, cst.Name) else "" for d in node.decorators
    ]
    if not names:
        return "method"
    if names in (["classmethod"], ["staticmethod"]):
        return names[0]
    return None
