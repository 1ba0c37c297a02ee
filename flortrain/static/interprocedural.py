"""Interprocedural mapping: a call to a module-local function or method carries the callee's
effects into the caller's changeset (``train_one_epoch(model, loader, opt)`` inside a loop changes
``opt``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from flortrain.static.expressions import object_expr, root
from flortrain.static.plan import Restore
from flortrain.static.program import MODULE, Scope

if TYPE_CHECKING:
    from flortrain.static.changeset import _Walker


def bind_params(
    call: cst.Call, scope: Scope, receiver: cst.BaseExpression | None
) -> dict[str, cst.BaseExpression]:
    """Which caller expression each callee parameter is bound to at this call site."""
    params = list(scope.params)
    out: dict[str, cst.BaseExpression] = {}
    if receiver is not None and params:
        out[params[0]] = receiver
        params = params[1:]
    pos = [a for a in call.args if a.keyword is None]
    for p, a in zip(params, pos, strict=False):
        if a.star:
            break
        out[p] = a.value
    for a in call.args:
        if a.keyword is not None:
            out[a.keyword.value] = a.value
    return out


def unmappable_params(
    call: cst.Call, scope: Scope, receiver: cst.BaseExpression | None
) -> set[str]:
    """Parameters whose argument cannot be known statically (``f(*args)``)."""
    if any(a.star for a in call.args):
        return set(scope.params)
    return set()


def map_callee(
    w: _Walker, call: cst.Call, qual: str, receiver: cst.BaseExpression | None, line: int
) -> None:
    """Map a local callee's effects on its parameters and globals onto the caller's scope.

    Effects on parameters become effects on the caller's argument expressions (``self`` on the
    receiver); module globals stay globals unless a local hides them; variables of enclosing
    functions (closures, ``nonlocal``) keep their name when the caller sees that very variable.
    Rebinding a parameter is invisible to the caller."""
    from flortrain.static.changeset import RULE_CALLEE, NoEstimate, function_effects

    w.fx.reaches.add(qual)
    if qual in w.callee_stack:
        return  # recursion: its effects are already being collected
    scope = w.prog.scopes[qual]
    try:
        fx = function_effects(w.prog, scope, w.callee_stack | {qual})
    except NoEstimate as e:
        raise NoEstimate(f"line {line}: in `{qual}()`: {e}") from None
    w.fx.reaches.update(fx.reaches)
    binding = bind_params(call, scope, receiver)
    module = w.prog.scopes[MODULE]
    for expr, kind in fx.outputs.items():
        # the channels it writes to, in the caller's terms (for the replay plan to name)
        r = root(expr)
        if r in binding and (obj := object_expr(binding[r], w.module)) is not None:
            w.fx.outputs.setdefault(obj + expr[len(r) :], kind)
        elif r not in scope.params and w.prog.binding_scope(scope, r) is module:
            w.fx.outputs.setdefault(expr, kind)
    for ch in fx.changes.values():
        r = root(ch.expr)
        rest = ch.expr[len(r) :]
        owner = module if ch.is_global else w.prog.binding_scope(scope, r)
        if owner is not None and owner is not scope and owner is not module:
            # a variable of a function enclosing the callee (a closure, or `nonlocal`): the same
            # name here only if this scope sees that very variable
            if w.prog.binding_scope(w.scope, r) is not owner:
                raise NoEstimate(
                    f"line {line}: `{qual}()` changes `{ch.expr}` of `{owner.qualname}()`,"
                    " which is not visible here"
                )
            if (
                ch.restore is Restore.REBOUND
                and not rest
                and not (w.scope is owner or r in w.scope.declared_nonlocal)
            ):
                raise NoEstimate(
                    f"line {line}: `{qual}()` rebinds `{r}` of `{owner.qualname}()`, which cannot"
                    " be reassigned from here"
                )
            w.add(ch.expr, ch.restore, RULE_CALLEE, line)
            continue
        if owner is module and scope.qualname != MODULE:
            # a module-level object: the same name here, unless a local here hides it
            hider = w.prog.binding_scope(w.scope, r)
            if hider is not None and hider is not module:
                raise NoEstimate(
                    f"line {line}: `{qual}()` changes the global `{r}`, which a local `{r}` hides here"
                )
            if ch.restore is Restore.IN_PLACE or rest:
                w.add(ch.expr, ch.restore, RULE_CALLEE, line)
            else:
                is_global = w.scope.qualname != MODULE
                w.add(ch.expr, ch.restore, RULE_CALLEE, line, is_global=is_global)
            continue
        if r not in scope.params:
            continue  # the callee's own local
        if ch.restore is Restore.REBOUND and not rest:
            continue  # rebinding a parameter is invisible to the caller
        if r not in binding:
            if r in unmappable_params(call, scope, receiver):
                raise NoEstimate(f"line {line}: cannot map `{qual}()`'s arguments (*args/**kwargs)")
            continue  # a default value: not the caller's object
        arg = binding[r]
        obj = object_expr(arg, w.module)
        if obj is None:
            continue
        w.add(obj + rest, ch.restore if rest else Restore.IN_PLACE, RULE_CALLEE, line)
