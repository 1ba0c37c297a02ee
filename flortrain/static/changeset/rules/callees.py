"""Callees: a call to a module-local function or method carries the callee's effects into the
caller's changeset (``train_one_epoch(model, loader, opt)`` inside a loop changes ``opt``)."""

from __future__ import annotations

import libcst as cst

from flortrain.static.arguments import bind_params, unmappable_params
from flortrain.static.changeset.host import Walk, body_effects
from flortrain.static.changeset.rule import Case, ChangesetRule, P, R, Refused
from flortrain.static.effects import RULE_CALLEE, Effects, NoEstimate
from flortrain.static.expressions import object_expr, root
from flortrain.static.plan import Change, Restore
from flortrain.static.program import MODULE, Scope, method_kind


class Callees(ChangesetRule):
    name = "callees"
    pattern = "a call to a module-local function, method or class"
    change = "the callee's changes, mapped onto the caller's arguments, globals and closures"
    doc = (
        "Calls to module-local functions and methods are not rule 5 (nor rule 1/4 on their"
        " receiver): their bodies are analysed and their effects on parameters mapped to the"
        " caller's arguments (`self` on the receiver, a classmethod's `cls` on its class, a"
        " staticmethod's parameters on the arguments), on module globals kept as globals unless a"
        " local hides them, and on variables of enclosing functions (closures, `nonlocal`) kept"
        " under their name when the caller sees that very variable. Rebinding a parameter is"
        " invisible to the caller; `f(*args)` cannot be mapped."
    )
    cases = (
        Case(
            "caller-loop-calls-local-step",
            """
            def step(model, opt, batch):
                loss = model(batch)
                loss.backward()
                opt.step()
                return loss

            for epoch in range(3):
                for b in loader:
                    step(net, optimizer, b)
        """,
            {("optimizer", P)},
        ),
        Case(
            "keyword-arguments-map-too",
            """
            def step(model, opt, batch):
                opt.step()

            for epoch in range(3):
                for b in loader:
                    step(net, batch=b, opt=optimizer)
        """,
            {("optimizer", P)},
        ),
        Case(
            "callee-attribute-of-parameter",
            """
            def bump(state):
                state.count += 1

            for epoch in range(3):
                for b in loader:
                    bump(trainer)
        """,
            {("trainer.count", R)},
        ),
        Case(
            "callee-rebinding-its-parameter-is-invisible",
            """
            def f(x):
                x = x + 1
                return x

            for epoch in range(3):
                for b in loader:
                    f(total)
        """,
            set(),
        ),
        Case(
            "star-args-cannot-be-mapped",
            """
            def step(model, opt):
                opt.step()

            for epoch in range(3):
                for b in loader:
                    step(*pair)
        """,
            Refused("cannot map `step()`'s arguments"),
        ),
        Case(
            "refusal-inside-callee-names-it",
            """
            def step(batch):
                mystery(batch)

            for epoch in range(3):
                for b in loader:
                    step(b)
        """,
            Refused("in `step()`: line 3: rule 5"),
        ),
        Case(
            "global-mutated-in-place-by-callee",
            """
            hist = []

            def log(v):
                hist.append(v)

            for epoch in range(3):
                for b in loader:
                    log(b)
        """,
            {("hist", P)},
        ),
        Case(
            "global-rebound-by-callee",
            """
            counter = 0

            def bump():
                global counter
                counter += 1

            for epoch in range(3):
                for b in loader:
                    bump()
            print(counter)
        """,
            {("counter", R)},
        ),
        Case(
            "global-hidden-by-a-local-refuses",
            """
            hist = []

            def log(v):
                hist.append(v)

            def main():
                hist = {}
                for epoch in range(3):
                    for b in loader:
                        log(b)
                print(hist)
        """,
            Refused("a local `hist` hides"),
        ),
        Case(
            "closure-mutated-in-place-by-nested-function",
            """
            def main():
                hist = []

                def log(v):
                    hist.append(v)

                for epoch in range(3):
                    for b in loader:
                        log(b)
                print(hist)
        """,
            {("hist", P)},
        ),
        Case(
            "nonlocal-rebound-by-nested-function",
            """
            def main():
                total = 0

                def bump():
                    nonlocal total
                    total += 1

                for epoch in range(3):
                    for b in loader:
                        bump()
                print(total)
        """,
            {("total", R)},
        ),
        Case(
            "nonlocal-rebound-from-a-sibling-refuses",
            """
            def main():
                total = 0

                def bump():
                    nonlocal total
                    total += 1

                def train():
                    for epoch in range(3):
                        for b in loader:
                            bump()

                train()
        """,
            Refused("rebinds `total` of `main()`"),
        ),
        Case(
            "method-receiver-maps-self",
            """
            class Trainer:
                def __init__(self):
                    self.optimizer = make()

                def train_step(self, b):
                    self.optimizer.step()

            trainer = Trainer()
            for epoch in range(3):
                for b in loader:
                    trainer.train_step(b)
        """,
            {("trainer.optimizer", P)},
        ),
        Case(
            "a-classmethod-binds-the-class-a-staticmethod-its-arguments",
            """
            class Pool:
                seen = []

                @classmethod
                def take(cls, b):
                    cls.seen.append(b)

                @staticmethod
                def put(acc, b):
                    acc.append(b)

                @classmethod
                def size(cls, b):
                    return len(b)

            pool = Pool()
            for epoch in range(3):
                for b in loader:
                    Pool.take(b)
                    pool.take(b)
                    pool.put(kept, b)
                    n = Pool.size(b)
            print(n)
        """,
            {("Pool.seen", P), ("kept", P), ("n", R)},
        ),
        Case(
            "a-classmethod-through-cls-binds-the-class-called-through",
            """
            class Base:
                count = 0

                @classmethod
                def bump(cls):
                    cls.count += 1

                @classmethod
                def go(cls):
                    cls.bump()

            class D(Base):
                pass

            for epoch in range(3):
                for b in loader:
                    D.go()
        """,
            {("D.count", R)},
        ),
        Case(
            "a-classmethod-through-an-instance-of-a-subclassed-class-is-refused",
            """
            class Base:
                count = 0

                @classmethod
                def bump(cls):
                    cls.count += 1

            class D(Base):
                pass

            for epoch in range(3):
                for b in loader:
                    item = D()
                    item.bump()
                    base = Base()
                    base.bump()
        """,
            Refused("which class that is depends on the instance"),
        ),
        Case(
            "a-class-name-bound-twice-or-an-unknown-decorator-is-not-resolved",
            """
            import builtins

            class Cfg:
                @staticmethod
                def step(acc, b):
                    acc.append(b)

                @builtins.classmethod
                def take(cls, b):
                    cls.seen = b

            class Other(Cfg):
                pass

            for epoch in range(3):
                for b in loader:
                    Cfg.take(b)
                    Alias.step(kept, b)
            Alias = Other
            Alias = Cfg
        """,
            {("Cfg", P), ("Alias", P)},
        ),
    )


def map_callee(
    w: Walk, call: cst.Call, qual: str, receiver: cst.BaseExpression | None, line: int
) -> None:
    """Map a local callee's effects on its parameters and globals onto the caller's scope."""
    w.fx.reaches.add(qual)
    if qual in w.callee_stack:
        return  # recursion: its effects are already being collected
    scope = w.prog.scopes[qual]
    try:
        fx = body_effects(w, scope, w.callee_stack | {qual})
    except NoEstimate as e:
        raise NoEstimate(f"line {line}: in `{qual}()`: {e}") from None
    w.fx.reaches.update(fx.reaches)
    _class_known(w, call, scope, fx, receiver, line)
    binding = bind_params(call, scope, receiver)
    _map_outputs(w, scope, fx, binding)
    for ch in fx.changes.values():
        r = root(ch.expr)
        owner = w.prog.scopes[MODULE] if ch.is_global else w.prog.binding_scope(scope, r)
        if owner is not None and owner is not scope and owner.qualname != MODULE:
            _map_enclosing(w, qual, owner, ch, line)
        elif owner is not None and owner.qualname == MODULE and scope.qualname != MODULE:
            _map_global(w, qual, ch, line)
        elif r in scope.params:
            _map_param(w, call, qual, scope, binding, ch, line)
        # else: the callee's own local


def _class_known(
    w: Walk,
    call: cst.Call,
    scope: Scope,
    fx: Effects,
    receiver: cst.BaseExpression | None,
    line: int,
) -> None:
    """A classmethod that changes its ``cls``, called through an instance of a class the script
    subclasses: the class it changes is the instance's, which the static pass cannot tell."""
    if receiver is None or method_kind(scope) != "classmethod" or not scope.params:
        return
    cls = scope.params[0]
    if not any(root(ch.expr) == cls for ch in fx.changes.values()):
        return
    if isinstance(receiver, cst.Name) and (
        (receiver.value in w.prog.classes and w.prog.bindings.bound_once(receiver.value))
        or (
            method_kind(w.scope) == "classmethod"
            and w.scope.params
            and receiver.value == w.scope.params[0]
        )
    ):
        return
    raise NoEstimate(
        f"line {line}: `{w.prog.code(call.func)}()` changes the class it is called through, and"
        " which class that is depends on the instance (the script subclasses it)"
    )


def _map_outputs(
    w: Walk, scope: Scope, fx: Effects, binding: dict[str, cst.BaseExpression]
) -> None:
    """The channels the callee writes to, in the caller's terms (for the replay plan to name)."""
    module = w.prog.scopes[MODULE]
    for expr, kind in fx.outputs.items():
        r = root(expr)
        if r in binding and (obj := object_expr(binding[r], w.module)) is not None:
            w.fx.outputs.setdefault(obj + expr[len(r) :], kind)
        elif r not in scope.params and w.prog.binding_scope(scope, r) is module:
            w.fx.outputs.setdefault(expr, kind)


def _map_enclosing(w: Walk, qual: str, owner: Scope, ch: Change, line: int) -> None:
    """A variable of a function enclosing the callee (a closure, or ``nonlocal``): the same name
    here only if this scope sees that very variable."""
    r = root(ch.expr)
    if w.prog.binding_scope(w.scope, r) is not owner:
        raise NoEstimate(
            f"line {line}: `{qual}()` changes `{ch.expr}` of `{owner.qualname}()`,"
            " which is not visible here"
        )
    if (
        ch.restore is Restore.REBOUND
        and ch.expr == r
        and not (w.scope is owner or r in w.scope.declared_nonlocal)
    ):
        raise NoEstimate(
            f"line {line}: `{qual}()` rebinds `{r}` of `{owner.qualname}()`, which cannot"
            " be reassigned from here"
        )
    w.add(ch.expr, ch.restore, RULE_CALLEE, line)


def _map_global(w: Walk, qual: str, ch: Change, line: int) -> None:
    """A module-level object: the same name here, unless a local here hides it."""
    r = root(ch.expr)
    hider = w.prog.binding_scope(w.scope, r)
    if hider is not None and hider.qualname != MODULE:
        raise NoEstimate(
            f"line {line}: `{qual}()` changes the global `{r}`, which a local `{r}` hides here"
        )
    if ch.restore is Restore.IN_PLACE or ch.expr != r:
        w.add(ch.expr, ch.restore, RULE_CALLEE, line)
    else:
        w.add(ch.expr, ch.restore, RULE_CALLEE, line, is_global=w.scope.qualname != MODULE)


def _map_param(
    w: Walk,
    call: cst.Call,
    qual: str,
    scope: Scope,
    binding: dict[str, cst.BaseExpression],
    ch: Change,
    line: int,
) -> None:
    """A change through a parameter is a change of the caller's argument; rebinding the
    parameter itself is invisible to the caller."""
    r = root(ch.expr)
    rest = ch.expr[len(r) :]
    if ch.restore is Restore.REBOUND and not rest:
        return
    if r not in binding:
        if r in unmappable_params(call, scope):
            raise NoEstimate(f"line {line}: cannot map `{qual}()`'s arguments (*args/**kwargs)")
        return  # a default value: not the caller's object
    obj = object_expr(binding[r], w.module)
    if obj is not None:
        w.add(obj + rest, ch.restore if rest else Restore.IN_PLACE, RULE_CALLEE, line)
