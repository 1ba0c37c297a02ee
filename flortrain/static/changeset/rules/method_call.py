"""Rule 4: a method called for its effect changes its receiver (and, assigned, rule 1)."""

from __future__ import annotations

import builtins
import inspect

import libcst as cst

from flortrain.static import library, sinks
from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, P, R
from flortrain.static.changeset.rules import library_knowledge
from flortrain.static.expressions import dotted, object_expr, root


class MethodCall(ChangesetRule):
    number = 4
    name = "method-call"
    pattern = "`obj.method(...)`"
    change = "`{obj}`"
    doc = (
        "Not for a method of a local class (its body is analysed: `callees`), a write to an"
        " output channel (`log.info(..)`, `writer.add_scalar(..)`: an output, as `print` is), a"
        " callable held in an attribute (`self.model(x)`: only that attribute's object; a name"
        " the class neither defines nor assigns but may inherit from a library base, as"
        " `model.zero_grad()` of a `torch.nn.Module` subclass, charges the receiver), a"
        " library module's function (`library-knowledge`), a known pure method, or a classmethod"
        " or staticmethod of a builtin type the script never rebinds (`int.from_bytes(..)`:"
        " Python refuses to change those types; `list.append(acc, x)` changes `acc`)."
    )
    cases = (
        Case(
            "rule4",
            """
            for epoch in range(3):
                for b in loader:
                    opt.zero_grad()
                    opt.step()
        """,
            {("opt", P)},
        ),
        Case(
            "rule4-on-subscript-and-chained-call",
            """
            for epoch in range(3):
                for b in loader:
                    buckets[b].append(b)
                    stats.setdefault(b, []).append(b)
        """,
            {("buckets", P), ("stats", P)},
        ),
        Case(
            "known-pure-method-does-not-charge-receiver",
            """
            x = start
            for epoch in range(3):
                for b in loader:
                    x = x.detach()
                    n = x.item()
            print(x, n)
        """,
            {("x", R), ("n", R)},
        ),
        Case(
            "a-builtin-types-method-does-not-charge-the-type",
            """
            for epoch in range(3):
                for b in loader:
                    n = int.from_bytes(b, "big")
                    keys = dict.fromkeys(b)
            print(n, keys)
        """,
            {("n", R), ("keys", R)},
        ),
        Case(
            "a-builtin-types-instance-method-changes-its-first-argument",
            """
            for epoch in range(3):
                for b in loader:
                    list.append(acc, b)
                    dict.__setitem__(seen, b, epoch)
        """,
            {("acc", P), ("seen", P)},
        ),
        Case(
            "a-builtin-rebound-anywhere-is-not-assumed-the-builtin",
            """
            def reset():
                global max
                max = []

            reset()
            for epoch in range(3):
                for b in loader:
                    max.append(b)
                    int.from_bytes(b, "big")
                    n = [str.maketrans(b, b) for str in names]
            print(n)
        """,
            {("max", P), ("names", P), ("n", R)},
        ),
        Case(
            "a-method-a-local-class-inherits-from-a-library-class-changes-the-receiver",
            """
            class Net(torch.nn.Module):
                def __init__(self, act):
                    super().__init__()
                    self.act = act

                def forward(self, x):
                    return self.act(x)

            model = Net(relu)
            other = Net(relu)
            for epoch in range(3):
                for b in loader:
                    model.zero_grad()
                    other.act(b)
        """,
            {("model", P), ("other.act", P)},
        ),
        Case(
            "a-rebound-builtin-name-is-an-object-like-any-other",
            """
            dict = {}
            for epoch in range(3):
                for b in loader:
                    dict.update(b)
            print(dict)
        """,
            {("dict", P)},
        ),
    )


def _builtin_type_call(
    w: Walk, call: cst.Call, func: cst.Attribute, line: int, assigned: bool
) -> int | None:
    """A method called through a builtin type the script never rebinds, which can never change
    the type itself (Python refuses to set a builtin type's attributes): a classmethod or
    staticmethod (``int.from_bytes``, ``dict.fromkeys``) makes a new object and changes
    nothing (rule 2); an instance method (``list.append(acc, x)``) changes its first argument,
    as rule 1/4 does a receiver. None: not such a call."""
    if not isinstance(func.value, cst.Name) or not w.prog.bindings.unbound(func.value.value):
        return None
    found = getattr(builtins, func.value.value, None)
    if not isinstance(found, type):
        return None
    try:
        attr = inspect.getattr_static(found, func.attr.value)
    except AttributeError:
        return None
    if isinstance(attr, _CLASS_LEVEL):
        return 2
    first = call.args[0] if call.args else None
    if first is None or first.keyword is not None or first.star:
        return None
    obj = object_expr(first.value, w.module)
    if obj is None:
        return 2  # a temporary's method: nothing named changes
    w.add_target_object(obj, line, 1 if assigned else 4)
    return 1 if assigned else 4


#: what a builtin type's class-level methods are, looked up on the type without binding them
_CLASS_LEVEL = (classmethod, staticmethod, type(dict.__dict__["fromkeys"]))


def method_call(
    w: Walk, call: cst.Call, func: cst.Attribute, local: bool, line: int, assigned: bool
) -> int:
    """Apply rule 1 (``assigned``) or 4 to ``obj.method(...)``; return the rule that fired, 2 where
    no receiver changes. ``local``: the method is the script's own, mapped as a callee."""
    w.expr_effects(func.value, line)
    through_type = _builtin_type_call(w, call, func, line, assigned)
    if through_type is not None:
        return through_type
    if local:
        # its body was analysed and its effects on `self` mapped onto the receiver, so rule 1/4
        # would only add the whole receiver
        return 2
    kind = sinks.output_call(w.prog, w.scope, func)
    if kind is not None:
        channel = object_expr(func.value, w.module)
        if channel is not None:
            w.fx.outputs.setdefault(channel, kind)
        return 2
    owner = w.prog.type_of(func.value, w.scope)
    if owner is not None and w.prog.held_callable(owner, func.attr.value):
        # `self.model(x)`: a callable held in an attribute, not a method of the local class;
        # only that attribute's object can change, not the whole receiver
        target = object_expr(func, w.module)
        if assigned or target is None:
            return 2
        w.add_target_object(target, line, 4)
        return 4
    obj = object_expr(func.value, w.module)
    if obj is not None and root(obj) in w.prog.imported:
        library_knowledge.library_call(w, dotted(func) or func.attr.value, call, line)
        return 2
    if func.attr.value == "__next__" and obj is not None:
        w.fx.advanced.setdefault(w.through_alias(obj), line)
    if func.attr.value in library.MUTATING_LIBRARY:
        # `rng.shuffle(idx)` on a local Generator/Random changes idx as well as rng
        library_knowledge.mutated_arg(w, call, library.MUTATING_LIBRARY[func.attr.value], line)
    if func.attr.value in library.PURE_METHODS:
        return 2
    if obj is None:
        return 2 if assigned else 4  # a method of a temporary: nothing named changes
    w.add_target_object(obj, line, 1 if assigned else 4)
    return 1 if assigned else 4
