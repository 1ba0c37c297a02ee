"""Alias propagation: a change through a loop-scoped view is charged to the object it views."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, P
from flortrain.static.expressions import names_of, object_expr, root
from flortrain.static.plan import Restore


class Aliases(ChangesetRule):
    name = "aliases"
    pattern = "a change through a name that views an outer object (`for p in model.parameters()`)"
    change = "the viewed object (`model`), in place"
    doc = (
        "A loop variable over a literal tuple or list of objects takes each in turn, so changing"
        " it changes each of them. `zip` and `enumerate` are destructured element by element, so"
        " in `for p, e in zip(model.parameters(), ema.parameters())` a change through `e` is"
        " charged to `ema`. Rebinding a view's own name changes nothing else."
    )
    cases = (
        Case(
            "loop-over-a-tuple-literal-mutates-each-object",
            """
            for epoch in range(3):
                for m in (loss_meter, acc_meter):
                    m.reset()
                print(epoch)
        """,
            {("loss_meter", P), ("acc_meter", P)},
        ),
        Case(
            "loop-over-a-list-literal-setting-attributes",
            """
            for epoch in range(3):
                for layer in [model.enc, model.head, 3]:
                    layer.frozen = epoch < 1
                print(epoch)
        """,
            {("model.enc", P), ("model.head", P)},
        ),
        Case(
            "loop-variable-rebound-in-the-body-takes-nothing-more",
            """
            for epoch in range(3):
                for m in (a, b):
                    m = fresh()
                    m.reset()
                print(epoch)
        """,
            set(),
        ),
        Case(
            "parameters-loop-charges-model",
            """
            for epoch in range(3):
                for b in loader:
                    for p in model.parameters():
                        p.data.add_(p.grad, alpha=-0.1)
                        p.grad.zero_()
        """,
            {("model", P)},
        ),
        Case(
            "named-parameters-loop",
            """
            for epoch in range(3):
                for b in loader:
                    for name, p in model.named_parameters():
                        p.grad = None
        """,
            {("model", P)},
        ),
        Case(
            "param-groups-item-assignment",
            """
            for epoch in range(3):
                for b in loader:
                    for g in opt.param_groups:
                        g["lr"] = 0.1
        """,
            {("opt.param_groups", P)},
        ),
        Case(
            "view-by-assignment",
            """
            for epoch in range(3):
                for b in loader:
                    w = model.weight
                    w.mul_(0.5)
        """,
            {("model.weight", P)},
        ),
        Case(
            "zip-destructured-element-by-element",
            """
            for epoch in range(3):
                for b in loader:
                    for p, e in zip(model.parameters(), ema.parameters()):
                        e.data.mul_(0.9).add_(p.data)
        """,
            {("ema", P)},
        ),
        Case(
            "enumerate-zip-nested",
            """
            for epoch in range(3):
                for b in loader:
                    for i, (src, dst) in enumerate(zip(a.parameters(), c.parameters())):
                        dst.zero_()
        """,
            {("c", P)},
        ),
        Case(
            "a-comprehension-variable-views-what-it-iterates",
            """
            for epoch in range(3):
                for b in loader:
                    [m.reset() for m in meters]
                    [p.requires_grad_(False) for p in model.parameters()]
                    {k: q.pop() for k, q in zip(keys, queues)}
                    x.step()
        """,
            {("meters", P), ("model", P), ("queues", P), ("x", P)},
        ),
        Case(
            "a-comprehension-variable-leaves-the-name-outside-it-alone",
            """
            for epoch in range(3):
                for b in loader:
                    [m.reset() for m in (a, c)]
                    m.step()
        """,
            {("a", P), ("c", P), ("m", P)},
        ),
        Case(
            "rebinding-a-view-charges-nothing-else",
            """
            for epoch in range(3):
                for b in loader:
                    for p in model.parameters():
                        p = p * 2
        """,
            set(),
        ),
        Case(
            "rebinding-a-view-after-mutating-through-it-is-not-rule-0",
            """
            for epoch in range(3):
                for b in loader:
                    for p in model.parameters():
                        p.data.mul_(0.5)
                        p = p.grad
        """,
            {("model", P)},
        ),
    )


def for_target(w: Walk, target: cst.BaseExpression, it: cst.BaseExpression) -> None:
    """Bind a ``for`` target: the loop variable keeps its last value after the loop (rule 3),
    and views or takes in turn what it iterates."""
    names = list(names_of(target))
    w.bind(names)
    for n in names:
        w.add(n, Restore.REBOUND, 3, w.prog.line(target), is_global=w.is_global(n))
    for n, src in _alias_pairs(w, target, it):
        w.fx.aliases[n] = src
    _takes(w, target, it)


def comprehension_target(w: Walk, target: cst.BaseExpression, it: cst.BaseExpression) -> None:
    """A comprehension's ``for``: its variable views or takes what it iterates, as a loop's
    does (``[m.reset() for m in meters]`` changes ``meters``), but binds nothing outside it.
    The caller restores the views it had once the comprehension is walked."""
    for n, src in _alias_pairs(w, target, it):
        w.fx.aliases[n] = src
    for n in names_of(target):
        w.fx.takes.pop(n, None)
    _takes(w, target, it)


def _takes(w: Walk, target: cst.BaseExpression, it: cst.BaseExpression) -> None:
    """A variable over a literal tuple or list of objects takes each in turn."""
    if isinstance(target, cst.Name) and isinstance(it, cst.Tuple | cst.List | cst.Set):
        objs = [
            w.through_alias(obj)
            for el in it.elements
            if not isinstance(el, cst.StarredElement)
            and (obj := object_expr(el.value, w.module)) is not None
            and root(obj) not in w.prog.imported
        ]
        if objs:
            w.fx.takes[target.value] = objs


def _alias_pairs(
    w: Walk, target: cst.BaseExpression, it: cst.BaseExpression
) -> Iterator[tuple[str, str]]:
    """Which loop-scoped names view which outer objects (``for p in model.parameters()``:
    ``p`` views ``model``), ``zip``/``enumerate`` element by element."""
    if (
        isinstance(it, cst.Call)
        and isinstance(it.func, cst.Name)
        and it.func.value in {"zip", "enumerate"}
        and not w.scope_shadows(it.func.value)
        and isinstance(target, cst.Tuple | cst.List)
        and not any(isinstance(el, cst.StarredElement) for el in target.elements)
    ):
        args = [a.value for a in it.args if a.keyword is None and not a.star]
        elements = [el.value for el in target.elements]
        if it.func.value == "zip" and len(args) == len(elements) == len(it.args):
            for el, arg in zip(elements, args, strict=True):
                yield from _alias_pairs(w, el, arg)
            return
        if it.func.value == "enumerate" and len(elements) == 2 and args:
            yield from _alias_pairs(w, elements[1], args[0])  # the index views nothing
            return
    src = alias_source(w, it)
    if src is not None:
        for n in names_of(target):
            yield n, src


def alias_source(w: Walk, value: cst.BaseExpression) -> str | None:
    """The outer object a loop-scoped name views: ``model.parameters()`` -> ``model``."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        # zip(a.parameters(), ...), enumerate(x), list(model.parameters())
        for a in value.args:
            src = alias_source(w, a.value)
            if src is not None:
                return src
        return None
    if isinstance(value, cst.Name | cst.Attribute | cst.Subscript) or (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
    ):
        expr = object_expr(value, w.module)
        if expr is not None and root(expr) not in w.prog.imported:
            return w.through_alias(expr)
    return None
