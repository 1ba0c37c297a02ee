"""Hooks: code that runs inside a loop without being called by it.

``model.fc.register_forward_hook(save("fc"))`` makes every ``model(x)`` run ``save``'s inner
function, and ``loss.backward()`` run backward hooks; no call in the loop body names them, so the
rules that follow calls (``callees``) never see what they change. A hook that fills a
module-level dict (``acts[name] = out.mean()``) would then be missed, and a skipped loop would
leave the dict as it was before the loop.

This pass finds every ``register_*hook`` call, resolves the hook it is given (a local function,
a factory's nested function, a method of a local class, a lambda), and summarizes what those
hooks change that the loop's scope can name: module-level objects. Every candidate loop that
makes a call (any call may trigger a hook) gets that summary added to its changeset. A hook that
changes state no loop can name (a variable of its factory) makes those loops unmemoizable, with
the reason stated.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import libcst as cst

from flortrain.static.changeset.host import Walk, body_effects
from flortrain.static.changeset.rule import Case, ChangesetRule, P, R, Refused
from flortrain.static.changeset.rules.callbacks import lambda_changes
from flortrain.static.effects import RULE_CALLEE, NoEstimate
from flortrain.static.expressions import called_name, root
from flortrain.static.plan import Restore
from flortrain.static.program import MODULE, Program, Scope


class Hooks(ChangesetRule):
    name = "hooks"
    pattern = "a loop that makes a call, in a script that registers hooks (`register_*hook`)"
    change = "what the hooks change that the loop's scope can name"
    doc = (
        "`model(x)` runs forward hooks and `loss.backward()` backward hooks, though no call in"
        " the loop names them. Every candidate loop that makes a call gets the hooks' changes; a"
        " hook that changes state the loop cannot name (a variable of its factory, or of another"
        " function) refuses it."
    )
    cases = (
        Case(
            "factory-hook-fills-a-global-dict",
            """
            acts = {}

            def save(name):
                def hook(mod, inp, out):
                    acts[name] = out.mean().item()
                return hook

            model.fc.register_forward_hook(save("fc"))
            for epoch in range(3):
                for b in loader:
                    loss = model(b)
                print(acts)
        """,
            {("acts", P)},
        ),
        Case(
            "function-hook-rebinds-a-global",
            """
            peak = 0.0

            def track(mod, grad_in, grad_out):
                global peak
                peak = max(peak, grad_out[0].abs().max().item())

            model.register_full_backward_hook(track)
            for epoch in range(3):
                for b in loader:
                    model(b).sum().backward()
                print(peak)
        """,
            {("peak", R)},
        ),
        Case(
            "lambda-hook-keyword-argument",
            """
            def main():
                norms = []
                w.register_hook(hook=lambda g: norms.append(g.norm()))
                for epoch in range(3):
                    for b in loader:
                        (w * b).sum().backward()
                print(norms)
        """,
            {("norms", P)},
        ),
        Case(
            "method-hook-on-a-local-class",
            """
            class Stats:
                def __init__(self):
                    self.seen = 0

                def on_forward(self, mod, inp, out):
                    total.append(out)

            total = []
            stats = Stats()
            model.register_forward_hook(stats.on_forward)
            for epoch in range(3):
                for b in loader:
                    out = model(b)
        """,
            {("total", P)},
        ),
        Case(
            "hook-changing-only-its-parameters-and-locals-adds-nothing",
            """
            def scale(mod, inp, out):
                tmp = out * 2
                mod.calls = 1
                return tmp

            model.register_forward_hook(scale)
            for epoch in range(3):
                for b in loader:
                    out = model(b)
        """,
            set(),
        ),
        Case(
            "loop-without-calls-cannot-trigger-hooks",
            """
            acts = []
            model.register_forward_hook(lambda m, i, o: acts.append(o))
            xs = [1, 2, 3]
            for epoch in xs:
                for b in xs:
                    total = b
                print(total)
        """,
            {("total", R)},
        ),
        Case(
            "hook-changing-a-factory-variable-refuses",
            """
            def counter():
                seen = []
                def hook(mod, inp, out):
                    seen.append(out)
                return hook

            model.register_forward_hook(counter())
            for epoch in range(3):
                for b in loader:
                    out = model(b)
        """,
            Refused("changes `seen`, which is not visible here"),
        ),
        Case(
            "hook-changing-main-locals-refuses-a-loop-in-another-function",
            """
            def train(loader):
                for b in loader:
                    out = model(b)

            def main():
                acts = []
                model.register_forward_hook(lambda m, i, o: acts.append(o))
                for epoch in range(3):
                    train(loader)
                print(acts)
        """,
            Refused("changes `acts`, which is not visible here"),
        ),
    )


#: ``register_forward_hook``, ``register_full_backward_pre_hook``, a tensor's ``register_hook``,
#: an optimizer's ``register_step_post_hook``, ``register_module_forward_hook`` ...
_REGISTER = re.compile(r"^register_\w*hook$")


@dataclass(frozen=True)
class HookEffect:
    expr: str
    restore: Restore
    owner: str  # qualname of the scope whose variable ``expr`` starts from (MODULE for globals)
    line: int  # where the hook was registered
    hook: str  # the hook as written, for messages


@dataclass(frozen=True)
class HookSummary:
    effects: tuple[HookEffect, ...]
    reaches: tuple[str, ...]  # hook functions: a probe inside one needs the loops re-executed
    refusal: str | None  # why loops that may trigger the hooks cannot be memoized


def summarize(w: Walk) -> HookSummary:
    """What the program's registered hooks change (``w``: a walker of the same program, to walk
    the hooks' bodies with)."""
    prog = w.prog
    effects: dict[tuple[str, str], HookEffect] = {}
    reaches: set[str] = set()
    refusal: str | None = None
    for scope, call in _registrations(prog):
        line = prog.line(call)
        hook = _hook_arg(call)
        if hook is None:
            continue
        try:
            if isinstance(hook, cst.Lambda):
                found = _lambda_effects(w, scope, hook, line)
            else:
                quals = _hook_functions(prog, scope, hook)
                reaches.update(quals)
                found = [fx for q in quals for fx in _function_effects(w, q)]
        except NoEstimate as e:
            refusal = refusal or f"hook `{prog.code(hook)}` registered at line {line}: {e}"
            continue
        for expr, restore, owner in found:
            old = effects.get((owner, expr))
            if old is None or (restore is Restore.REBOUND and old.restore is Restore.IN_PLACE):
                effects[(owner, expr)] = HookEffect(expr, restore, owner, line, prog.code(hook))
    return HookSummary(tuple(effects.values()), tuple(sorted(reaches)), refusal)


def _registrations(prog: Program) -> list[tuple[Scope, cst.Call]]:
    out = []
    for scope in prog.scopes.values():
        for call in prog.calls_in(list(scope.body)):
            name = called_name(call) or ""
            if _REGISTER.match(name):
                out.append((scope, call))
    return out


def _hook_arg(call: cst.Call) -> cst.BaseExpression | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "hook":
            return a.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[0].value if positional else None


def _hook_functions(prog: Program, scope: Scope, hook: cst.BaseExpression) -> list[str]:
    """The local functions a hook expression stands for; none when it is not the script's own."""
    if isinstance(hook, cst.Name | cst.Attribute):
        # what calling it runs, as for a call written in that scope (a function, a method of a
        # local class, a class's __init__)
        resolved = prog.resolve_call(cst.Call(func=hook), scope)
        return [] if resolved is None else [resolved[0]]
    if isinstance(hook, cst.Call):
        # a factory (`save("fc1")`): the functions it defines are what it can return
        factory = prog.resolve_call(hook, scope)
        if factory is None:
            return []
        prefix = factory[0] + "."
        return [q for q in prog.scopes if q.startswith(prefix)]
    return []


Found = list[tuple[str, Restore, str]]


def _function_effects(w: Walk, qual: str) -> Found:
    scope = w.prog.scopes[qual]
    fx = body_effects(w, scope, frozenset({qual}))
    changes = [(ch.expr, ch.restore, ch.is_global) for ch in fx.changes.values()]
    return _owned(w.prog, scope, changes, set(scope.params), own_locals=True)


def _lambda_effects(w: Walk, scope: Scope, hook: cst.Lambda, line: int) -> Found:
    sub = w.walker(scope, frozenset({scope.qualname}))
    changes = [(ch.expr, ch.restore, ch.is_global) for ch in lambda_changes(sub, hook, line)]
    # a lambda's free names are the registering scope's variables: they count
    return _owned(w.prog, scope, changes, set(), own_locals=False)


def _owned(
    prog: Program,
    scope: Scope,
    changes: list[tuple[str, Restore, bool]],
    params: set[str],
    own_locals: bool,
) -> Found:
    """Each change with the scope whose variable it starts from. A hook's parameters are the
    module, its inputs and outputs (live modules are covered by the registry), and a function
    hook's own locals vanish when it returns."""
    module = prog.scopes[MODULE]
    out = []
    for expr, restore, is_global in changes:
        r = root(expr)
        if r in params and not is_global:
            continue
        owner = module if is_global else prog.binding_scope(scope, r)
        if owner is None or (own_locals and owner is scope):
            continue
        out.append((expr, restore, owner.qualname))
    return out


_cache: weakref.WeakKeyDictionary[Program, HookSummary] = weakref.WeakKeyDictionary()


def hooks_of(w: Walk) -> HookSummary:
    """:func:`summarize`, once per program (every candidate loop asks)."""
    summary = _cache.get(w.prog)
    if summary is None:
        summary = _cache[w.prog] = summarize(w)
    return summary


def add_hook_effects(w: Walk) -> None:
    """What registered hooks change (``hooks``) joins the changeset of a loop that makes calls:
    any call may run a module's forward or backward hooks."""
    summary = hooks_of(w)
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
