"""Which names are live at a loop's exit: some path from there reads them before rebinding them.

The loop-scoped filter (:mod:`flortrain.static.changeset`) drops a name the loop binds when
nothing after the loop can see the value it leaves. "Read somewhere after the loop" is too
coarse: the tutorial shape reuses ``outputs = model(images)`` in a test loop after training, and
that rebinding hides the training value, whose autograd graph then kept the loop from ever being
checkpointed. So this is a backward dataflow over one scope's statements, flow-sensitive through
branches, loops (their back edges: the loop itself runs again), ``break``/``continue``,
``try``/``except``/``finally`` (an exception may leave a ``try`` or a ``with`` body anywhere),
augmented assignment (it reads first) and ``del`` (it reads).

Where it cannot see, it keeps the name live: a name a nested function, lambda or generator
expression mentions (they run later, anywhere), a module name any function reads as a global,
a scope that calls ``locals()``/``eval()``/``exec()`` or inspects frames (no answer at all), and
at the end of an imported project module every name (its importers read them).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from flortrain.static.expressions import names_of, preorder
from flortrain.static.program import MODULE, Loop, Program, Scope

#: calls that read a scope's names without naming them (``vars()`` and ``dir()`` only bare:
#: ``vars(args)`` reads an object)
_INTROSPECTION = frozenset({"locals", "eval", "exec", "globals", "_getframe", "currentframe"})
_BARE_INTROSPECTION = frozenset({"vars", "dir"})
_FRAMES = frozenset({"_getframe", "currentframe"})

_MAY_INTROSPECT = re.compile(
    r"\b(?:" + "|".join(sorted(_INTROSPECTION | _BARE_INTROSPECTION)) + r")\s*\("
)

#: context managers whose ``__exit__`` never swallows an exception
_PASSES_EXCEPTIONS = frozenset(
    {
        "no_grad",
        "enable_grad",
        "inference_mode",
        "set_grad_enabled",
        "autocast",
        "open",
        "record_function",
    }
)

#: name -> the line of a read that makes it live
Live = dict[str, int]


@dataclass(frozen=True)
class _Ctx:
    brk: Live | None = None  # live after the innermost loop
    cont: Live | None = None  # live at the innermost loop's head
    exc: Live | None = None  # live where an exception raised here may land
    ret: Live | None = None  # live where a `return` lands (a `finally` reads them)


def _union(*sets: Live | None) -> Live:
    out: Live = {}
    for s in sets:
        if s:
            for k, v in s.items():
                out.setdefault(k, v)
    return out


def _kill(live: Live, names: Iterable[str]) -> Live:
    gone = set(names)
    return {k: v for k, v in live.items() if k not in gone}


class _Scope:
    """The liveness facts of one scope, computed once."""

    def __init__(self, prog: Program, scope: Scope, end: Live) -> None:
        self.prog = prog
        self.exits: dict[Loop, Live] = {}
        if isinstance(scope.node, cst.FunctionDef):
            self._seq(list(scope.body), end, _Ctx(ret=end))
        else:
            self._seq(list(scope.body), end, _Ctx())

    # -- reads -----------------------------------------------------------------------------------
    def uses(self, node: cst.CSTNode | None) -> Live:
        """The names an expression or statement part reads (:func:`uses`)."""
        return uses(self.prog, node)

    def target_uses(self, t: cst.BaseExpression) -> Live:
        """What binding to ``t`` reads: the object and index of ``a.b`` and ``a[i]``."""
        if isinstance(t, cst.Name):
            return {}
        if isinstance(t, cst.Tuple | cst.List):
            return _union(*(self.target_uses(e.value) for e in t.elements))
        if isinstance(t, cst.StarredElement):
            return self.target_uses(t.value)
        return self.uses(t)

    # -- statements ------------------------------------------------------------------------------
    def _seq(self, stmts: Sequence[cst.CSTNode], out: Live, ctx: _Ctx) -> Live:
        live = out
        for s in reversed(stmts):
            live = _union(self._stmt(s, live, ctx), ctx.exc)
        return live

    def _suite(self, suite: cst.BaseSuite, out: Live, ctx: _Ctx) -> Live:
        if isinstance(suite, cst.IndentedBlock):
            return self._seq(suite.body, out, ctx)
        assert isinstance(suite, cst.SimpleStatementSuite)
        return self._seq(suite.body, out, ctx)

    def _stmt(self, s: cst.CSTNode, out: Live, ctx: _Ctx) -> Live:
        if isinstance(s, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            return self._seq(s.body, out, ctx)
        if isinstance(s, cst.If):
            if isinstance(s.orelse, cst.If):
                other = self._stmt(s.orelse, out, ctx)
            elif s.orelse is not None:
                other = self._suite(s.orelse.body, out, ctx)
            else:
                other = out
            return _union(self.uses(s.test), self._suite(s.body, out, ctx), other)
        if isinstance(s, cst.For | cst.While):
            return self._loop(s, out, ctx)
        if isinstance(s, cst.With):
            # a context manager may swallow an exception (``suppress``): the body may end anywhere
            swallows = not all(_never_swallows(i.item) for i in s.items)
            exc = _union(ctx.exc, out) if swallows else ctx.exc
            body = self._suite(s.body, out, _Ctx(ctx.brk, ctx.cont, exc, ctx.ret))
            bound = [
                n for item in s.items if item.asname is not None for n in names_of(item.asname.name)
            ]
            live = _union(
                _kill(body, bound), *(self.target_uses(i.asname.name) for i in s.items if i.asname)
            )
            for item in reversed(s.items):
                live = _union(self.uses(item.item), live)
            return live
        if isinstance(s, cst.Try | cst.TryStar):
            return self._try(s, out, ctx)
        if isinstance(s, cst.FunctionDef):
            return _union(self.uses(s), _kill(out, [s.name.value]))
        if isinstance(s, cst.ClassDef):
            return _union(_kill(out, [s.name.value]), self.uses(s))
        if isinstance(s, cst.Match):
            live = _union(out)
            for case in s.cases:
                live = _union(
                    live,
                    self.uses(case.pattern),
                    self.uses(case.guard),
                    self._suite(case.body, out, ctx),
                )
            return _union(self.uses(s.subject), live)
        return self._small(s, out, ctx)

    def _loop(self, loop: Loop, out: Live, ctx: _Ctx) -> Live:
        self.exits[loop] = _union(self.exits.get(loop), out)
        after = self._suite(loop.orelse.body, out, ctx) if loop.orelse is not None else out
        head: Live = {}
        while True:  # the head's live set grows to its fixpoint (finitely many names)
            inner = _Ctx(brk=out, cont=head, exc=ctx.exc, ret=ctx.ret)
            body = self._suite(loop.body, head, inner)
            if isinstance(loop, cst.For):
                body = _union(_kill(body, names_of(loop.target)), self.target_uses(loop.target))
                new = _union(head, body, after)
            else:
                new = _union(head, self.uses(loop.test), body, after)
            if new.keys() == head.keys():
                break
            head = new
        self.exits[loop] = _union(self.exits[loop], out)
        return _union(self.uses(loop.iter), head) if isinstance(loop, cst.For) else head

    def _try(self, s: cst.Try | cst.TryStar, out: Live, ctx: _Ctx) -> Live:
        # a `finally` runs on every way out (an exception, a return, a break): what it reads is
        # live everywhere inside
        fin = self.uses(s.finalbody.body) if s.finalbody is not None else {}
        after = self._suite(s.finalbody.body, out, ctx) if s.finalbody is not None else out
        inner = _Ctx(
            None if ctx.brk is None else _union(ctx.brk, fin),
            None if ctx.cont is None else _union(ctx.cont, fin),
            _union(ctx.exc, fin),
            None if ctx.ret is None else _union(ctx.ret, fin),
        )
        handlers: Live = {}
        for h in s.handlers:
            body = self._suite(h.body, after, inner)
            if h.name is not None:
                body = _kill(body, names_of(h.name.name))
            handlers = _union(handlers, self.uses(h.type), body)
        orelse = self._suite(s.orelse.body, after, inner) if s.orelse is not None else after
        body_ctx = _Ctx(inner.brk, inner.cont, _union(inner.exc, handlers), inner.ret)
        return _union(self._suite(s.body, orelse, body_ctx), handlers)

    def _small(self, s: cst.CSTNode, out: Live, ctx: _Ctx) -> Live:
        if isinstance(s, cst.Return):
            return _union(self.uses(s.value), ctx.ret)
        if isinstance(s, cst.Raise):
            return _union(self.uses(s.exc), self.uses(s.cause), ctx.exc)
        if isinstance(s, cst.Break):
            return _union(ctx.brk)
        if isinstance(s, cst.Continue):
            return _union(ctx.cont)
        if isinstance(s, cst.Assign):
            bound = [n for t in s.targets for n in names_of(t.target)]
            return _union(
                self.uses(s.value),
                *(self.target_uses(t.target) for t in s.targets),
                _kill(out, bound),
            )
        if isinstance(s, cst.AnnAssign):
            if s.value is None:
                return _union(self.uses(s.annotation), out)
            return _union(
                self.uses(s.value), self.target_uses(s.target), _kill(out, names_of(s.target))
            )
        if isinstance(s, cst.AugAssign):
            return _union(self.uses(s.value), self.uses(s.target), out)  # reads its target first
        if isinstance(s, cst.Del):
            return _union(self.uses(s.target), out)  # `del x` fails on an unbound x: a read
        if isinstance(s, cst.Import):
            names = [
                n
                for a in s.names
                for n in (names_of(a.asname.name) if a.asname else [_top(a.name)])
            ]
            return _kill(out, names)
        if isinstance(s, cst.ImportFrom):
            if isinstance(s.names, cst.ImportStar):
                return _union(out)
            return _kill(
                out, [n for a in s.names for n in names_of(a.asname.name if a.asname else a.name)]
            )
        if isinstance(s, cst.Global | cst.Nonlocal | cst.Pass):
            return _union(out)
        return _union(self.uses(s), out)  # an expression, an assert


def uses(prog: Program, node: cst.CSTNode | None) -> Live:
    """The names an expression or statement part reads, each with the line of a read
    (over-approximated: a comprehension's own variables count as reads), not entering nested
    function bodies."""
    out: Live = {}
    if node is None:
        return out
    stack: list[cst.CSTNode] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            out.setdefault(n.value, prog.line(n))
            continue
        if isinstance(n, cst.Attribute):
            stack.append(n.value)
            continue
        if isinstance(n, cst.Arg):
            stack.append(n.value)
            continue
        if isinstance(n, cst.FunctionDef):
            stack.extend(n.decorators)
            stack.extend(_param_parts(n.params))
            if n.returns is not None:
                stack.append(n.returns)
            continue
        stack.extend(n.children)
    return out


def _never_swallows(item: cst.BaseExpression) -> bool:
    """A context manager known to let every exception through (grad modes, autocast, files)."""
    if not isinstance(item, cst.Call):
        return False
    f = item.func
    name = (
        f.value if isinstance(f, cst.Name) else f.attr.value if isinstance(f, cst.Attribute) else ""
    )
    return name in _PASSES_EXCEPTIONS


def _introspects(call: cst.Call) -> bool:
    f = call.func
    if isinstance(f, cst.Attribute):  # `sys._getframe(1)`; `model.eval()` is no `eval`
        return f.attr.value in _FRAMES
    name = f.value if isinstance(f, cst.Name) else ""
    return name in _INTROSPECTION or (name in _BARE_INTROSPECTION and not call.args)


def _top(node: cst.BaseExpression) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _param_parts(params: cst.Parameters) -> list[cst.CSTNode]:
    star = params.star_arg if isinstance(params.star_arg, cst.Param) else None
    out: list[cst.CSTNode] = []
    for p in (
        *params.posonly_params,
        *params.params,
        *params.kwonly_params,
        star,
        params.star_kwarg,
    ):
        if p is not None:
            out += [x for x in (p.default, p.annotation) if x is not None]
    return out


#: builtins that exhaust the iterable they are given before they return: a generator expression
#: passed to one (``sum(x * x for x in xs)``) runs at that call, not later
_CONSUMERS = frozenset(
    {"sum", "any", "all", "min", "max", "sorted", "list", "tuple", "set", "frozenset", "dict"}
)


def _deferred(root: cst.CSTNode, prog: Program) -> Live:
    """Names read by code that runs later, anywhere: lambda bodies and generator expressions
    (lazily evaluated) directly in this scope. A generator expression's outermost iterable is
    evaluated where it is made, and one a builtin consumes at once runs there: the flow sees
    those reads at their statement (:func:`uses`)."""
    out: Live = {}
    stack = [root]
    while stack:
        n = stack.pop()
        if n is not root and isinstance(n, cst.FunctionDef | cst.ClassDef):
            continue
        if isinstance(n, cst.Call) and (gen := _consumed_at_once(n, prog)) is not None:
            stack.append(n.func)
            stack.extend(gen.children)
            stack.extend(a for a in n.args if a.value is not gen)
            continue
        if isinstance(n, cst.Lambda | cst.GeneratorExp):
            eager = n.for_in.iter if isinstance(n, cst.GeneratorExp) else None
            now = {id(m) for m in _names(eager)} if eager is not None else set()
            for m in _names(n):
                if id(m) not in now:
                    out.setdefault(m.value, prog.line(m))
            if eager is not None:
                stack.append(eager)
            continue
        stack.extend(n.children)
    return out


def _consumed_at_once(call: cst.Call, prog: Program) -> cst.GeneratorExp | None:
    """The generator expression ``call`` exhausts before it returns: the first argument of a
    builtin of :data:`_CONSUMERS` the script never rebinds."""
    f = call.func
    if not (isinstance(f, cst.Name) and f.value in _CONSUMERS and prog.bindings.unbound(f.value)):
        return None
    first = call.args[0] if call.args else None
    if first is None or first.keyword is not None or first.star:
        return None
    return first.value if isinstance(first.value, cst.GeneratorExp) else None


def _names(node: cst.CSTNode) -> list[cst.Name]:
    out: list[cst.Name] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            out.append(n)
        elif isinstance(n, cst.Attribute):
            stack.append(n.value)
        else:
            stack.extend(n.children)
    return out


class Liveness:
    """Liveness at loop exits for every scope of a program, computed on demand.

    ``exports``: the program is an imported module, whose names its importers read after its body
    has run."""

    def __init__(self, prog: Program, exports: bool = False) -> None:
        self.prog = prog
        self.exports = exports
        self._scopes: dict[str, _Scope] = {}
        # `globals()` in any function reads the module's names, `sys._getframe(1)` a caller's
        # (the text is searched first: walking a large module's nodes costs seconds)
        self.blind = _MAY_INTROSPECT.search(prog.source.text) is not None and any(
            isinstance(n, cst.Call) and _introspects(n) for n in preorder(prog.source.module)
        )

    def after(self, loop: Loop) -> Live | None:
        """The names live at ``loop``'s exit, each with the line of a read that makes it live;
        None when the scope defeats the analysis (introspection), and every name is live."""
        scope = self.prog.loop_scope[loop]
        if self.blind:
            return None
        facts = self._facts(scope)
        return _union(facts.exits.get(loop), self._always(scope))

    def _facts(self, scope: Scope) -> _Scope:
        if scope.qualname not in self._scopes:
            end: Live = {}
            if scope.qualname == MODULE and self.exports:
                end = {n: 0 for n in scope.bound}
            self._scopes[scope.qualname] = _Scope(self.prog, scope, end)
        return self._scopes[scope.qualname]

    def _always(self, scope: Scope) -> Live:
        """Names live everywhere in ``scope``: read by code that runs at times the flow does not
        show (nested functions, lambdas, generator expressions, functions reading globals)."""
        out = _deferred(scope.node, self.prog)
        for n, line in inner_reads(self.prog, scope).items():
            out.setdefault(n, line)
        return out


def inner_reads(prog: Program, scope: Scope) -> Live:
    """The names of ``scope`` that the scopes nested in it (every scope, for the module) read,
    each with the line of a read: they run at times the flow of ``scope`` does not show."""
    out: Live = {}
    prefix = scope.qualname + "."
    for other in prog.scopes.values():
        if other is scope:
            continue
        if scope.qualname == MODULE or other.qualname.startswith(prefix):
            for n, line in other.names:
                if not other.is_local(n) or n in other.declared_global:
                    out.setdefault(n, line)
    return out


__all__ = ["Live", "Liveness", "inner_reads", "liveness_of", "uses"]


_cache: weakref.WeakKeyDictionary[Program, Liveness] = weakref.WeakKeyDictionary()


def liveness_of(prog: Program) -> Liveness:
    """The program's :class:`Liveness`, built once (every candidate loop asks)."""
    live = _cache.get(prog)
    if live is None:
        live = _cache[prog] = Liveness(prog, prog.exports)
    return live
