"""What a data-parallel region runs: the functions its calls reach (methods, module functions,
callables kept on ``self``, project modules) and the values a name or ``self.attr`` may hold.
The RNG flow (:mod:`flortrain.check.rngflow`) and the seed tracing (:mod:`flortrain.check.seeds`)
follow the same calls."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import libcst as cst

from flortrain.check import project
from flortrain.check.regions import Func, Regions, class_callable, class_of, func_of, scope_of
from flortrain.check.unit import Unit
from flortrain.static.arguments import bind_params
from flortrain.static.program import MODULE


def key_of(func: Func, expr: cst.BaseExpression | None) -> str | None:
    """The generator key of a name or attribute chain (the method's own first parameter is
    ``self``), or None."""
    if isinstance(expr, cst.Name):
        return "self" if expr.value == func.self_param else expr.value
    if isinstance(expr, cst.Attribute):
        inner = key_of(func, expr.value)
        return None if inner is None else f"{inner}.{expr.attr.value}"
    return None


def calls_in(unit: Unit, node: cst.CSTNode) -> list[cst.Call]:
    """Calls in ``node``, inner ones (arguments) first, lambda bodies included, nested defs
    not. Kept per node: the reach and the flow ask for the same statements."""
    cache = _CALLS.setdefault(unit, {})
    found = cache.get(node)
    if found is None:
        out: list[cst.Call] = []

        def walk(n: cst.CSTNode) -> None:
            if isinstance(n, cst.FunctionDef | cst.ClassDef):
                return
            for c in n.children:
                walk(c)
            if isinstance(n, cst.Call):
                out.append(n)

        walk(node)
        found = cache[node] = out
    return found


#: per unit, keyed by the node itself (libcst nodes hash by identity)
_CALLS: weakref.WeakKeyDictionary[Unit, dict[cst.CSTNode, list[cst.Call]]] = (
    weakref.WeakKeyDictionary()
)


def attr_values(
    regions: Regions, unit: Unit, cls: str, attr: str, depth: int = 0
) -> list[tuple[Unit, int, cst.BaseExpression]]:
    """The values ``self.attr`` is given in class ``cls`` and its local bases, each with the
    unit and the scope (by node id) that assigns it. A constructor parameter stored there
    (``self.rng = rng``) stands for the arguments the file's ``Cls(...)`` calls pass."""
    prog = unit.program
    out: list[tuple[Unit, int, cst.BaseExpression]] = []
    info = prog.classes.get(cls)
    if info is None or depth > 4:
        return out
    for meth, value in info.attr_assigned.get(attr, []):
        if value is None:
            continue
        scope = prog.scopes.get(meth)
        where = id(scope.node) if scope else 0
        if isinstance(value, cst.Name) and scope is not None and value.value in scope.params:
            out.extend(_constructor_args(regions, unit, cls, meth, value.value))
        else:
            out.append((unit, where, value))
    for base in info.bases:
        out.extend(attr_values(regions, unit, base, attr, depth + 1))
    return out


def _constructor_args(
    regions: Regions, unit: Unit, cls: str, meth: str, param: str
) -> list[tuple[Unit, int, cst.BaseExpression]]:
    """What the file's (and the checked file's) ``Cls(...)`` calls pass for ``param``."""
    if not meth.endswith(".__init__"):
        return []
    init = unit.program.scopes[meth]
    out: list[tuple[Unit, int, cst.BaseExpression]] = []
    sites = [unit] if unit is regions.unit else [unit, regions.unit]
    for site in sites:
        module = site.program.scopes[MODULE]
        simple = cls.rsplit(".", 1)[-1]
        for call in site.calls:
            f = call.func
            named = (
                f.value
                if isinstance(f, cst.Name)
                else f.attr.value
                if isinstance(f, cst.Attribute)
                else ""
            )
            if named != simple:
                continue
            found = class_of(site, call, module)
            if found is None or found[0] is not unit or found[1] != cls:
                continue
            arg = bind_params(call, init, call.func).get(param)
            if arg is None:
                continue
            scope = scope_of(site, call)
            values: list[cst.BaseExpression | None] = [arg]
            if isinstance(arg, cst.Name):
                owner = site.program.binding_scope(scope, arg.value)
                values = list(owner.assigned.get(arg.value, [])) if owner else []
            out.extend((site, id(scope.node), v) for v in values if v is not None)
    return out


def held_values(
    regions: Regions, func: Func, expr: cst.BaseExpression
) -> list[tuple[Unit, cst.BaseExpression]]:
    """The values a name or ``self.attr`` may hold, as assignments show them."""
    key = key_of(func, expr)
    if key is None:
        return []
    root, _, attr = key.partition(".")
    if root == "self" and attr and "." not in attr and func.scope.cls is not None:
        return [(u, v) for u, _, v in attr_values(regions, func.unit, func.scope.cls, attr)]
    if attr:
        return []
    owner = func.unit.program.binding_scope(func.scope, root)
    if owner is None:
        return []
    return [(func.unit, v) for v in owner.assigned.get(root, []) if v is not None]


def callees(
    regions: Regions, func: Func, call: cst.Call
) -> list[tuple[Func, dict[str, cst.BaseExpression], bool]]:
    """The functions ``call`` runs, each with its parameters' arguments and whether its
    ``self`` is the caller's."""
    unit, prog = func.unit, func.unit.program
    r = prog.resolve_call(call, func.scope)
    if r is not None and r[0] in prog.scopes:
        target = func_of(unit, prog.scopes[r[0]])
        if target is not None:
            recv = r[1]
            same = isinstance(recv, cst.Name) and recv.value == func.self_param
            return [(target, bind_params(call, target.scope, recv), same)]
    out: list[tuple[Func, dict[str, cst.BaseExpression], bool]] = []
    for q in unit.called(call):
        d = project.resolve_dotted(unit, q)
        if d is None:
            continue
        if d.scope is not None:
            target = func_of(d.unit, d.scope)
        elif d.cls is not None:
            init = d.unit.program.method(d.cls.qualname, "__init__")
            target = func_of(d.unit, d.unit.program.scopes[init]) if init else None
        else:
            target = None
        if target is not None:
            recv = call.func if d.cls is not None else None
            return [(target, bind_params(call, target.scope, recv), False)]
    # a callable kept on self or in a name: `self.transform(x)` runs its class's __call__
    for vunit, value in held_values(regions, func, call.func):
        scope = vunit.program.scopes[MODULE]
        cls = class_of(vunit, value, scope) if isinstance(value, cst.Call) else None
        targets = [class_callable(*cls)] if cls else []
        if isinstance(value, cst.Call):
            for a in value.args:  # Compose([Flip(), Noise()])
                if isinstance(a.value, cst.List | cst.Tuple):
                    for el in a.value.elements:
                        c = class_of(vunit, el.value, scope)
                        targets.append(class_callable(*c) if c else None)
        for t in targets:
            if t is not None and all(t != o[0] for o in out):
                out.append((t, bind_params(call, t.scope, call.func), False))
    return out


def reach(regions: Regions, entries: Sequence[Func]) -> set[int]:
    """Every function (by node id) the regions run, however deep."""
    seen: set[int] = set()
    stack = list(entries)
    while stack:
        f = stack.pop()
        if id(f.node) in seen:
            continue
        seen.add(id(f.node))
        for call in calls_in(f.unit, f.node.body):
            stack.extend(t for t, _, _ in callees(regions, f, call))
    return seen
