"""The changeset of a loop: Flor's Table 2 rules, the loop-scoped filter, and interprocedural
mapping of callee effects onto caller arguments.

Table 2, highest precedence first; at most one rule fires per statement:

====  ==========================================  =====================================
rule  statement                                   change
====  ==========================================  =====================================
0     ``v = ...`` where ``v`` is already mutated  no estimate (which object to restore
      in place by this loop                       into is ambiguous)
1     ``v1, .., vn = obj.method(...)``            ``{obj, v1, .., vn}``
2     ``v1, .., vn = func(...)``                  ``{v1, .., vn}``
3     ``v1, .., vn = u1, .., um``                 ``{v1, .., vn}``
4     ``obj.method(...)``                         ``{obj}``
5     ``func(...)``                               no estimate
====  ==========================================  =====================================

Rule 0 fires when a name or attribute is rebound after it (or something reached through it,
``model.fc``) was mutated in place earlier in the walk, unless the loop itself bound it; rebinding
an accumulator twice (``total += a; total += b``) is harmless and allowed. Calls to module-local
functions and methods are not rule 5 (nor rule 1/4 on their receiver): their bodies are analysed
and their effects on parameters mapped to the caller's arguments, on module globals kept as
globals, and on variables of enclosing functions (closures, ``nonlocal``) kept under their name. Known library behaviour (``flortrain.static.library``) refines rules
1, 4 and 5. Mutations through a loop-scoped alias (``for p in model.parameters(): p.data.add_(..)``)
are charged to the object the alias came from (``model``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from flortrain.static import library, sinks
from flortrain.static.expressions import (
    VIEW_ATTRS,
    dotted,
    is_view,
    names_of,
    object_expr,
    pattern_captures,
    root,
    target_exprs,
    top,
    walk_no_defs,
)
from flortrain.static.hooks import hooks_of
from flortrain.static.interprocedural import map_callee
from flortrain.static.plan import Change, Restore
from flortrain.static.program import MODULE, Loop, Program, Scope

RULE_CALLEE = 7


#: why a generator's loop is refused: it is a data source, resumed by whoever iterates it
YIELDS = "`yield` inside the loop suspends it midway"


class NoEstimate(Exception):
    """A statement for which no safe changeset exists: the loop is refused."""


@dataclass
class Effects:
    """What a stretch of code changes, in the terms of its own scope."""

    changes: dict[str, Change] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    aliases: dict[str, str] = field(default_factory=dict)  # loop-scoped name -> object it views
    # loop variable -> the objects it takes in turn (`for m in (meter_a, meter_b):`)
    takes: dict[str, list[str]] = field(default_factory=dict)
    reaches: set[str] = field(default_factory=set)
    #: channels written to (``log``, ``self.writer``) -> their kind: outputs, not changes
    outputs: dict[str, str] = field(default_factory=dict)
    #: iterators advanced (``next(it)``, ``it.__next__()``) -> the line that first does it
    advanced: dict[str, int] = field(default_factory=dict)


class _Walker:
    """Walks statements applying the rules; raises :class:`NoEstimate` to refuse."""

    def __init__(
        self, prog: Program, scope: Scope, callee_stack: frozenset[str], in_loop: bool = True
    ) -> None:
        self.in_loop = in_loop  # `return` ends a callee normally, but escapes a skipped loop
        self.prog = prog
        self.scope = scope
        self.fx = Effects()
        self.callee_stack = callee_stack
        self.module = prog.source.module
        self.defined: dict[str, tuple[int, str]] = {}  # names bound by `def`/`class`: line, kind

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
            expr = self._through_alias(root(expr))
            restore = Restore.IN_PLACE
        old = self.fx.changes.get(expr)
        if old is None:
            self.fx.changes[expr] = Change(expr, restore, rule, line, is_global)
        elif restore is Restore.REBOUND and old.restore is Restore.IN_PLACE:
            # A name both mutated and (later) rebound is restored by rebinding: its final object
            # carries every in-place change made to it.
            self.fx.changes[expr] = Change(expr, restore, rule, line, is_global)

    def _mutated_in_place(self, expr: str) -> Change | None:
        """An in-place change to ``expr`` or to something reached through it (``model.fc``)."""
        for ch in self.fx.changes.values():
            if ch.restore is Restore.IN_PLACE and (
                ch.expr == expr or ch.expr.startswith(expr + ".")
            ):
                return ch
        return None

    def _through_alias(self, expr: str) -> str:
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

    # -- statements --------------------------------------------------------------------------
    def statements(self, stmts: Sequence[cst.CSTNode]) -> None:
        for s in stmts:
            self.statement(s)

    def statement(self, s: cst.CSTNode) -> None:
        if isinstance(s, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            for small in s.body:
                self.small(small, self.prog.line(s))
        elif isinstance(s, cst.For):
            self.for_target(s.target, s.iter)
            self.expr_effects(s.iter, self.prog.line(s))
            self.suite(s.body)
            if s.orelse is not None:
                self.suite(s.orelse.body)
        elif isinstance(s, cst.While):
            self.expr_effects(s.test, self.prog.line(s))
            self.suite(s.body)
            if s.orelse is not None:
                self.suite(s.orelse.body)
        elif isinstance(s, cst.If):
            self.expr_effects(s.test, self.prog.line(s))
            self.suite(s.body)
            if isinstance(s.orelse, cst.If):
                self.statement(s.orelse)
            elif s.orelse is not None:
                self.suite(s.orelse.body)
        elif isinstance(s, cst.With):
            for item in s.items:
                self.expr_effects(item.item, self.prog.line(s))
                if item.asname is not None:
                    self.rebind(names_of(item.asname.name), self.prog.line(s))
            self.suite(s.body)
        elif isinstance(s, cst.Try | cst.TryStar):
            self.suite(s.body)
            for h in s.handlers:
                if h.name is not None:
                    self.bind(names_of(h.name.name))
                self.suite(h.body)
            if s.orelse is not None:
                self.suite(s.orelse.body)
            if s.finalbody is not None:
                self.suite(s.finalbody.body)
        elif isinstance(s, cst.FunctionDef | cst.ClassDef):
            self.rebind([s.name.value], self.prog.line(s))
            self.defined[s.name.value] = (
                self.prog.line(s),
                "class" if isinstance(s, cst.ClassDef) else "function",
            )
        elif isinstance(s, cst.Match):
            self.expr_effects(s.subject, self.prog.line(s))
            for case in s.cases:
                self.rebind(pattern_captures(case.pattern), self.prog.line(case))
                self.suite(case.body)
        else:
            raise NoEstimate(
                f"unsupported statement {type(s).__name__} at line {self.prog.line(s)}"
            )

    def suite(self, suite: cst.BaseSuite) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self.statements(suite.body)
        else:
            self.statements([suite])

    def for_target(self, target: cst.BaseExpression, it: cst.BaseExpression) -> None:
        names = list(names_of(target))
        self.bind(names)
        for n in names:  # the loop variable keeps its last value after the loop (rule 3)
            self.add(n, Restore.REBOUND, 3, self.prog.line(target), is_global=self.is_global(n))
        for n, src in self._alias_pairs(target, it):
            self.fx.aliases[n] = src
        if isinstance(target, cst.Name) and isinstance(it, cst.Tuple | cst.List | cst.Set):
            objs = [
                self._through_alias(obj)
                for el in it.elements
                if not isinstance(el, cst.StarredElement)
                and (obj := object_expr(el.value, self.module)) is not None
                and root(obj) not in self.prog.imported
            ]
            if objs:
                self.fx.takes[target.value] = objs

    def _alias_pairs(
        self, target: cst.BaseExpression, it: cst.BaseExpression
    ) -> Iterator[tuple[str, str]]:
        """Which loop-scoped names view which outer objects (``for p in model.parameters()``:
        ``p`` views ``model``). ``zip``/``enumerate`` are destructured element by element, so in
        ``for p, e in zip(model.parameters(), ema.parameters())`` a change through ``e`` is charged
        to ``ema``, not to the first argument."""
        if (
            isinstance(it, cst.Call)
            and isinstance(it.func, cst.Name)
            and it.func.value in {"zip", "enumerate"}
            and not self.scope_shadows(it.func.value)
            and isinstance(target, cst.Tuple | cst.List)
            and not any(isinstance(el, cst.StarredElement) for el in target.elements)
        ):
            args = [a.value for a in it.args if a.keyword is None and not a.star]
            elements = [el.value for el in target.elements]
            if it.func.value == "zip" and len(args) == len(elements) == len(it.args):
                for el, arg in zip(elements, args, strict=True):
                    yield from self._alias_pairs(el, arg)
                return
            if it.func.value == "enumerate" and len(elements) == 2 and args:
                yield from self._alias_pairs(elements[1], args[0])  # the index views nothing
                return
        src = self._alias_source(it)
        if src is not None:
            for n in names_of(target):
                yield n, src

    def _alias_source(self, value: cst.BaseExpression) -> str | None:
        """The outer object a loop-scoped name views: ``model.parameters()`` -> ``model``."""
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
            # zip(a.parameters(), ...), enumerate(x), list(model.parameters())
            for a in value.args:
                src = self._alias_source(a.value)
                if src is not None:
                    return src
            return None
        if isinstance(value, cst.Name | cst.Attribute | cst.Subscript) or (
            isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
        ):
            expr = object_expr(value, self.module)
            if expr is not None and root(expr) not in self.prog.imported:
                return self._through_alias(expr)
        return None

    def small(self, s: cst.BaseSmallStatement, line: int) -> None:
        self.check_escapes(s, line)
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
                    self.add_target_object(obj, t, line, 4)
        elif isinstance(s, cst.Import | cst.ImportFrom):
            names: list[str] = []
            if isinstance(s, cst.Import):
                for a in s.names:
                    names += list(names_of(a.asname.name)) if a.asname else [top(a.name)]
            elif not isinstance(s.names, cst.ImportStar):
                for a in s.names:
                    names += list(names_of(a.asname.name if a.asname else a.name))
            self.rebind(names, line)
        # pass, break, continue, raise, assert: no state change. `global`/`nonlocal` neither: the
        # index applies them to the whole function (as Python does), and `is_global` reads that.

    def check_escapes(self, s: cst.CSTNode, line: int) -> None:
        if not self.in_loop:
            return
        for n in walk_no_defs(s):
            if isinstance(n, cst.Return):
                raise NoEstimate(
                    f"line {line}: `return` inside the loop leaves it without finishing"
                )
            if isinstance(n, cst.Yield):
                raise NoEstimate(f"line {line}: {YIELDS}")
            if isinstance(n, cst.Await):
                raise NoEstimate(f"line {line}: `await` inside the loop")

    def assign(
        self,
        targets: list[cst.BaseExpression],
        value: cst.BaseExpression,
        line: int,
        augmented: bool = False,
    ) -> None:
        for t in targets:
            # Rule 0: rebinding what the loop already mutated in place leaves the old object (which
            # others may still reference) changed, and restoring only the new binding misses it.
            # An object the loop itself created (its root bound in the loop) is exempt.
            expr: str | None = None
            own: str | None = None  # the name whose binding decides the exemption
            if isinstance(t, cst.Name):
                expr, own = self._through_alias(t.value), t.value
            elif isinstance(t, cst.Attribute) and t.attr.value not in VIEW_ATTRS:
                expr = object_expr(t, self.module)
                own = None if expr is None else root(expr)
                if own in self.fx.aliases:
                    expr = None  # a view's attribute: charged to the viewed object in place anyway
            if expr is not None and own not in self.fx.bound:
                old = self._mutated_in_place(expr)
                at = None if old is None else self.fx.advanced.get(old.expr)
                if old is not None and at is not None:
                    # the recycling idiom (`next(it)`, a fresh `iter(loader)` once it runs out):
                    # what stops the loop is the iterator it carries, not the rebinding
                    raise NoEstimate(
                        f"line {at}: the loop advances `{old.expr}`, an iterator made before it,"
                        f" whose position no checkpoint holds (line {line} replaces it)"
                    )
                if old is not None:
                    raise NoEstimate(
                        f"line {line}: rule 0: `{self.prog.code(t)}` is rebound after the loop mutated"
                        f" `{old.expr}` in place"
                    )
        rule = 3
        if isinstance(value, cst.Call):
            rule = self.call(value, line, assigned=True)
        else:
            self.expr_effects(value, line)
        for t in targets:
            self.assign_target(t, value, line, rule, augmented)

    def assign_target(
        self,
        t: cst.BaseExpression,
        value: cst.BaseExpression,
        line: int,
        rule: int,
        augmented: bool,
    ) -> None:
        if isinstance(t, cst.Name):
            name = t.value
            if not augmented and len(names_of(t)) == 1:
                self.fx.takes.pop(name, None)
                src = self._alias_source(value) if is_view(value) else None
                if src is not None:
                    self.fx.aliases[name] = src
                else:
                    self.fx.aliases.pop(name, None)
            was_bound = name in self.fx.bound
            self.bind([name])
            if augmented and was_bound and name in self.fx.aliases:
                return  # `w += 1` on a view of an outer object: charged to that object already
            self.add(name, Restore.REBOUND, rule, line, is_global=self.is_global(name))
        elif isinstance(t, cst.Attribute):
            expr = object_expr(t, self.module)
            if expr is None:
                raise NoEstimate(f"line {line}: assignment to an attribute of an unnamed object")
            if t.attr.value in VIEW_ATTRS:
                self.add_target_object(expr, t, line, rule)
            else:
                self.add(expr, Restore.REBOUND, rule, line)
        elif isinstance(t, cst.Subscript):
            obj = object_expr(t.value, self.module)
            if obj is None:
                raise NoEstimate(f"line {line}: item assignment into an unnamed object")
            self.add_target_object(obj, t, line, rule)
        else:
            raise NoEstimate(f"line {line}: unsupported assignment target")

    def add_target_object(self, obj: str, node: cst.CSTNode, line: int, rule: int) -> None:
        if root(obj) in self.prog.imported:
            raise NoEstimate(f"line {line}: the loop mutates module `{root(obj)}`")
        self.add(obj, Restore.IN_PLACE, rule, line)

    # -- calls --------------------------------------------------------------------------------
    def call(self, call: cst.Call, line: int, assigned: bool) -> int:
        """Apply rules 1/2/4/5 to a call; return the rule that fired (for assignment)."""
        for a in call.args:
            self.expr_effects(a.value, line)
            self.passed_function(a.value, line)
            if (
                a.keyword is not None
                and a.keyword.value in library.MUTATED_KEYWORDS
                and isinstance(a.value, cst.Name | cst.Attribute | cst.Subscript)
            ):
                # `torch.randn(.., generator=g)` advances g; `torch.add(a, b, out=c)` writes c.
                # A library's own object (`torch.default_generator`) is global RNG state, which
                # every checkpoint captures anyway.
                obj = object_expr(a.value, self.module)
                if obj is not None and root(obj) not in self.prog.imported:
                    self.add(obj, Restore.IN_PLACE, 4, line)
        resolved = self.prog.resolve_call(call, self.scope)
        if resolved is not None:
            self.callee(call, resolved[0], resolved[1], line)
        func = call.func
        if isinstance(func, cst.Attribute):
            self.expr_effects(func.value, line)
            if resolved is not None:
                # a method of a local class: its body was analysed above and its effects on
                # `self` mapped onto the receiver, so rule 1/4 would only add the whole receiver
                return 2
            kind = sinks.output_call(self.prog, self.scope, func)
            if kind is not None:
                # `log.info(..)`, `f.write(..)`, `writer.add_scalar(..)` on a channel: output, as
                # `print` is, not a change of state (``static/sinks``)
                channel = object_expr(func.value, self.module)
                if channel is not None:
                    self.fx.outputs.setdefault(channel, kind)
                return 2
            owner = self.prog.type_of(func.value, self.scope)
            if owner is not None and self.prog.method(owner, func.attr.value) is None:
                # `self.model(x)`: a callable held in an attribute, not a method of the local
                # class; only that attribute's object can change, not the whole receiver
                target = object_expr(func, self.module)
                if assigned or target is None:
                    return 2
                self.add_target_object(target, func, line, 4)
                return 4
            obj = object_expr(func.value, self.module)
            name = dotted(func)
            if obj is not None and root(obj) in self.prog.imported:
                self.library_call(name or func.attr.value, call, line)
                return 2
            if func.attr.value == "__next__" and obj is not None:
                self.fx.advanced.setdefault(self._through_alias(obj), line)
            if func.attr.value in library.MUTATING_LIBRARY:
                # `rng.shuffle(idx)` on a local Generator/Random changes idx as well as rng
                self.mutated_arg(call, library.MUTATING_LIBRARY[func.attr.value], line)
            if func.attr.value in library.PURE_METHODS:
                return 2
            if obj is None:
                return 2 if assigned else 4  # a method of a temporary: nothing named changes
            self.add_target_object(obj, func, line, 1 if assigned else 4)
            return 1 if assigned else 4
        if isinstance(func, cst.Name):
            name = func.value
            if resolved is not None:
                return 2
            if name in library.MUTATING_BUILTINS and not self.scope_shadows(name):
                self.mutated_arg(call, library.MUTATING_BUILTINS[name], line)
                if name == "next" and call.args and call.args[0].keyword is None:
                    it = object_expr(call.args[0].value, self.module)
                    if it is not None:
                        self.fx.advanced.setdefault(self._through_alias(it), line)
                return 2
            if name in self.prog.imported:
                self.library_call(name, call, line)
                return 2
            if assigned or (name in library.PURE_BUILTINS and not self.scope_shadows(name)):
                return 2
            raise NoEstimate(f"line {line}: rule 5: call to `{name}()` has no side-effect estimate")
        self.expr_effects(func, line)
        if not assigned:
            raise NoEstimate(
                f"line {line}: rule 5: call to `{self.prog.code(func)}` has no side-effect estimate"
            )
        return 2

    def passed_function(self, value: cst.BaseExpression, line: int) -> None:
        """A local function or a lambda handed to a call may be called by it: ``opt.step(closure)``
        runs ``closure`` (LBFGS), ``model.apply(init)`` runs ``init``. Its effects on what this
        scope can name count here, as if it were called with no arguments we can see."""
        if isinstance(value, cst.Lambda):
            for ch in self.lambda_changes(value, line):
                self.add(ch.expr, ch.restore, RULE_CALLEE, line, ch.is_global)
        elif isinstance(value, cst.Name):
            call = cst.Call(func=value)
            resolved = self.prog.resolve_call(call, self.scope)
            if resolved is not None:
                self.callee(call, resolved[0], None, line)

    def lambda_changes(self, lam: cst.Lambda, line: int) -> list[Change]:
        """What a lambda's body changes, except through its own parameters (those are whatever
        the caller passes: a hook's module and outputs, a callback's arguments)."""
        sub = _Walker(self.prog, self.scope, self.callee_stack, in_loop=False)
        sub.expr_effects(lam.body, line)
        self.fx.reaches.update(sub.fx.reaches)
        p = lam.params
        star = [p.star_arg] if isinstance(p.star_arg, cst.Param) else []
        params = {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params, *star)}
        if p.star_kwarg is not None:
            params.add(p.star_kwarg.name.value)
        return [ch for ch in sub.fx.changes.values() if ch.is_global or root(ch.expr) not in params]

    def scope_shadows(self, name: str) -> bool:
        return name in self.scope.bound or name in self.prog.scopes[MODULE].bound

    def library_call(self, name: str, call: cst.Call, line: int) -> None:
        if name.rsplit(".", 1)[-1] in library.RNG_SEEDERS:
            return
        idx = library.mutating_library_arg(name)
        if idx is not None:
            self.mutated_arg(call, idx, line)

    def mutated_arg(self, call: cst.Call, idx: int, line: int) -> None:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if idx < len(positional):
            obj = object_expr(positional[idx].value, self.module)
            if obj is not None:
                self.add_target_object(obj, call, line, 4)

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
        if isinstance(node, cst.NamedExpr):
            self.bind(names_of(node.target))
            if isinstance(node.target, cst.Name):
                self.add(node.target.value, Restore.REBOUND, 3, line)
        for child in node.children:
            self.expr_effects(child, line)

    def callee(
        self, call: cst.Call, qual: str, receiver: cst.BaseExpression | None, line: int
    ) -> None:
        """Map a local callee's effects onto this scope (``interprocedural.map_callee``)."""
        map_callee(self, call, qual, receiver, line)


def function_effects(prog: Program, scope: Scope, stack: frozenset[str]) -> Effects:
    w = _Walker(prog, scope, stack, in_loop=False)
    w.statements(list(scope.body))
    return w.fx


@dataclass(frozen=True)
class LoopChangeset:
    changes: tuple[Change, ...]
    bound: tuple[str, ...]
    reaches: tuple[str, ...]
    outputs: tuple[tuple[str, str], ...] = ()  # the channels it writes to, and their kinds
    #: names the loop binds that stay because a path from its exit reads them: (name, line of
    #: such a read; 0 for a project module's importers)
    read_after: tuple[tuple[str, int], ...] = ()


def loop_changeset(prog: Program, loop: Loop) -> LoopChangeset:
    """The filtered changeset of a candidate loop; raises :class:`NoEstimate` to refuse it."""
    scope = prog.loop_scope[loop]
    if loop.orelse is not None:
        raise NoEstimate("a loop with an `else:` clause cannot be skipped as one block")
    if isinstance(loop, cst.For) and loop.asynchronous is not None:
        raise NoEstimate("`async for` loops are not memoized")
    if loop in prog.class_body_loops:
        raise NoEstimate("loops in a class body are not memoized")
    w = _Walker(prog, scope, frozenset({scope.qualname}))
    w.statement(loop)
    if next(prog.calls_in([loop]), None) is not None:
        _add_hook_effects(w)
    fx = w.fx
    rng = prog.range(loop)
    start, end = rng.start.line, rng.end.line
    live = prog.liveness.after(loop)
    if live is None:  # the scope reads its names behind the analysis' back: all of them, by lines
        live = _names_used_outside(prog, scope, start, end)
    kept: list[Change] = []
    read_after: dict[str, int] = {}
    for ch in fx.changes.values():
        r = root(ch.expr)
        if r in fx.bound and r not in live and not ch.is_global and r not in scope.declared_global:
            continue  # loop-scoped: no path from the loop's exit reads it before rebinding it
        if r in fx.bound and r in live:
            read_after.setdefault(r, live[r])
        if r in prog.imported and not ch.is_global:
            continue
        if ch.expr in w.defined:
            # pickled by reference, a function would come back as whatever the name holds when
            # the checkpoint is read; its code, defaults and closure cannot be stored faithfully
            line, kind = w.defined[ch.expr]
            raise NoEstimate(
                f"line {line}: {kind} `{ch.expr}` is defined inside the loop and used after it;"
                " a skipped loop cannot restore it"
            )
        kept.append(ch)
    outputs = tuple((expr, kind) for expr, kind in fx.outputs.items() if root(expr) not in fx.bound)
    return LoopChangeset(
        tuple(kept),
        tuple(sorted(fx.bound)),
        tuple(sorted(fx.reaches)),
        outputs,
        tuple(sorted(read_after.items())),
    )


def _add_hook_effects(w: _Walker) -> None:
    """What registered hooks change (``hooks``) joins the changeset of a loop that makes calls:
    any call may run a module's forward or backward hooks."""
    summary = hooks_of(w.prog)
    w.fx.reaches.update(summary.reaches)
    if summary.refusal is not None:
        raise NoEstimate(summary.refusal)
    module = w.prog.scopes[MODULE]
    for e in summary.effects:
        r = root(e.expr)
        owner = w.prog.scopes[e.owner]
        if w.prog.binding_scope(w.scope, r) is not owner:
            raise NoEstimate(
                f"hook `{e.hook}` registered at line {e.line} changes `{e.expr}`, which is not visible here"
            )
        rebinds = e.restore is Restore.REBOUND and e.expr == r
        if (
            rebinds
            and owner is not module
            and owner is not w.scope
            and r not in w.scope.declared_nonlocal
        ):
            raise NoEstimate(
                f"hook `{e.hook}` registered at line {e.line} rebinds `{r}` of `{owner.qualname}()`,"
                " which cannot be reassigned from here"
            )
        is_global = rebinds and owner is module and w.scope is not module
        w.add(e.expr, e.restore, RULE_CALLEE, e.line, is_global=is_global)


def _names_used_outside(prog: Program, scope: Scope, start: int, end: int) -> dict[str, int]:
    """Every name mentioned outside the loop's lines, or by another scope that sees it (the
    fallback where liveness cannot answer)."""
    used = {n: line for n, line in scope.names if not start <= line <= end}
    prefix = scope.qualname + "."
    for other in prog.scopes.values():
        if other is scope:
            continue
        if scope.qualname == MODULE or other.qualname.startswith(prefix):
            for n, line in other.names:
                if not other.is_local(n) or n in other.declared_global:
                    used.setdefault(n, line)
    return used


__all__ = [
    "Effects",
    "LoopChangeset",
    "NoEstimate",
    "function_effects",
    "loop_changeset",
    "object_expr",
]
