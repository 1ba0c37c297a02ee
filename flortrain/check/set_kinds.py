"""What a set's elements are, as far as the text says: strings (their hash, and so a set's
order, changes with PYTHONHASHSEED), numbers (hashed by value: the same order in every run), or
unknown (an object without a hash of its own is hashed by its address)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.static.program import Program, Scope

_SETS = frozenset({"set", "frozenset"})
_SET_METHODS = frozenset({"union", "intersection", "difference", "symmetric_difference", "copy"})
_SET_OPS = (cst.BitOr, cst.BitAnd, cst.Subtract, cst.BitXor)
_STR_METHODS = frozenset({"split", "splitlines", "readlines", "read", "strip", "lower", "upper"})
_STR_CALLS = frozenset({"str", "open", "os.listdir", "glob.glob", "repr", "chr"})
_INT_CALLS = frozenset({"int", "len", "range", "ord", "float", "round", "abs"})
STR = "str"
NUMBER = "number"
UNKNOWN = "unknown"


def set_kind(prog: Program, scope: Scope, node: cst.BaseExpression, depth: int) -> str | None:
    """The kind of the elements of ``node`` when it is a set (None: not a set)."""
    if depth > 3:
        return None
    if isinstance(node, cst.Set):
        return _combine(_value_kind(prog, scope, e.value, depth) for e in node.elements)
    if isinstance(node, cst.SetComp):
        return _value_kind(prog, scope, node.elt, depth)
    if isinstance(node, cst.Call):
        f = node.func
        if (
            isinstance(f, cst.Name)
            and f.value in _SETS
            and prog.binding_scope(scope, f.value) is None
        ):
            if not node.args:
                return None  # an empty set filled later: its elements are not known here
            return _iter_kind(prog, scope, node.args[0].value, depth)
        if isinstance(f, cst.Attribute) and f.attr.value in _SET_METHODS:
            return set_kind(prog, scope, f.value, depth + 1)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _SET_OPS):
        left = set_kind(prog, scope, node.left, depth + 1)
        right = set_kind(prog, scope, node.right, depth + 1)
        if left is None and right is None:
            return None
        return _combine(k for k in (left, right) if k is not None)
    if isinstance(node, cst.Name):
        values = _bindings(prog, scope, node.value)
        if not values or any(v is None for v in values):
            return None
        kinds = [set_kind(prog, scope, v, depth + 1) for v in values if v is not None]
        if any(k is None for k in kinds):
            return None
        return _combine(k for k in kinds if k is not None)
    return None


def _bindings(prog: Program, scope: Scope, name: str) -> list[cst.BaseExpression | None]:
    owner = prog.binding_scope(scope, name)
    return owner.assigned.get(name, []) if owner is not None else []


def _iter_kind(prog: Program, scope: Scope, node: cst.BaseExpression, depth: int) -> str:
    """The kind of what iterating ``node`` yields."""
    if isinstance(node, cst.SimpleString | cst.FormattedString | cst.ConcatenatedString):
        return STR
    if isinstance(node, cst.List | cst.Tuple | cst.Set):
        return _combine(_value_kind(prog, scope, e.value, depth) for e in node.elements)
    if isinstance(node, cst.ListComp | cst.GeneratorExp | cst.SetComp):
        return _value_kind(prog, scope, node.elt, depth)
    if isinstance(node, cst.Call):
        name = _callee(node)
        last = name.rsplit(".", 1)[-1]
        if (isinstance(node.func, cst.Attribute) and last in _STR_METHODS) or name in _STR_CALLS:
            return STR
        if name == "range":
            return NUMBER
        if isinstance(node.func, cst.Attribute) and last == "join":
            return STR
    if isinstance(node, cst.Name) and depth < 3:
        values = _bindings(prog, scope, node.value)
        if values and all(v is not None for v in values):
            kinds = []
            for v in values:
                assert v is not None
                k = _value_kind(prog, scope, v, depth + 1)
                kinds.append(STR if k == STR else _iter_kind(prog, scope, v, depth + 1))
            return _combine(kinds)
    return UNKNOWN


def _value_kind(prog: Program, scope: Scope, node: cst.BaseExpression, depth: int) -> str:
    if isinstance(node, cst.SimpleString | cst.FormattedString | cst.ConcatenatedString):
        return STR
    if isinstance(node, cst.Integer | cst.Float):
        return NUMBER
    if isinstance(node, cst.Tuple):
        return _combine(_value_kind(prog, scope, e.value, depth) for e in node.elements)
    if isinstance(node, cst.Call):
        name = _callee(node)
        if name in _INT_CALLS:
            return NUMBER
        if name in ("str", "repr", "chr") or (
            isinstance(node.func, cst.Attribute) and name.rsplit(".", 1)[-1] in _STR_METHODS
        ):
            return STR
    return UNKNOWN


def _callee(call: cst.Call) -> str:
    f = call.func
    parts: list[str] = []
    while isinstance(f, cst.Attribute):
        parts.append(f.attr.value)
        f = f.value
    if isinstance(f, cst.Name):
        parts.append(f.value)
    return ".".join(reversed(parts))


def _combine(kinds: Iterator[str] | list[str]) -> str:
    found = set(kinds)
    if STR in found:
        return STR
    if found and found <= {NUMBER}:
        return NUMBER
    return UNKNOWN
