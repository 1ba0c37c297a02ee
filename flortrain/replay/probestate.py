"""Probe state carried across main-loop iterations: what a parallel replay must not divide.

A parallel-replay worker runs the script's setup and resumes at its segment from a boundary
checkpoint, which holds the training's carried state. The probes' own state is in no checkpoint
(the record never ran them), so a probe that keeps state from one iteration to the next (a step
counter ``gstep += 1``, a list that accumulates, a writer's step, ``prev = loss`` for the next
iteration, an object a probe made and changes) would start afresh in every worker and print
wrong lines. A serial replay keeps that state in its process whatever it skips or jumps over
(a jumped iteration runs no probe), so such a loop is replayed serially, the plan saying why.

The rule is static and conservative, on the names the probes bind (``probed``): a main loop
carries probe state when an iteration may read such a name before binding it (on some path) and
either the loop binds it or that read may change the object in place (a method not known to
only read, an item or attribute assigned, an argument to a function not known to only read, an
iterator advanced, a probe function that changes it); or when the loop binds such a name on some
paths only and code after the loop reads it. A probe in a function the loop calls that changes
a probe name of the module counts for every main loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import libcst as cst

from flortrain.replay.observation import ARGUMENT_MUTATORS, imported_names
from flortrain.replay.probes import ProbeSet, bound_names
from flortrain.static.expressions import names_of
from flortrain.static.plan import MainLoop
from flortrain.static.spans import bindings, first_reads
from flortrain.static.values import occurrences

Loop = cst.For | cst.While

#: methods that only read their object (containers, strings, tensors, arrays)
PURE_METHODS = frozenset(
    {
        "get",
        "keys",
        "values",
        "items",
        "count",
        "index",
        "copy",
        "format",
        "join",
        "split",
        "strip",
        "startswith",
        "endswith",
        "lower",
        "upper",
        "replace",
        "item",
        "tolist",
        "numpy",
        "cpu",
        "detach",
        "clone",
        "mean",
        "sum",
        "std",
        "var",
        "median",
        "prod",
        "norm",
        "max",
        "min",
        "abs",
        "argmax",
        "argmin",
        "numel",
        "size",
        "dim",
        "float",
        "double",
        "int",
        "long",
        "to",
        "isnan",
        "isfinite",
        "all",
        "any",
        "round",
        "sqrt",
        "exp",
        "log",
    }
)
#: the builtins that read an iterable to its end (or lazily advance it): pure on a list, a
#: change of state on an iterator the probe consumes
ITERATING = frozenset(
    {
        "min",
        "max",
        "sum",
        "sorted",
        "list",
        "tuple",
        "set",
        "frozenset",
        "dict",
        "enumerate",
        "zip",
        "reversed",
        "map",
        "filter",
        "any",
        "all",
    }
)
#: builtins that only read their arguments (an iterator they consume is changed: see ITERATING)
PURE_BUILTINS = ITERATING | frozenset(
    {
        "print",
        "len",
        "str",
        "repr",
        "format",
        "int",
        "float",
        "bool",
        "complex",
        "abs",
        "round",
        "range",
        "isinstance",
        "type",
        "id",
        "hash",
        "divmod",
        "pow",
        "iter",
    }
)
#: functions of a module that change an argument: heaps, sorted inserts, numpy's in-place writes
MODULE_MUTATORS = ARGUMENT_MUTATORS | frozenset(
    {
        "heappush",
        "heappop",
        "heapreplace",
        "heappushpop",
        "heapify",
        "insort",
        "insort_left",
        "insort_right",
        "copyto",
        "put",
        "place",
        "putmask",
        "next",
    }
)


class _Probed:
    """The names the probes bind, and what is known of them."""

    def __init__(self, probes: ProbeSet) -> None:
        module = probes.current.module
        modules = imported_names(module)
        self.names: set[str] = set()
        self.values: set[str] = set()  # bound only to literals and displays: never an iterator
        maybe_iterators: set[str] = set()
        self.functions: dict[str, cst.CSTNode] = {}  # probe function or lambda -> its body
        self.classes: set[str] = set()
        for p in probes.probes:
            # the names probes may bind (the recorded script uses none of them); not a
            # comprehension's variables, which are its own
            self.names |= set(bound_names(p.node)) - modules
            for node in walk(p.node):
                if isinstance(node, cst.FunctionDef):
                    self.functions[node.name.value] = node
                elif isinstance(node, cst.ClassDef):
                    self.classes.add(node.name.value)
                elif isinstance(node, cst.Assign):
                    for t in node.targets:
                        for n in names_of(t.target):
                            if isinstance(node.value, cst.Lambda):
                                self.functions[n] = node.value
                            (self.values if _is_value(node.value) else maybe_iterators).add(n)
                elif isinstance(node, cst.AugAssign | cst.AnnAssign):
                    maybe_iterators.update(names_of(node.target))
                elif isinstance(node, cst.For | cst.CompFor | cst.AsName):
                    maybe_iterators.update(
                        names_of(node.target if not isinstance(node, cst.AsName) else node.name)
                    )
        self.values -= maybe_iterators
        self.modules = modules
        self.effects = self._effects()

    def _effects(self) -> dict[str, set[str]]:
        """Per probe function, the probe names a call of it may change (``"*"``: an argument)."""
        out: dict[str, set[str]] = {f: set() for f in self.functions}
        calls: dict[str, set[str]] = {f: set() for f in self.functions}
        for f, node in self.functions.items():
            body = node.body if isinstance(node, cst.FunctionDef | cst.Lambda) else node
            params = _params(node)
            declared = {
                n.name.value
                for s in walk(body)
                if isinstance(s, cst.Global | cst.Nonlocal)
                for n in s.names
            }
            local = (set(bindings(body, lambda _: 0)) | params) - declared
            for name in (self.names | params) - (local - params):
                for use, parents in occurrences(body, name):
                    if _changes(use, parents, self) or (name in declared and _is_binding(parents)):
                        out[f].add("*" if name in params else name)
            calls[f] = {
                c.func.value
                for c in walk(body)
                if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
            } & set(self.functions)
        changed = True
        while changed:  # a probe function calling another has its effects too
            changed = False
            for f, callees in calls.items():
                for g in callees:
                    more = out[g] - {"*"} - out[f]
                    if more:
                        out[f] |= more
                        changed = True
        return out


def carried_by_probes(
    probes: ProbeSet,
    mains: Sequence[tuple[Loop, MainLoop]],
    parents: Mapping[cst.CSTNode, cst.CSTNode],
    line: Callable[[cst.CSTNode], int],
) -> dict[str, str]:
    """Per main loop across whose iterations probe state is carried, why (in the probed
    script's lines)."""
    if not probes.probes:
        return {}
    probed = _Probed(probes)
    if not probed.names:
        return {}
    out: dict[str, str] = {}
    everywhere = _in_called_functions(probes, probed, mains, parents, line)
    for loop, main in mains:
        why = everywhere or _carried(loop, probes.current.module, probed, line)
        if why:
            out[main.id] = why
    return out


def _carried(
    loop: Loop, module: cst.Module, probed: _Probed, line: Callable[[cst.CSTNode], int]
) -> str | None:
    bound = bindings(loop.body, line)
    chain = _ancestry(_parents(loop))
    for name in sorted(probed.names):
        for use, _ in first_reads(loop, name):
            parents = chain(use)[::-1]  # up to the loop, nearest last: `for v in gen` too
            if name in bound:
                at = min(bound[name])
                read = "" if at == line(use) else f" (line {line(use)})"
                return f"line {at} rebinds `{name}`, which the next iteration reads{read}"
            if _changes(use, parents, probed):
                return f"line {line(use)} changes `{name}` in place, which the next iteration sees"
            if _calls_changing(use, parents, probed):
                callee = use.value
                changed = sorted(probed.effects[callee] - {"*"})[0]
                return f"line {line(use)} calls `{callee}()`, which changes `{changed}`"
        if name in bound and not _every_iteration_binds(loop, name):
            after = _read_outside(module, loop, name, line)
            if after is not None:
                return (
                    f"line {min(bound[name])} binds `{name}` in some iterations only, and line {after},"
                    " outside the loop, reads it"
                )
    return None


def _in_called_functions(
    probes: ProbeSet,
    probed: _Probed,
    mains: Sequence[tuple[Loop, MainLoop]],
    parents: Mapping[cst.CSTNode, cst.CSTNode],
    line: Callable[[cst.CSTNode], int],
) -> str | None:
    """Why every main loop carries probe state: a probe in a function (one holding no main loop,
    so any iteration may call it) changes a probe name that outlives the call."""
    chain_of = _ancestry(parents)
    holders = {id(a) for loop, _ in mains for a in chain_of(loop) if isinstance(a, cst.FunctionDef)}
    for p in probes.probes:
        chain = chain_of(p.node)
        fn = next((a for a in chain if isinstance(a, cst.FunctionDef | cst.Lambda)), None)
        if fn is None or id(fn) in holders:
            continue
        local = set(bindings(fn.body, line)) | _params(fn)
        for name in sorted(probed.names - local):
            for use, ps in occurrences(p.node, name):
                if _changes(use, ps, probed) or _calls_changing(use, ps, probed):
                    where = fn.name.value if isinstance(fn, cst.FunctionDef) else "a lambda"
                    return f"line {line(use)}, in `{where}()`, changes `{name}`, which outlives the call"
    return None


def _changes(use: cst.Name, parents: Sequence[cst.CSTNode], probed: _Probed) -> bool:
    """Whether this occurrence of a probe name may change the object it names."""
    child: cst.CSTNode = use
    for i in range(len(parents) - 1, -1, -1):
        p = parents[i]
        if isinstance(p, cst.Attribute | cst.Subscript) and p.value is child:
            child = p
            continue
        if isinstance(p, cst.Call) and p.func is child:
            if isinstance(child, cst.Attribute) and child.attr.value in PURE_METHODS:
                child = p  # `seen.copy().append(x)` changes a copy; `d.get(k).append(x)` d's item
                continue
            if isinstance(child, cst.Attribute):
                return True
            return not (
                isinstance(child, cst.Name)
                and (child.value in probed.functions or child.value in probed.classes)
            )
        if isinstance(p, cst.Arg) and p.value is child:
            call = parents[i - 1] if i > 0 else None
            return not isinstance(call, cst.Call) or _passing_changes(
                call, p, child is use, use.value, probed
            )
        if isinstance(p, cst.AugAssign) and p.target is child:
            return True
        if isinstance(p, cst.AssignTarget | cst.AnnAssign) and p.target is child:
            return child is not use  # `h[k] = v`, `h.a = v`; `h = v` rebinds
        if isinstance(p, cst.Del):
            return True
        if isinstance(p, cst.For | cst.CompFor) and p.iter is child:
            return use.value not in probed.values or child is not use
        return isinstance(p, cst.WithItem) and p.item is child  # `with timer:` enters it
    return False


def _passing_changes(call: cst.Call, arg: cst.Arg, whole: bool, name: str, probed: _Probed) -> bool:
    """Whether passing a probe's object to ``call`` may change it."""
    if arg.keyword is not None and arg.keyword.value == "file":
        return True  # print(..., file=log) writes to it
    func = call.func
    if isinstance(func, cst.Name):
        f = func.value
        if f in PURE_BUILTINS:
            return whole and f in ITERATING and name not in probed.values
        if f in probed.functions:
            return "*" in probed.effects[f]
        return f not in probed.classes
    if isinstance(func, cst.Attribute):
        root: cst.BaseExpression = func
        while isinstance(root, cst.Attribute):
            root = root.value
        method = func.attr.value
        in_place = method.endswith("_") and not method.endswith("__")
        if isinstance(root, cst.Name) and root.value in probed.modules and not in_place:
            return method in MODULE_MUTATORS
    return True


def _calls_changing(use: cst.Name, parents: Sequence[cst.CSTNode], probed: _Probed) -> bool:
    """Whether this occurrence calls a probe function that changes a probe name."""
    up = parents[-1] if parents else None
    return (
        use.value in probed.functions
        and isinstance(up, cst.Call)
        and up.func is use
        and bool(probed.effects[use.value] - {"*"})
    )


def _every_iteration_binds(loop: Loop, name: str) -> bool:
    """Whether every iteration that completes binds ``name``: a statement of the body itself
    binds it, and no ``continue`` of this loop can skip it."""
    body = loop.body
    if not isinstance(body, cst.IndentedBlock):
        return False
    direct = any(
        isinstance(s, cst.SimpleStatementLine)
        and any(
            isinstance(x, cst.Assign | cst.AugAssign | cst.AnnAssign)
            and name in bindings(x, lambda _: 0)
            for x in s.body
        )
        for s in body.body
    )
    return direct and not _continues(body)


def _continues(node: cst.CSTNode) -> bool:
    for c in node.children:
        if isinstance(c, cst.Continue):
            return True
        if not isinstance(
            c, cst.For | cst.While | cst.FunctionDef | cst.ClassDef | cst.Lambda
        ) and _continues(c):
            return True
    return False


def _read_outside(
    module: cst.Module, loop: Loop, name: str, line: Callable[[cst.CSTNode], int]
) -> int | None:
    """The first line outside ``loop`` that reads ``name``, if any."""
    inside = {id(n) for n in walk(loop)}
    for node in walk(module):
        if isinstance(node, cst.Name) and node.value == name and id(node) not in inside:
            return line(node)  # a binding outside counts too: conservative
    return None


def _ancestry(
    parents: Mapping[cst.CSTNode, cst.CSTNode],
) -> Callable[[cst.CSTNode], list[cst.CSTNode]]:
    """A node's ancestors, nearest first."""

    def chain(node: cst.CSTNode) -> list[cst.CSTNode]:
        out = []
        while node in parents:
            node = parents[node]
            out.append(node)
        return out

    return chain


def _parents(root: cst.CSTNode) -> dict[cst.CSTNode, cst.CSTNode]:
    """Each node's parent under ``root`` (nested definitions included)."""
    out: dict[cst.CSTNode, cst.CSTNode] = {}
    for node in walk(root):
        for c in node.children:
            out[c] = node
    return out


def _params(node: cst.CSTNode) -> set[str]:
    if isinstance(node, cst.FunctionDef | cst.Lambda):
        ps = node.params
        every = [*ps.posonly_params, *ps.params, *ps.kwonly_params]
        every += [p for p in (ps.star_arg, ps.star_kwarg) if isinstance(p, cst.Param)]
        return {p.name.value for p in every}
    return set()


def _is_binding(parents: Sequence[cst.CSTNode]) -> bool:
    up = parents[-1] if parents else None
    return isinstance(up, cst.AssignTarget | cst.AugAssign | cst.AnnAssign)


def _is_value(expr: cst.BaseExpression) -> bool:
    """A literal, a display or a comprehension: no iterator (a generator expression is one)."""
    if isinstance(
        expr, cst.BaseNumber | cst.BaseString | cst.List | cst.Tuple | cst.Dict | cst.Set
    ):
        return True
    if isinstance(expr, cst.ListComp | cst.SetComp | cst.DictComp):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _is_value(expr.expression)
    if isinstance(expr, cst.BinaryOperation):
        return _is_value(expr.left) and _is_value(expr.right)
    return isinstance(expr, cst.Name) and expr.value in ("None", "True", "False")


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under ``node``, itself included (depth first, the last child first)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


__all__ = ["carried_by_probes", "walk"]
