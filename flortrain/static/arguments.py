"""Argument binding at a call site: which caller expression each parameter of a module-local
callee is bound to. The changeset's callee mapping and ``flortrain check``'s seed tracing both
follow values across calls this way."""

from __future__ import annotations

import libcst as cst

from flortrain.static.program import Scope


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


def unmappable_params(call: cst.Call, scope: Scope) -> set[str]:
    """Parameters whose argument cannot be known statically (``f(*args)``)."""
    if any(a.star for a in call.args):
        return set(scope.params)
    return set()
