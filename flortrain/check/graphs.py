"""Which names may hold a tensor carrying an autograd graph, read off the syntax.

A loop's checkpoint cannot hold such a tensor (restored, it would be a detached leaf), so record
executes the loop's instances instead, and says so when it meets one at run time. Statically a
name *may* carry a graph when a binding of it outside ``torch.no_grad()`` is made from:

- a call of a module object (a name or ``self`` attribute bound to an instance of a local
  ``nn.Module`` subclass or of a ``torch.nn`` class, or to ``.to(..)``/``torch.compile`` of one),
- a name a ``.backward()`` is called on in the file (the loss, whatever computed it),
- a local function whose ``return`` carries one,
- or another such name, read other than as a number (:func:`flortrain.static.values.value_read`:
  ``.item()``, ``.detach()``, ``float()`` cut the graph).

A container gets one through ``append``/``extend``/``insert`` or an item assignment. Leaves
(``requires_grad=True``, ``nn.Parameter``) carry no graph themselves, but what is made from them
does. Types are not known: a name bound to a model's output that happens to be an integer
(``model(x).argmax()``) is taken to carry one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import libcst as cst

from flortrain.static.expressions import dotted, names_of
from flortrain.static.program import MODULE, Program, Scope
from flortrain.static.values import value_read

_NO_GRAD = ("no_grad", "inference_mode", "set_grad_enabled(False)")
_WRAPPERS = frozenset({"compile", "DataParallel", "DistributedDataParallel", "DDP"})
_MODULE_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "double"})
ADDERS = frozenset({"append", "extend", "insert", "appendleft", "add"})
#: tensor methods and attributes whose result has no graph, whatever their receiver's
_CUT = frozenset(
    {
        *("argmax", "argmin", "argsort", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isfinite"),
        *("long", "int", "bool", "size", "numel", "dim", "item", "tolist", "detach", "numpy"),
        *("shape", "dtype", "device", "data", "grad", "requires_grad", "is_cuda", "ndim"),
    }
)


class Flow:
    """One binding in a scope: what it binds (names, or a container's expression), from what."""

    def __init__(
        self, names: list[str], container: str | None, value: cst.CSTNode, chain: list[cst.CSTNode]
    ) -> None:
        self.names = names
        self.container = container
        self.value = value
        self.chain = chain  # the value's ancestors, statement first
        self._nodes: list[tuple[cst.CSTNode, list[cst.CSTNode]]] | None = None

    @property
    def nodes(self) -> list[tuple[cst.CSTNode, list[cst.CSTNode]]]:
        """The value's nodes with their ancestors, walked once (libcst builds ``children``
        anew at each access, and the fixpoint asks again)."""
        if self._nodes is None:
            self._nodes = list(_walk(self.value, self.chain))
        return self._nodes


class Graphs:
    """The may-carry-a-graph facts of one program, per scope, computed on demand."""

    def __init__(self, prog: Program, backward: set[str]) -> None:
        """``backward``: the names a ``.backward()`` is called on anywhere in the file."""
        self.prog = prog
        self.backward = backward
        self.module_classes = _module_classes(prog)
        self._flows: dict[str, list[Flow]] = {}
        self._tainted: dict[str, tuple[set[str], set[str]]] = {}
        self._returns: dict[str, bool] = {}

    # -- what binds what -------------------------------------------------------------------
    def flows(self, scope: Scope) -> list[Flow]:
        """Every binding in ``scope`` made with gradients enabled."""
        found = self._flows.get(scope.qualname)
        if found is None:
            found = [] if _decorated_no_grad(scope) else list(_flows(scope.node, self.prog))
            self._flows[scope.qualname] = found
        return found

    def tainted(self, scope: Scope) -> tuple[set[str], set[str]]:
        """The names (leaves included) and the container expressions of ``scope`` that may
        carry a graph, or make one: what :meth:`carries` reads."""
        hit = self._tainted.get(scope.qualname)
        if hit is not None:
            return hit
        names: set[str] = set()
        containers: set[str] = set()
        self._tainted[scope.qualname] = (names, containers)  # recursion: the facts so far
        names.update(self.backward & scope.bound)
        names.update(n for fl in self.flows(scope) for n in fl.names if _is_leaf(fl.value))
        changed = True
        while changed:
            changed = False
            for fl in self.flows(scope):
                if not self.carries(fl, scope):
                    continue
                for n in fl.names:
                    if n not in names:
                        names.add(n)
                        changed = True
                if fl.container is not None and fl.container not in containers:
                    containers.add(fl.container)
                    names.add(fl.container)  # a plain name (`losses`) is read as one
                    changed = True
        return names, containers

    def binds_graph(self, scope: Scope, name: str, within: cst.CSTNode) -> bool:
        """Whether a binding of ``name`` inside ``within`` (a loop) may carry a graph."""
        self.tainted(scope)
        return any(
            name in fl.names and within in fl.chain and self.carries(fl, scope)
            for fl in self.flows(scope)
        )

    def carries(self, fl: Flow, scope: Scope) -> bool:
        """Whether the value of ``fl`` may carry a graph, given what the scope knows so far."""
        graph, containers = self._tainted.get(scope.qualname, (set(), set()))
        base = len(fl.chain)
        for node, chain in fl.nodes:
            if _cut(node, chain, base):
                continue
            if isinstance(node, cst.Name) and node.value in graph:
                if not value_read(node, chain):
                    return True
            elif isinstance(node, cst.Attribute) and containers:
                if self.prog.code(node) in containers and not value_read(node, chain):  # type: ignore[arg-type]
                    return True
            elif (
                isinstance(node, cst.Call)
                and not value_read(node, chain)  # type: ignore[arg-type]
                and (self.is_module(node.func, scope) or self._returns_graph(node, scope))
            ):
                return True
        return False

    # -- modules -----------------------------------------------------------------------------
    def is_module(self, func: cst.BaseExpression, scope: Scope, depth: int = 0) -> bool:
        """Whether calling ``func`` runs a module's forward."""
        if depth > 4:
            return False
        values: list[cst.BaseExpression | None] = []
        if isinstance(func, cst.Name):
            owner = self.prog.binding_scope(scope, func.value)
            if owner is not None:
                values = owner.assigned.get(func.value, [])
        elif (attr := scope.self_attr(func)) is not None and scope.cls is not None:
            info = self.prog.classes.get(scope.cls)
            if info is not None:
                values = [v for _, v in info.attr_assigned.get(attr, [])]
        return any(self._constructs_module(v, scope, depth) for v in values if v is not None)

    def _constructs_module(self, value: cst.BaseExpression, scope: Scope, depth: int) -> bool:
        if not isinstance(value, cst.Call):
            return False
        f = value.func
        name = dotted(f) or ""
        last = name.rsplit(".", 1)[-1]
        if isinstance(f, cst.Name) and f.value in self.module_classes:
            return True
        origin = self.prog.import_origin(name.split(".")[0]) or ""
        full = origin + name[len(name.split(".")[0]) :] if origin else name
        if (full.startswith("torch.nn.") or name.startswith("nn.")) and last[:1].isupper():
            return not last.endswith("Loss")  # a loss module's output carries its inputs' graph
        if last in _WRAPPERS and value.args:
            return self.is_module(value.args[0].value, scope, depth + 1)
        if isinstance(f, cst.Attribute) and last in _MODULE_METHODS:
            return self.is_module(f.value, scope, depth + 1)
        return False

    def _returns_graph(self, call: cst.Call, scope: Scope) -> bool:
        resolved = self.prog.resolve_call(call, scope)
        if resolved is None or resolved[0] not in self.prog.scopes:
            return False
        qual = resolved[0]
        if qual not in self._returns:
            self._returns[qual] = False  # recursion is cut
            callee = self.prog.scopes[qual]
            self.tainted(callee)
            self._returns[qual] = not _decorated_no_grad(callee) and any(
                self.carries(Flow([], None, r.value, chain), callee)
                for r, chain in _returns(callee.node)
                if r.value is not None
            )
        return self._returns[qual]


def _cut(node: cst.CSTNode, chain: list[cst.CSTNode], base: int) -> bool:
    """Whether what ``node`` holds reaches the flow's value (its ancestors from ``chain[base]``
    on) only through something that drops the graph: a comparison or boolean operator, or a
    method or attribute in :data:`_CUT`."""
    child = node
    for i in range(len(chain) - 1, base - 1, -1):
        p = chain[i]
        if isinstance(p, cst.Comparison | cst.BooleanOperation):
            return True
        if isinstance(p, cst.UnaryOperation) and isinstance(p.operator, cst.Not):
            return True
        if isinstance(p, cst.Attribute) and p.value is child and p.attr.value in _CUT:
            return True
        child = p
    return False


def _module_classes(prog: Program) -> set[str]:
    """Local classes that are ``nn.Module`` subclasses, through local bases too."""
    bases: dict[str, list[str]] = {}
    for node in _class_defs(prog.source.module):
        bases[node.name.value] = [prog.code(b.value) for b in node.bases]
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, bs in bases.items():
            if name not in found and any(b.endswith("Module") or b in found for b in bs):
                found.add(name)
                changed = True
    return found


def _class_defs(root: cst.CSTNode) -> Iterator[cst.ClassDef]:
    stack = [root]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.ClassDef):
            yield n
        if isinstance(n, cst.Module | cst.ClassDef | cst.FunctionDef | cst.BaseSuite | cst.If):
            stack.extend(n.children)


def _decorated_no_grad(scope: Scope) -> bool:
    node = scope.node
    return isinstance(node, cst.FunctionDef) and any(
        _no_grad_code(d.decorator) for d in node.decorators
    )


def _no_grad_code(node: cst.CSTNode) -> bool:
    code = cst.Module([]).code_for_node(node).replace(" ", "")
    return any(k in code for k in _NO_GRAD)


def _is_leaf(value: cst.CSTNode) -> bool:
    if not isinstance(value, cst.Call):
        return False
    if (dotted(value.func) or "").endswith("Parameter"):
        return True
    return any(
        a.keyword is not None
        and a.keyword.value == "requires_grad"
        and isinstance(a.value, cst.Name)
        and a.value.value == "True"
        for a in value.args
    )


def _walk(
    node: cst.CSTNode, chain: list[cst.CSTNode]
) -> Iterator[tuple[cst.CSTNode, list[cst.CSTNode]]]:
    """``node`` and everything under it (not into lambdas), each with its ancestors."""
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode]]] = [(node, chain)]
    while stack:
        n, up = stack.pop()
        yield n, up
        if isinstance(n, cst.Lambda | cst.FunctionDef | cst.ClassDef):
            continue
        below = [*up, n]
        for c in n.children:
            if isinstance(n, cst.Attribute) and c is n.attr:
                continue
            stack.append((c, below))


def _statements(root: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, list[cst.CSTNode], bool]]:
    """The small statements of a scope, with their ancestors and whether a ``with no_grad()``
    encloses them; nested functions and classes are other scopes."""
    body = root.body if isinstance(root, cst.Module | cst.FunctionDef) else ()
    start = body.body if isinstance(body, cst.BaseSuite) else body
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode], bool]] = [
        (s, [root], False) for s in reversed(list(start))
    ]
    while stack:
        n, up, off = stack.pop()
        if isinstance(n, cst.FunctionDef | cst.ClassDef):
            continue
        if isinstance(n, cst.BaseSmallStatement):
            yield n, up, off
            continue
        if isinstance(n, cst.For):
            yield n, up, off  # its target is bound from its iterable
        if isinstance(n, cst.With) and any(_no_grad_code(i.item) for i in n.items):
            off = True
        below = [*up, n]
        stack.extend((c, below, off) for c in reversed(n.children))


def _flows(root: cst.CSTNode, prog: Program) -> Iterator[Flow]:
    for s, up, off in _statements(root):
        if off:
            continue
        chain = [*up, s]
        if isinstance(s, cst.For):
            yield Flow(names_of(s.target), None, s.iter, chain)
        elif isinstance(s, cst.Assign):
            names = [n for t in s.targets for n in names_of(t.target)]
            container = next(
                (
                    prog.code(t.target.value)
                    for t in s.targets
                    if isinstance(t.target, cst.Subscript)
                ),
                None,
            )
            yield Flow(names, container, s.value, chain)
        elif isinstance(s, cst.AugAssign | cst.AnnAssign) and s.value is not None:
            yield Flow(names_of(s.target), None, s.value, chain)
        elif isinstance(s, cst.Expr) and isinstance(s.value, cst.Call):
            f = s.value.func
            if isinstance(f, cst.Attribute) and f.attr.value in ADDERS and s.value.args:
                arg = s.value.args[-1]
                yield Flow([], prog.code(f.value), arg.value, [*chain, s.value, arg])


def _returns(root: cst.CSTNode) -> Iterator[tuple[cst.Return, list[cst.CSTNode]]]:
    for s, up, off in _statements(root):
        if isinstance(s, cst.Return) and not off:
            yield s, [*up, s]


__all__ = ["MODULE", "Graphs"]


def backward_receivers(calls: Iterable[cst.Call]) -> set[str]:
    """The names ``.backward()`` is called on among ``calls``."""
    return {
        c.func.value.value
        for c in calls
        if isinstance(c.func, cst.Attribute)
        and c.func.attr.value == "backward"
        and isinstance(c.func.value, cst.Name)
    }
