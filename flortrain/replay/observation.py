"""Probes observe; they must not change training state.

A probe that changes what the training uses (``w[0] = 0.0``, ``opt.step()``,
``model.weight.data.mul_(2)``) makes the probed script a different training run. A replay
cannot give the answer ``python`` would give: restored checkpoints overwrite the change, so the
replay reproduces the *record* and ``diff`` passes, while a plain run of the probed script
trains differently. That silent disagreement is the worst outcome this product has, so such
probes are refused up front (``FT025``), naming what they change.

The rule is syntactic, on names the recorded script uses (``used``):

- assigning to an attribute or item of one (``model.lr = 0``, ``hist[0] = 1``, augmented too);
- calling an in-place method (a name ending in one ``_``: ``add_``, ``zero_``,
  ``requires_grad_``) on one, or an in-place function with one as an argument
  (``torch.nn.init.zeros_(model.weight)``);
- calling a state-changing method on one (:data:`MUTATORS`: ``step``, ``append``,
  ``load_state_dict`` ...), or shuffling one, or ``setattr``/``delattr`` on one.

Allowed, because replay restores them around every probe: ``model.train()``/``model.eval()``,
``torch.no_grad()``, and drawing from or seeding the global RNG streams. Code in a function the
probe defines is not inspected; code in a function the script defined is not visible here: a
probe calling a helper that mutates (``perturb(model)``) is not refused (docs/limitations.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.static.expressions import target_exprs

#: Methods that change their object: optimizers, modules, Python containers, generators.
MUTATORS = frozenset(
    {
        "step",
        "zero_grad",
        "backward",
        "load_state_dict",
        "apply",
        "register_buffer",
        "register_parameter",
        "add_module",
        "add_param_group",
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "clear",
        "sort",
        "reverse",
        "update",
        "setdefault",
        "popitem",
        "discard",
        "add",
        "set_state",
        "set_rng_state",
        "shuffle",
        "seed",
    }
)
#: Functions that change an argument: ``random.shuffle(order)``, ``setattr(model, ...)``.
ARGUMENT_MUTATORS = frozenset({"shuffle", "setattr", "delattr"})


def mutation(stmt: cst.CSTNode, used: set[str], modules: set[str]) -> str | None:
    """How ``stmt`` (a probe) changes a training name, as a phrase, or None if it only
    observes. ``modules`` are the names the script binds by ``import``: ``torch.add(x, 1)`` and
    ``np.sort(a)`` are functions of a module, not methods changing an object."""
    objects = used - modules
    for node in _outside_defs(stmt):
        if isinstance(node, cst.AssignTarget | cst.AugAssign | cst.AnnAssign):
            for target in _targets(node.target):
                if _base(target) in used:
                    return f"assigns to `{_code(target)}`"
        elif isinstance(node, cst.Call):
            found = _call(node, used, objects)
            if found:
                return found
    return None


def imported_names(module: cst.Module) -> set[str]:
    """Names bound by ``import`` statements anywhere in the script."""
    out: set[str] = set()
    for node in _outside_defs(module):
        if isinstance(node, cst.Import | cst.ImportFrom) and not isinstance(
            node.names, cst.ImportStar
        ):
            for alias in node.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                root = _base(bound) if isinstance(bound, cst.Attribute | cst.Name) else None
                if root is not None:
                    out.add(root)
    return out


def callee(call: cst.Call) -> str | None:
    """The name a call calls: ``f`` of ``f(x)`` and of ``obj.f(x)``; None for ``fs[0](x)``."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else None


def _call(call: cst.Call, used: set[str], objects: set[str]) -> str | None:
    func = call.func
    name = callee(call)
    if name is None:
        return None
    in_place = name.endswith("_") and not name.endswith("__")
    if (
        isinstance(func, cst.Attribute)
        and _base(func.value) in objects
        and (in_place or name in MUTATORS)
    ):
        return f"calls `{_code(func)}()`"
    if in_place or name in ARGUMENT_MUTATORS:
        for arg in call.args:
            if _base(arg.value) in used:
                return f"calls `{_code(func)}()` on `{_code(arg.value)}`"
    return None


def _outside_defs(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    if isinstance(node, cst.FunctionDef | cst.Lambda | cst.ClassDef):
        return
    for c in node.children:
        yield from _outside_defs(c)


def _targets(t: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The attribute and item targets of an assignment (inside tuple unpacking too)."""
    return (e for e in target_exprs(t) if isinstance(e, cst.Attribute | cst.Subscript))


def _base(e: cst.BaseExpression) -> str | None:
    """The name an expression is rooted at: ``model`` for ``model.fc.weight.data[0]``."""
    while True:
        if isinstance(e, cst.Name):
            return e.value
        if isinstance(e, cst.Attribute | cst.Subscript):
            e = e.value
        elif isinstance(e, cst.Call):
            e = e.func
        else:
            return None


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


__all__ = ["ARGUMENT_MUTATORS", "MUTATORS", "callee", "imported_names", "mutation"]
