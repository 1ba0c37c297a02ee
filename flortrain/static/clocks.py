"""Clock names: rebound loop outputs that hold a reading of a clock, or a value made from one.

``start_time = time.time()`` rebound in a batch loop, ``elapsed = time.time() - start_time``,
``ms_per_batch = elapsed * 1000 / log_interval``: such names are restored like any other (the
script may print them, or take the next reading's difference from them), but they are not
training state, and a replay that executes the loop reads the clock anew. Comparing them with
the record's checkpoint (``flortrain diff``) would call every faithful replay unfaithful, so
the plan lists them and the runtime leaves them out of the comparison.

A name is a clock name when every binding of it in its scope is one of: a clock call
(``time.time()``, ``time.perf_counter()``, ``datetime.now()``, ``timeit.default_timer()``, ...);
arithmetic, a method call (``.total_seconds()``) or a numeric builtin (``round``, ``float``)
over at least one clock value and otherwise plain operands (literals, names, attributes); or a
numeric literal (``total_time = 0.0``, reset between readings); and at least one binding is not
a literal. Anything else (a tuple target, a ``for`` target, a name another scope rebinds) is not.
"""

from __future__ import annotations

import libcst as cst

from flortrain.static.expressions import dotted, preorder
from flortrain.static.program import Program, Scope
from flortrain.static.values import occurrences, read_elsewhere

#: the last two parts of a call's dotted name that read a clock (``datetime.datetime.now``
#: matches ``datetime.now``; ``from time import perf_counter`` matches ``perf_counter``)
_CLOCKS = frozenset(
    {
        "time.time",
        "time.time_ns",
        "time.perf_counter",
        "time.perf_counter_ns",
        "time.monotonic",
        "time.monotonic_ns",
        "time.process_time",
        "time.process_time_ns",
        "time.thread_time",
        "datetime.now",
        "datetime.utcnow",
        "datetime.today",
        "date.today",
        "timeit.default_timer",
    }
)
_BARE_CLOCKS = frozenset(
    {"perf_counter", "perf_counter_ns", "monotonic", "default_timer", "time_ns"}
)
_NUMERIC = frozenset({"round", "float", "int", "abs", "max", "min"})


def clock_names(prog: Program, scope: Scope, candidates: set[str]) -> set[str]:
    """The ``candidates`` (names rebound by a loop in ``scope``) that are clock names."""
    bindings: dict[str, list[cst.BaseExpression | None]] = {}
    for name in candidates:
        if (
            name in scope.declared_global
            or name in scope.params
            or read_elsewhere(prog, scope, name)
        ):
            continue
        values = _bindings(scope, name)
        if values is not None:
            bindings[name] = values
    clocks: set[str] = set()
    changed = True
    while changed:  # names made from clock names, to the least fixpoint
        changed = False
        for name, values in bindings.items():
            if name in clocks:
                continue
            kinds = [_kind(v, clocks, prog) for v in values]
            if all(k in ("clock", "literal") for k in kinds) and "clock" in kinds:
                clocks.add(name)
                changed = True
    return clocks


def _bindings(scope: Scope, name: str) -> list[cst.BaseExpression | None] | None:
    """The values bound to ``name`` in ``scope``; None when a binding is not a plain ``name =
    value`` or ``name op= value`` (a tuple target, a loop target, a ``with ... as``)."""
    out: list[cst.BaseExpression | None] = []
    for node, parents in occurrences(scope.node, name):
        parent = parents[-1] if parents else None
        if isinstance(parent, cst.AssignTarget) and parent.target is node:
            assign = parents[-2]
            assert isinstance(assign, cst.Assign)
            out.append(assign.value)
        elif isinstance(parent, cst.AugAssign | cst.AnnAssign) and parent.target is node:
            out.append(parent.value)
        elif _binds(node, parents):
            return None
    return out


def _binds(node: cst.Name, parents: list[cst.CSTNode]) -> bool:
    """Whether this occurrence binds the name some other way than a plain assignment."""
    for p in reversed(parents):
        if isinstance(p, cst.AssignTarget | cst.For | cst.AsName | cst.CompFor | cst.NamedExpr):
            if isinstance(p, cst.For):
                return node in _target_nodes(p.target)
            return not (isinstance(p, cst.NamedExpr) and p.target is not node)
        if isinstance(p, cst.Del | cst.Global | cst.Nonlocal | cst.ImportAlias | cst.MatchAs):
            return True
        if not isinstance(p, cst.Tuple | cst.List | cst.Element | cst.StarredElement):
            return False
    return False


def _target_nodes(target: cst.CSTNode) -> list[cst.CSTNode]:
    return preorder(
        target, lambda n: isinstance(n, cst.Tuple | cst.List | cst.Element | cst.StarredElement)
    )


def is_clock_call(call: cst.Call) -> bool:
    """Whether ``call`` reads a clock (``time.time()``, ``datetime.now()``, ``perf_counter()``)."""
    name = dotted(call.func) or ""
    return ".".join(name.split(".")[-2:]) in _CLOCKS or (
        isinstance(call.func, cst.Name) and name in _BARE_CLOCKS
    )


def _kind(value: cst.BaseExpression | None, clocks: set[str], prog: Program) -> str:
    """``clock``, ``literal``, ``plain`` (no clock in it, no call) or ``other``."""
    if value is None:
        return "other"
    if isinstance(value, cst.Integer | cst.Float):
        return "literal"
    if isinstance(value, cst.UnaryOperation):
        return _kind(value.expression, clocks, prog)
    if isinstance(value, cst.Name):
        return "clock" if value.value in clocks else "plain"
    if isinstance(value, cst.Attribute | cst.SimpleString):
        return "plain"
    if isinstance(value, cst.BinaryOperation):
        return _combine(_kind(value.left, clocks, prog), _kind(value.right, clocks, prog))
    if isinstance(value, cst.Call):
        name = dotted(value.func) or ""
        if is_clock_call(value):
            return "clock" if not value.args else "other"
        args = [_kind(a.value, clocks, prog) for a in value.args]
        if isinstance(value.func, cst.Name) and name in _NUMERIC:
            kind = "plain"
            for k in args:
                kind = _combine(kind, k)
            return kind
        if (
            isinstance(value.func, cst.Attribute)
            and _kind(value.func.value, clocks, prog) == "clock"
        ):
            return "clock" if all(k in ("plain", "literal") for k in args) else "other"
        return "other"
    return "other"


def _combine(a: str, b: str) -> str:
    if "other" in (a, b):
        return "other"
    if "clock" in (a, b):
        return "clock"
    return "plain"


__all__ = ["clock_names", "is_clock_call"]
