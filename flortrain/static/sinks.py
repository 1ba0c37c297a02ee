"""Which names hold output channels: where a script writes, not training state.

``f = open("log.txt", "w")``, ``log = logging.getLogger(__name__)``, ``writer =
SummaryWriter()``, ``rows = csv.writer(..)``, ``pbar = tqdm(total=n)``, and ``self.writer =
SummaryWriter()`` in a method. A call of one of their output methods (``f.write``,
``log.info``, ``writer.add_scalar``, ``pbar.update``; ``library.SINK_METHODS``) is then an
output, as ``print`` is, and puts nothing in the changeset. A name counts only when every
binding of it in its scope is such a constructor; an attribute, when every assignment to
``self.<attr>`` in its class is. Anything else stays with the rules, and at run time an object
of a channel type is not captured however it was reached (``runtime/channels``).
"""

from __future__ import annotations

import ast
import weakref
from dataclasses import dataclass, field

import libcst as cst

from flortrain.static import library
from flortrain.static.expressions import dotted, names_of
from flortrain.static.program import MODULE, Program, Scope


@dataclass
class SinkIndex:
    #: scope qualname -> name -> channel kind (None: bound otherwise somewhere)
    names: dict[str, dict[str, str | None]] = field(default_factory=dict)
    #: class qualname -> attribute -> channel kind (None: assigned otherwise somewhere)
    attrs: dict[str, dict[str, str | None]] = field(default_factory=dict)


_INDEX: weakref.WeakKeyDictionary[Program, SinkIndex] = weakref.WeakKeyDictionary()


def output_call(prog: Program, scope: Scope, func: cst.Attribute) -> str | None:
    """The channel ``func``'s receiver is, when calling ``func`` only writes to it (``log.info``
    where ``log = logging.getLogger(..)``); None otherwise."""
    if not library.is_any_sink_method(func.attr.value):
        return None  # the index is built only for a script that calls such a method
    kind = channel_kind(prog, scope, func.value)
    return kind if kind is not None and library.is_sink_method(kind, func.attr.value) else None


def channel_kind(prog: Program, scope: Scope, expr: cst.BaseExpression) -> str | None:
    """The kind of channel ``expr`` (a name, or ``self.<attr>`` in a method) always holds."""
    index = _index(prog)
    if isinstance(expr, cst.Name):
        owner = prog.binding_scope(scope, expr.value)
        if owner is None or (owner is scope and expr.value in scope.params):
            return None
        return index.names.get(owner.qualname, {}).get(expr.value)
    if (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and scope.cls is not None
        and scope.params
        and expr.value.value == scope.params[0]
    ):
        return _class_attr(prog, index, scope.cls, expr.attr.value, frozenset())
    return None


def _class_attr(
    prog: Program, index: SinkIndex, cls: str, name: str, seen: frozenset[str]
) -> str | None:
    attrs = index.attrs.get(cls, {})
    if name in attrs:
        return attrs[name]
    info = prog.classes.get(cls)
    for base in info.bases if info is not None and cls not in seen else []:
        kind = _class_attr(prog, index, base, name, seen | {cls})
        if kind is not None:
            return kind
    return None


def _index(prog: Program) -> SinkIndex:
    index = _INDEX.get(prog)
    if index is None:
        index = _build(prog)
        _INDEX[prog] = index
    return index


def _build(prog: Program) -> SinkIndex:
    origins = _import_origins(prog.source.module)
    index = SinkIndex()
    for scope in prog.scopes.values():
        _Bindings(prog, scope, origins, index).walk()
    return index


def _import_origins(module: cst.Module) -> dict[str, str]:
    """What each imported name stands for, by its dotted import path: ``SummaryWriter`` ->
    ``torch.utils.tensorboard.SummaryWriter``, ``np`` -> ``numpy``. A name imported twice from
    different places stands for nothing certain and is left out."""
    out: dict[str, str] = {}
    clash: set[str] = set()

    def put(name: str, origin: str) -> None:
        if out.get(name, origin) != origin:
            clash.add(name)
        out[name] = origin

    stack: list[cst.CSTNode] = [module]  # imports inside functions too (`from tqdm import tqdm`)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if isinstance(node, cst.Import):
            for a in node.names:
                full = dotted(a.name)
                if full is None:
                    continue
                if a.asname is not None:
                    for n in names_of(a.asname.name):
                        put(n, full)
                else:
                    top = full.split(".", 1)[0]
                    put(top, top)
        elif (
            isinstance(node, cst.ImportFrom)
            and not isinstance(node.names, cst.ImportStar)
            and not node.relative
        ):
            base = dotted(node.module) if node.module is not None else None
            if base is None:
                continue
            for a in node.names:
                name = dotted(a.name)
                if name is None:
                    continue
                for n in names_of(a.asname.name) if a.asname is not None else [name]:
                    put(n, f"{base}.{name}")
    return {k: v for k, v in out.items() if k not in clash}


class _Bindings:
    """Every binding of a scope's names and of ``self.<attr>`` in a method, each judged a
    channel constructor or not."""

    def __init__(
        self, prog: Program, scope: Scope, origins: dict[str, str], index: SinkIndex
    ) -> None:
        self.prog = prog
        self.scope = scope
        self.origins = origins
        self.index = index
        self.module = prog.scopes[MODULE]
        body: list[cst.CSTNode] = list(scope.body)
        self.nodes = body
        self.me = scope.params[0] if scope.cls is not None and scope.params else None

    def walk(self) -> None:
        for p in self.scope.params:
            self.name(p, None)
        stack = list(self.nodes)
        while stack:
            n = stack.pop()
            if isinstance(n, cst.FunctionDef | cst.ClassDef):
                self.name(n.name.value, None)  # its body is a scope of its own
                continue
            if isinstance(n, cst.Lambda):
                continue
            self.node(n)
            stack.extend(n.children)

    def name(self, name: str, kind: str | None) -> None:
        owner = (
            self.module
            if name in self.scope.declared_global and name not in self.scope.declared_nonlocal
            else self.scope
        )
        names = self.index.names.setdefault(owner.qualname, {})
        names[name] = kind if names.get(name, kind) == kind else None

    def attr(self, name: str, kind: str | None) -> None:
        assert self.scope.cls is not None
        attrs = self.index.attrs.setdefault(self.scope.cls, {})
        attrs[name] = kind if attrs.get(name, kind) == kind else None

    def target(self, t: cst.BaseExpression, kind: str | None) -> None:
        if isinstance(t, cst.Name):
            self.name(t.value, kind)
        elif isinstance(t, cst.Tuple | cst.List):
            for el in t.elements:
                self.target(el.value, None)
        elif isinstance(t, cst.StarredElement):
            self.target(t.value, None)
        elif (
            isinstance(t, cst.Attribute)
            and isinstance(t.value, cst.Name)
            and self.me is not None
            and t.value.value == self.me
        ):
            self.attr(t.attr.value, kind)

    def node(self, n: cst.CSTNode) -> None:
        if isinstance(n, cst.Assign):
            for t in n.targets:
                self.target(t.target, self.constructs(n.value))
        elif isinstance(n, cst.AnnAssign):
            self.target(n.target, self.constructs(n.value) if n.value is not None else None)
        elif isinstance(n, cst.AugAssign | cst.For | cst.CompFor):
            self.target(n.target, None)
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            self.target(n.asname.name, self.constructs(n.item))
        elif isinstance(n, cst.NamedExpr):
            self.target(n.target, None)
        elif isinstance(n, cst.ExceptHandler) and n.name is not None:
            self.target(n.name.name, None)
        elif isinstance(n, cst.Import | cst.ImportFrom) and not isinstance(n.names, cst.ImportStar):
            for a in n.names:
                if a.asname is not None:
                    self.target(a.asname.name, None)
                elif (d := dotted(a.name)) is not None:
                    self.name(d.split(".", 1)[0], None)
        elif isinstance(n, cst.MatchAs | cst.MatchStar) and n.name is not None:
            self.name(n.name.value, None)

    def constructs(self, value: cst.BaseExpression) -> str | None:
        """The kind of channel ``value`` makes (``open(p, "w")``, ``logging.getLogger(..)``)."""
        if not isinstance(value, cst.Call):
            return None
        name = dotted(value.func)
        if name is None:
            return None
        if name == "open" and not self._shadowed("open"):
            return "file" if _write_only(value) else None
        top, _, rest = name.partition(".")
        origin = self.origins.get(top)
        if origin is None or self._local(top):
            return None
        return library.SINK_CONSTRUCTORS.get(f"{origin}.{rest}" if rest else origin)

    def _shadowed(self, name: str) -> bool:
        return any(name in s.bound for s in (self.scope, self.module))

    def _local(self, name: str) -> bool:
        """Whether ``name`` is bound here otherwise than by the module's imports."""
        return self.scope is not self.module and name in self.scope.bound


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


__all__ = ["channel_kind", "output_call"]
