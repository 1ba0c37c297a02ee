"""Which names hold output channels: where a script writes, not training state.

``f = open("log.txt", "w")``, ``log = logging.getLogger(__name__)``, ``writer =
SummaryWriter()``, ``rows = csv.writer(..)``, ``pbar = tqdm(total=n)``, and ``self.writer =
SummaryWriter()`` in a method. A call of one of their output methods (``f.write``,
``log.info``, ``writer.add_scalar``, ``pbar.update``; ``library.SINK_METHODS``) is then an
output, as ``print`` is, and puts nothing in the changeset. A name counts only when every
binding of it in its scope is such a constructor; an attribute, when every assignment to
``self.<attr>`` in its class is (the index notes each binding's value: ``Scope.assigned``,
``ClassInfo.attr_assigned``). Anything else stays with the rules, and at run time an object of a
channel type is not captured however it was reached (``checkpoint/channels``).
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Callable

import libcst as cst

from flortrain.static import library
from flortrain.static.expressions import dotted
from flortrain.static.program import MODULE, Program, Scope

_KINDS: weakref.WeakKeyDictionary[Program, dict[tuple[str, str], str | None]] = (
    weakref.WeakKeyDictionary()
)


def output_call(prog: Program, scope: Scope, func: cst.Attribute) -> str | None:
    """The kind of channel ``func``'s receiver is, when calling ``func`` only writes to it
    (``log.info`` where ``log = logging.getLogger(..)``); None otherwise."""
    if not library.is_any_sink_method(func.attr.value):
        return None
    kind = channel_kind(prog, scope, func.value)
    return kind if kind is not None and library.is_sink_method(kind, func.attr.value) else None


def channel_kind(prog: Program, scope: Scope, expr: cst.BaseExpression) -> str | None:
    """The kind of channel ``expr`` (a name, or ``self.<attr>`` in a method) always holds."""
    if isinstance(expr, cst.Name):
        owner = prog.binding_scope(scope, expr.value)
        if owner is None:
            return None
        return _memo(
            prog,
            ("name:" + owner.qualname, expr.value),
            lambda: _all(prog, owner, owner.assigned.get(expr.value)),
        )
    attr = scope.self_attr(expr)
    if attr is not None and scope.cls is not None:
        return _class_attr(prog, scope.cls, attr, frozenset())
    return None


def _class_attr(prog: Program, cls: str, name: str, seen: frozenset[str]) -> str | None:
    info = prog.classes.get(cls)
    if info is None or cls in seen:
        return None
    if name in info.attr_assigned:
        sites = info.attr_assigned[name]
        return _memo(
            prog,
            ("attr:" + cls, name),
            lambda: _one(
                {_kind(prog, prog.scopes.get(q, prog.scopes[MODULE]), v) for q, v in sites}
            ),
        )
    for base in info.bases:
        kind = _class_attr(prog, base, name, seen | {cls})
        if kind is not None:
            return kind
    return None


def _memo(prog: Program, key: tuple[str, str], judge: Callable[[], str | None]) -> str | None:
    kinds = _KINDS.setdefault(prog, {})
    if key not in kinds:
        kinds[key] = judge()
    return kinds[key]


def _all(prog: Program, scope: Scope, values: list[cst.BaseExpression | None] | None) -> str | None:
    """The one kind of channel every binding makes, or None."""
    return _one({_kind(prog, scope, v) for v in values or []})


def _kind(prog: Program, scope: Scope, value: cst.BaseExpression | None) -> str | None:
    return None if value is None else constructs(prog, scope, value)


def _one(kinds: set[str | None]) -> str | None:
    return kinds.pop() if len(kinds) == 1 else None


def constructs(prog: Program, scope: Scope, value: cst.BaseExpression) -> str | None:
    """The kind of channel ``value`` makes (``open(p, "w")``, ``logging.getLogger(..)``)."""
    if not isinstance(value, cst.Call):
        return None
    name = dotted(value.func)
    if name is None:
        return None
    if name == "open":
        return "file" if prog.binding_scope(scope, "open") is None and _write_only(value) else None
    top, _, rest = name.partition(".")
    origin = prog.import_origin(top)
    owner = prog.binding_scope(scope, top)
    if origin is None or (
        owner is not None
        and (top in owner.params or any(v is not None for v in owner.assigned.get(top, [])))
    ):
        return None  # not imported, or also bound here by an assignment or as a parameter
    return library.SINK_CONSTRUCTORS.get(f"{origin}.{rest}" if rest else origin)


def _write_only(call: cst.Call) -> bool:
    """Whether ``open(..)`` opens for writing only: a literal mode with ``w``, ``a`` or ``x`` and
    neither ``r`` nor ``+``. The default mode reads."""
    mode: cst.BaseExpression | None = None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if len(positional) >= 2:
        mode = positional[1].value
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "mode":
            mode = a.value
    if not isinstance(mode, cst.SimpleString):
        return False
    try:
        text = ast.literal_eval(mode.value)
    except (ValueError, SyntaxError):
        return False
    return (
        isinstance(text, str) and any(c in text for c in "wax") and not any(c in text for c in "r+")
    )


__all__ = ["channel_kind", "constructs", "output_call"]
