"""The walk: a loop's statements, each handed to the rule that applies to it.

Statements are visited in order, compound ones through their bodies; an assignment goes to rule 0
(:mod:`~.rules.rebinding`) before its value and targets are judged, a call to the call rules
(:mod:`~.rules.method_call`, :mod:`~.rules.function_call`, :mod:`~.rules.callees`). What the
rules find accumulates in one :class:`~flortrain.static.effects.Effects`; a statement no rule can
estimate raises :class:`~flortrain.static.effects.NoEstimate`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import libcst as cst

from flortrain.static.changeset.rules import (
    aliases,
    assignment,
    callbacks,
    callees,
    escapes,
    function_call,
    library_knowledge,
    method_call,
    rebinding,
)
from flortrain.static.effects import Effects, NoEstimate
from flortrain.static.expressions import (
    names_of,
    object_expr,
    pattern_captures,
    root,
    target_exprs,
    top,
)
from flortrain.static.plan import Change, Restore
from flortrain.static.program import MODULE, Program, Scope


class Walker:
    """Walks statements applying the rules; raises :class:`NoEstimate` to refuse."""

    def __init__(
        self, prog: Program, scope: Scope, callee_stack: frozenset[str], in_loop: bool = True
    ) -> None:
        self.in_loop = in_loop
        self.prog = prog
        self.scope = scope
        self.fx = Effects()
        self.callee_stack = callee_stack
        self.module = prog.source.module
        self.defined: dict[str, tuple[int, str]] = {}  # names bound by `def`/`class`: line, kind

    def walker(self, scope: Scope, stack: frozenset[str]) -> Walker:
        return Walker(self.prog, scope, stack, in_loop=False)

    # -- recording ---------------------------------------------------------------------------
    def add(
        self, expr: str, restore: Restore, rule: int, line: int, is_global: bool = False
    ) -> None:
        takes = self.fx.takes.get(root(expr))
        if takes and (restore is Restore.IN_PLACE or "." in expr):
            # changing the loop variable changes each object it takes in turn
            for obj in takes:
                self.add(obj, Restore.IN_PLACE, rule, line)
            return
        if root(expr) in self.fx.aliases and (restore is Restore.IN_PLACE or "." in expr):
            # mutating a view (or setting an attribute on it) changes the object it views;
            # rebinding the view's own name changes nothing else
            expr = self.through_alias(root(expr))
            restore = Restore.IN_PLACE
        old = self.fx.changes.get(expr)
        if old is None:
            self.fx.changes[expr] = Change(expr, restore, rule, line, is_global)
        elif restore is Restore.REBOUND and old.restore is Restore.IN_PLACE:
            # A name both mutated and (later) rebound is restored by rebinding: its final object
            # carries every in-place change made to it.
            self.fx.changes[expr] = Change(expr, restore, rule, line, is_global)

    def through_alias(self, expr: str) -> str:
        seen: set[str] = set()
        while root(expr) in self.fx.aliases and root(expr) not in seen:
            seen.add(root(expr))
            expr = self.fx.aliases[root(expr)]
        return expr

    def bind(self, names: Iterable[str]) -> None:
        self.fx.bound.update(names)

    def is_global(self, name: str) -> bool:
        """Whether rebinding ``name`` here rebinds a module global (restored through ``globals()``).
        A ``nonlocal`` name is not: the restore statement sits in this same function, where plain
        assignment reaches the enclosing function's variable."""
        return (
            self.scope.qualname != MODULE
            and not self.scope.is_local(name)
            and name not in self.scope.declared_nonlocal
        )

    def rebind(self, names: Iterable[str], line: int) -> None:
        """Names a statement binds without an ``=`` (``with ... as``, ``import``, ``def``, ``class``,
        ``case`` captures) keep their last value after the loop, like ``v = u`` (rule 3); the
        loop-scoped filter drops those nobody reads after the loop."""
        for n in names:
            self.bind([n])
            self.add(n, Restore.REBOUND, 3, line, is_global=self.is_global(n))

    def add_target_object(self, obj: str, line: int, rule: int) -> None:
        if root(obj) in self.prog.imported:
            raise NoEstimate(f"line {line}: the loop mutates module `{root(obj)}`")
        self.add(obj, Restore.IN_PLACE, rule, line)

    def scope_shadows(self, name: str) -> bool:
        return name in self.scope.bound or name in self.prog.scopes[MODULE].bound

    # -- statements --------------------------------------------------------------------------
    def statements(self, stmts: Sequence[cst.CSTNode]) -> None:
        for s in stmts:
            self.statement(s)

    def statement(self, s: cst.CSTNode) -> None:
        if isinstance(s, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            self.simple(s)
        elif isinstance(s, cst.For):
            self.for_(s)
        elif isinstance(s, cst.While):
            self.while_(s)
        elif isinstance(s, cst.If):
            self.if_(s)
        elif isinstance(s, cst.With):
            self.with_(s)
        elif isinstance(s, cst.Try | cst.TryStar):
            self.try_(s)
        elif isinstance(s, cst.FunctionDef | cst.ClassDef):
            self.definition(s)
        elif isinstance(s, cst.Match):
            self.match(s)
        else:
            raise NoEstimate(
                f"unsupported statement {type(s).__name__} at line {self.prog.line(s)}"
            )

    def suite(self, suite: cst.BaseSuite) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self.statements(suite.body)
        else:
            self.statements([suite])

    def orelse(self, orelse: cst.Else | cst.Finally | None) -> None:
        if orelse is not None:
            self.suite(orelse.body)

    def simple(self, s: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> None:
        for small in s.body:
            self.small(small, self.prog.line(s))

    def for_(self, s: cst.For) -> None:
        aliases.for_target(self, s.target, s.iter)
        self.expr_effects(s.iter, self.prog.line(s))
        self.suite(s.body)
        self.orelse(s.orelse)

    def while_(self, s: cst.While) -> None:
        self.expr_effects(s.test, self.prog.line(s))
        self.suite(s.body)
        self.orelse(s.orelse)

    def if_(self, s: cst.If) -> None:
        self.expr_effects(s.test, self.prog.line(s))
        self.suite(s.body)
        if isinstance(s.orelse, cst.If):
            self.if_(s.orelse)
        else:
            self.orelse(s.orelse)

    def with_(self, s: cst.With) -> None:
        for item in s.items:
            self.expr_effects(item.item, self.prog.line(s))
            if item.asname is not None:
                self.rebind(names_of(item.asname.name), self.prog.line(s))
        self.suite(s.body)

    def try_(self, s: cst.Try | cst.TryStar) -> None:
        self.suite(s.body)
        for h in s.handlers:
            if h.name is not None:
                self.bind(names_of(h.name.name))
            self.suite(h.body)
        self.orelse(s.orelse)
        self.orelse(s.finalbody)

    def definition(self, s: cst.FunctionDef | cst.ClassDef) -> None:
        self.rebind([s.name.value], self.prog.line(s))
        kind = "class" if isinstance(s, cst.ClassDef) else "function"
        self.defined[s.name.value] = (self.prog.line(s), kind)

    def match(self, s: cst.Match) -> None:
        self.expr_effects(s.subject, self.prog.line(s))
        for case in s.cases:
            self.rebind(pattern_captures(case.pattern), self.prog.line(case))
            self.suite(case.body)

    def small(self, s: cst.BaseSmallStatement, line: int) -> None:
        escapes.refuse_escapes(self, s, line)
        if isinstance(s, cst.Assign):
            targets = [t for tgt in s.targets for t in target_exprs(tgt.target)]
            self.assign(targets, s.value, line)
        elif isinstance(s, cst.AnnAssign):
            if s.value is not None:
                self.assign(list(target_exprs(s.target)), s.value, line)
        elif isinstance(s, cst.AugAssign):
            self.assign(list(target_exprs(s.target)), s.value, line, augmented=True)
        elif isinstance(s, cst.Expr):
            if isinstance(s.value, cst.Call):
                self.call(s.value, line, assigned=False)
            else:
                self.expr_effects(s.value, line)
        elif isinstance(s, cst.Del):
            self.delete(s, line)
        elif isinstance(s, cst.Import | cst.ImportFrom):
            self.rebind(_imported_names(s), line)
        # pass, break, continue, raise, assert: no state change. `global`/`nonlocal` neither: the
        # index applies them to the whole function (as Python does), and `is_global` reads that.

    def delete(self, s: cst.Del, line: int) -> None:
        for t in target_exprs(s.target):
            if isinstance(t, cst.Name):
                if t.value not in self.fx.bound:
                    raise NoEstimate(
                        f"line {line}: `del {t.value}` unbinds a name the loop does not own"
                    )
            else:
                obj = object_expr(t, self.module)
                if obj is None:
                    raise NoEstimate(f"line {line}: `del` of an unnamed object")
                self.add_target_object(obj, line, 4)

    def assign(
        self,
        targets: list[cst.BaseExpression],
        value: cst.BaseExpression,
        line: int,
        augmented: bool = False,
    ) -> None:
        rebinding.refuse_rebinding(self, targets, line)
        rule = 3
        if isinstance(value, cst.Call):
            rule = self.call(value, line, assigned=True)
        else:
            self.expr_effects(value, line)
        for t in targets:
            assignment.assign_target(self, t, value, line, rule, augmented)

    # -- calls and expressions ---------------------------------------------------------------
    def call(self, call: cst.Call, line: int, assigned: bool) -> int:
        """Apply rules 1/2/4/5 to a call; return the rule that fired (for assignment)."""
        for a in call.args:
            self.expr_effects(a.value, line)
            callbacks.passed_function(self, a.value, line)
            library_knowledge.keyword_mutation(self, a, line)
        resolved = self.prog.resolve_call(call, self.scope)
        if resolved is not None:
            callees.map_callee(self, call, resolved[0], resolved[1], line)
        func = call.func
        if isinstance(func, cst.Attribute):
            return method_call.method_call(self, call, func, resolved is not None, line, assigned)
        if isinstance(func, cst.Name):
            if resolved is not None:
                return 2
            return function_call.function_call(self, call, func, line, assigned)
        self.expr_effects(func, line)
        return function_call.unnamed_call(self, func, line, assigned)

    def expr_effects(self, node: cst.CSTNode, line: int) -> None:
        """Effects hidden inside expressions: walrus bindings, and every call nested in them.

        A nested call is judged like the value of an assignment (rules 1/2): ``x = X[j] +
        rng.normal()`` and ``if rng.random() < p:`` advance ``rng`` exactly as ``rng.normal()``
        on its own line would. Only a bare statement call can be rule 5."""
        if isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            return
        if isinstance(node, cst.Call):
            self.call(node, line, assigned=True)
            return
        if isinstance(node, cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp):
            self._comprehension(node, line)
            return
        if isinstance(node, cst.NamedExpr):
            self.bind(names_of(node.target))
            if isinstance(node.target, cst.Name):
                self.add(node.target.value, Restore.REBOUND, 3, line)
        for child in node.children:
            self.expr_effects(child, line)

    def _comprehension(
        self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp, line: int
    ) -> None:
        """A comprehension's clauses in order, its variables viewing what they iterate while its
        element is walked (``aliases.comprehension_target``), then the views as they were: its
        variables are its own, and a name outside it keeps its meaning."""
        views, takes = dict(self.fx.aliases), dict(self.fx.takes)
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            self.expr_effects(clause.iter, line)
            aliases.comprehension_target(self, clause.target, clause.iter)
            for cond in clause.ifs:
                self.expr_effects(cond.test, line)
            clause = clause.inner_for_in
        for part in (node.key, node.value) if isinstance(node, cst.DictComp) else (node.elt,):
            self.expr_effects(part, line)
        self.fx.aliases.clear()
        self.fx.aliases.update(views)
        self.fx.takes.clear()
        self.fx.takes.update(takes)


def _imported_names(s: cst.Import | cst.ImportFrom) -> list[str]:
    names: list[str] = []
    if isinstance(s, cst.Import):
        for a in s.names:
            names += list(names_of(a.asname.name)) if a.asname else [top(a.name)]
    elif not isinstance(s.names, cst.ImportStar):
        for a in s.names:
            names += list(names_of(a.asname.name if a.asname else a.name))
    return names
