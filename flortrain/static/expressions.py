"""Syntax helpers for the changeset rules: which object an expression names, which names a target
binds. Pure functions of libcst nodes; no rule lives here."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

#: Attributes that view the same storage: mutating ``p.data`` or ``p.grad`` mutates ``p``'s state.
VIEW_ATTRS = frozenset({"data", "grad"})


def object_expr(node: cst.BaseExpression, code: cst.Module) -> str | None:
    """The object a mutation lands on: ``self.hist[k]`` -> ``self.hist``, ``p.data`` -> ``p``,
    ``model.parameters()`` -> ``model``. None when there is no named object (``f(x).add_()``)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = object_expr(node.value, code)
        if inner is None:
            return None
        if node.attr.value in VIEW_ATTRS:
            return inner
        return f"{inner}.{node.attr.value}"
    if isinstance(node, cst.Subscript):
        return object_expr(node.value, code)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return object_expr(node.func.value, code)
    return None


def root(expr: str) -> str:
    return expr.split(".", 1)[0]


def dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr.value}"
    return None


def preorder(
    node: cst.CSTNode, descend: Callable[[cst.CSTNode], bool] = lambda n: True
) -> list[cst.CSTNode]:
    """``node`` and the nodes below it, without recursion (a deep expression would exhaust the
    stack), entering only the nodes ``descend`` accepts."""
    out: list[cst.CSTNode] = []
    stack = [node]
    while stack:
        n = stack.pop()
        out.append(n)
        if descend(n):
            stack.extend(n.children)
    return out


def called_name(call: cst.Call) -> str | None:
    """The last name of what a call calls: ``f`` of ``f(x)``, ``step`` of ``opt.step()``."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else None


def target_exprs(node: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(node, cst.Tuple | cst.List):
        for el in node.elements:
            yield from target_exprs(el.value)
    elif isinstance(node, cst.StarredElement):
        yield from target_exprs(node.value)
    else:
        yield node


def walk_no_defs(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    if isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Lambda):
        return
    yield node
    for c in node.children:
        yield from walk_no_defs(c)


def pattern_captures(pattern: cst.MatchPattern) -> list[str]:
    """Names a ``case`` pattern binds: capture patterns and ``as`` names, not value patterns
    (``case Color.RED``) nor class names (``case Point(x=0)``)."""
    out: list[str] = []
    for n in walk_no_defs(pattern):
        if isinstance(n, cst.MatchAs | cst.MatchStar) and n.name is not None:
            out.append(n.name.value)
        elif isinstance(n, cst.MatchMapping) and n.rest is not None:
            out.append(n.rest.value)
    return out


def top(node: cst.BaseExpression) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def names_of(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, cst.Tuple | cst.List):
        return [n for el in node.elements for n in names_of(el.value)]
    if isinstance(node, cst.StarredElement):
        return names_of(node.value)
    return []


def is_view(value: cst.BaseExpression) -> bool:
    """Whether ``x = value`` makes ``x`` another name for (part of) an existing object."""
    if isinstance(value, cst.Name | cst.Attribute | cst.Subscript):
        return True
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value
        in {
            "parameters",
            "named_parameters",
            "buffers",
            "modules",
            "children",
            "values",
            "items",
            "view",
            "view_as",
            "detach",
            "__getitem__",
        }
    )


PURE_NODES = (
    cst.Name,
    cst.Attribute,
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.Comparison,
    cst.ComparisonTarget,
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.BooleanOperation,
    cst.BaseCompOp,
    cst.BaseBinaryOp,
    cst.BaseUnaryOp,
    cst.BaseBooleanOp,
    cst.LeftParen,
    cst.RightParen,
    cst.BaseParenthesizableWhitespace,
    cst.Dot,
)


def impurity(expr: cst.CSTNode) -> str | None:
    """Why evaluating ``expr`` could do more than read values (None: it cannot): a call may draw
    random numbers, change a module's mode or rebind state; names, attributes, numbers and
    operators on them do not. Span guards are evaluated off the running iteration, and probe
    guards outside probe isolation, on the strength of this test."""
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call):
            return "calls a function"
        if not isinstance(n, PURE_NODES):
            return f"is not a plain expression of names and numbers ({type(n).__name__})"
        stack.extend(n.children)
    return None


def argument(call: cst.Call, keyword: str, pos: int | None = None) -> cst.BaseExpression | None:
    """The argument ``call`` passes as ``keyword``, or at position ``pos`` when it is not given
    by keyword (None: not passed, or passed through ``*args``/``**kwargs``)."""
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if pos is not None and pos < len(positional):
        return positional[pos].value
    return None
