"""Data-parallel regions: the code DataLoader workers, pools, threads and DataParallel replicas
run, found from the checked file and followed into its project modules.

A region is entered at a function (DETrain's ``data_parallel_begin``): a Dataset's
``__getitem__``/``__iter__``, a loader's ``collate_fn`` and ``worker_init_fn``, what a pool maps,
what ``joblib.delayed`` wraps, an ``nn.DataParallel`` module's ``forward``. How the region runs
(:class:`Kind`) decides which streams its copies share or repeat.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

import libcst as cst

from flortrain.check import project
from flortrain.check.unit import Unit
from flortrain.static.expressions import argument
from flortrain.static.program import MODULE, Scope


class Kind(Enum):
    """How a region's copies run; the value is how messages say it."""

    LOADER = "DataLoader workers"  # processes; torch reseeds random, torch and numpy (>= 1.9)
    LOADER_THREADS = "DataLoader worker threads"
    PROCESSES = "worker processes"  # pools, joblib: nothing is reseeded
    THREADS = "threads"
    REPLICAS = "nn.DataParallel replicas"  # threads, one per device

    @property
    def threaded(self) -> bool:
        return self in (Kind.LOADER_THREADS, Kind.THREADS, Kind.REPLICAS)


_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_DATASETS = frozenset(
    {
        "torch.utils.data.Dataset",
        "torch.utils.data.IterableDataset",
        "torch.utils.data.dataset.Dataset",
        "torch.utils.data.dataset.IterableDataset",
    }
)
_ENTRY_METHODS = ("__getitem__", "__getitems__", "__iter__", "__next__")
_THREAD_POOLS = frozenset(
    {
        "concurrent.futures.ThreadPoolExecutor",
        "concurrent.futures.thread.ThreadPoolExecutor",
        "multiprocessing.pool.ThreadPool",
        "multiprocessing.dummy.Pool",
    }
)
_PROCESS_POOLS = frozenset(
    {
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
        "multiprocessing.Pool",
        "multiprocessing.pool.Pool",
        "torch.multiprocessing.Pool",
    }
)
_POOL_METHODS = frozenset(
    [
        "map",
        "imap",
        "imap_unordered",
        "starmap",
        "map_async",
        "starmap_async",
        "apply",
        "apply_async",
        "submit",
    ]
)
_DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
)


@dataclass(frozen=True)
class Func:
    """A function a region runs: a def (``node``'s own scope) or a lambda (written in
    ``scope``)."""

    unit: Unit = field(repr=False)
    node: cst.FunctionDef | cst.Lambda = field(repr=False)
    scope: Scope = field(repr=False)
    name: str

    @property
    def params(self) -> list[str]:
        if isinstance(self.node, cst.Lambda):
            p = self.node.params
            return [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)]
        return self.scope.params

    @property
    def self_param(self) -> str | None:
        if isinstance(self.node, cst.FunctionDef) and self.scope.cls and self.scope.params:
            return self.scope.params[0]
        return None

    def is_local(self, name: str) -> bool:
        if isinstance(self.node, cst.Lambda):
            return name in self.params
        return self.scope.is_local(name)


def func_of(unit: Unit, scope: Scope) -> Func | None:
    if not isinstance(scope.node, cst.FunctionDef):
        return None
    return Func(unit, scope.node, scope, scope.qualname)


@dataclass
class Loader:
    """One ``DataLoader(...)`` call of the checked file."""

    call: cst.Call
    scope: Scope
    kind: Kind | None  # None: ``num_workers`` is 0 (or left out): the main process loads
    dataset: cst.BaseExpression | None
    init_fns: list[Func] = field(default_factory=list)

    def keyword(self, name: str) -> cst.Arg | None:
        return next((a for a in self.call.args if a.keyword and a.keyword.value == name), None)


@dataclass
class Region:
    kind: Kind
    entry: Func
    #: where in the checked file a hazard found in another file is reported (None: the entry
    #: is in the checked file)
    anchor: cst.CSTNode | None = None
    loader: Loader | None = None
    dataset: tuple[Unit, str] | None = None  # the dataset class (unit, qualname)
    #: the entry is a Dataset of a project module, whose own check reports its draws
    elsewhere: bool = False


class Regions:
    """The regions of one checked file (build once per unit through :func:`regions`)."""

    def __init__(self, unit: Unit) -> None:
        self.unit = unit

    def scope_of(self, call: cst.Call) -> Scope:
        return scope_of(self.unit, call)

    @cached_property
    def loaders(self) -> list[Loader]:
        out = []
        names = _local_names(self.unit, _LOADERS)
        for call in self.unit.calls:
            if _callee_name(call) not in names or not self.unit.called(call) & _LOADERS:
                continue
            scope = self.scope_of(call)
            loader = Loader(call, scope, _loader_kind(call), argument(call, "dataset", 0))
            init = loader.keyword("worker_init_fn")
            if init is not None:
                loader.init_fns = resolve_ref(self.unit, init.value, scope)
            out.append(loader)
        return out

    def dataset_class(self, loader: Loader) -> tuple[Unit, str] | None:
        if loader.dataset is None:
            return None
        return class_of(self.unit, loader.dataset, loader.scope)

    @cached_property
    def all(self) -> list[Region]:
        out: list[Region] = []
        unit = self.unit
        seen_classes: set[tuple[str, str]] = set()
        for loader in self.loaders:
            cls = self.dataset_class(loader)
            if loader.kind is None:
                if cls is not None:
                    seen_classes.add((cls[0].path, cls[1]))
                continue
            if cls is not None:
                seen_classes.add((cls[0].path, cls[1]))
                home = cls[0] is unit
                elsewhere = not home and is_dataset(cls[0], cls[1])
                anchor = None if home else loader.dataset
                for f in entry_methods(cls[0], cls[1]):
                    out.append(Region(loader.kind, f, anchor, loader, cls, elsewhere))
            for name in ("collate_fn", "worker_init_fn"):
                arg = loader.keyword(name)
                if arg is not None:
                    for f in resolve_ref(unit, arg.value, loader.scope):
                        anchor = None if f.unit is unit else arg.value
                        out.append(Region(loader.kind, f, anchor, loader))
        for qual in unit.program.classes:
            if (unit.path, qual) in seen_classes:
                continue
            entries = entry_methods(unit, qual)
            if entries and is_dataset(unit, qual):
                # no loader here says how it is loaded: assume worker processes
                out.extend(Region(Kind.LOADER, f, dataset=(unit, qual)) for f in entries)
        out.extend(self._pools())
        return out

    def _pools(self) -> Iterator[Region]:
        unit = self.unit
        for call, kind, target, scope in self.submissions():
            if kind is Kind.REPLICAS:
                cls = class_of(unit, target, scope)
                if cls is not None:
                    m = cls[0].program.method(cls[1], "forward")
                    f = func_of(cls[0], cls[0].program.scopes[m]) if m else None
                    if f is not None:
                        yield Region(Kind.REPLICAS, f, None if f.unit is unit else call)
                continue
            for f in resolve_ref(unit, target, scope):
                yield Region(kind, f, None if f.unit is unit else target)

    def submissions(self) -> Iterator[tuple[cst.Call, Kind, cst.BaseExpression, Scope]]:
        """Each call that hands a callable (``target``) to a pool, to ``joblib.delayed`` or to
        ``nn.DataParallel`` (kind REPLICAS, ``target`` the module), with the scope it is in."""
        unit = self.unit
        names = _local_names(unit, _DATA_PARALLEL | {"joblib.delayed"})
        for call in unit.calls:
            if not call.args or not (_callee_name(call) in names or _pool_call(call)):
                continue
            kind: Kind | None = None
            called = unit.called(call)
            scope = self.scope_of(call)
            if "joblib.delayed" in called:
                kind = _joblib_kind(unit, call)
            elif called & _DATA_PARALLEL:
                kind = Kind.REPLICAS
            elif isinstance(call.func, cst.Attribute):
                kind = _pool_kind(unit, call.func.value, scope)
            if kind is not None:
                yield call, kind, call.args[0].value, scope


def scope_of(unit: Unit, call: cst.Call) -> Scope:
    """The innermost function (or the module) whose text holds ``call``: by the positions the
    program index already has, with no further pass over the tree."""
    prog = unit.program
    at = prog.range(call).start
    best = prog.scopes[MODULE]
    best_start = (0, 0)
    for s in prog.scopes.values():
        if not isinstance(s.node, cst.FunctionDef):
            continue
        r = prog.range(s.node)
        start, end = (r.start.line, r.start.column), (r.end.line, r.end.column)
        if start <= (at.line, at.column) <= end and start > best_start:
            best, best_start = s, start
    return best


def _callee_name(call: cst.Call) -> str:
    f = call.func
    return (
        f.value if isinstance(f, cst.Name) else f.attr.value if isinstance(f, cst.Attribute) else ""
    )


def _local_names(unit: Unit, qualified: frozenset[str]) -> set[str]:
    """The names a call to one of ``qualified`` may be spelled with in this file (its own
    name, or what an import binds it to): a cheap test before asking libcst."""
    out = {q.rsplit(".", 1)[1] for q in qualified}
    for name, origin in unit.program.import_origins.items():
        if origin in qualified:
            out.add(name)
    return out


def _pool_call(call: cst.Call) -> bool:
    f = call.func
    return isinstance(f, cst.Attribute) and f.attr.value in _POOL_METHODS


def _loader_kind(call: cst.Call) -> Kind | None:
    n = argument(call, "num_workers", 5)
    if n is None or (isinstance(n, cst.Integer) and n.evaluated_value == 0):
        return None
    method = argument(call, "worker_method", 99)
    if isinstance(method, cst.SimpleString) and method.evaluated_value == "thread":
        return Kind.LOADER_THREADS
    return Kind.LOADER


def _pool_kind(unit: Unit, recv: cst.BaseExpression, scope: Scope) -> Kind | None:
    values: list[cst.BaseExpression | None] = [recv]
    if isinstance(recv, cst.Name):
        owner = unit.program.binding_scope(scope, recv.value)
        values = list(owner.assigned.get(recv.value, [])) if owner else []
    for v in values:
        if not isinstance(v, cst.Call):
            continue
        called = unit.called(v)
        if called & _THREAD_POOLS:
            return Kind.THREADS
        if called & _PROCESS_POOLS:
            return Kind.PROCESSES
        f = v.func
        if (
            isinstance(f, cst.Attribute)
            and f.attr.value == "Pool"
            and isinstance(f.value, cst.Call)
            and any(q.endswith("multiprocessing.get_context") for q in unit.called(f.value))
        ):
            return Kind.PROCESSES
    return None


def _joblib_kind(unit: Unit, delayed: cst.Call) -> Kind:
    """Threads under ``Parallel(backend="threading")`` or ``prefer="threads"``; processes
    (loky) otherwise."""
    node: cst.CSTNode | None = delayed
    while node is not None:
        node = unit.parent(node)
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Call)):
            continue
        if "joblib.Parallel" not in unit.called(node.func):
            continue
        for a in node.func.args:
            if (
                a.keyword is not None
                and a.keyword.value in ("backend", "prefer")
                and isinstance(a.value, cst.SimpleString)
                and a.value.evaluated_value in ("threading", "threads")
            ):
                return Kind.THREADS
        return Kind.PROCESSES
    return Kind.PROCESSES


def is_dataset(unit: Unit, qual: str, depth: int = 0) -> bool:
    """``qual`` subclasses torch's Dataset or IterableDataset, here or in a project module."""
    node = _class_node(unit, qual)
    if node is None or depth > 4:
        return False
    for base in node.bases:
        names = unit.qualified_names(base.value)
        if names & _DATASETS:
            return True
        for n in names:
            d = project.resolve_dotted(unit, n)
            if (
                d is not None
                and d.cls is not None
                and is_dataset(d.unit, d.cls.qualname, depth + 1)
            ):
                return True
    return False


def _class_node(unit: Unit, qual: str) -> cst.ClassDef | None:
    body: list[cst.BaseStatement] = list(unit.module.body)
    parts = qual.split(".")
    node: cst.ClassDef | None = None
    for part in parts:
        node = next((s for s in body if isinstance(s, cst.ClassDef) and s.name.value == part), None)
        if node is None:
            return None
        inner = node.body
        body = list(inner.body) if isinstance(inner, cst.IndentedBlock) else []
    return node


def entry_methods(unit: Unit, qual: str) -> list[Func]:
    prog = unit.program
    out = []
    for name in _ENTRY_METHODS:
        m = prog.method(qual, name)
        f = func_of(unit, prog.scopes[m]) if m else None
        if f is not None and f not in out:
            out.append(f)
    return out


def class_of(
    unit: Unit, expr: cst.BaseExpression, scope: Scope, depth: int = 0
) -> tuple[Unit, str] | None:
    """The class (local or a project module's) ``expr`` is an instance of, when its
    construction is in sight: ``Aug(...)``, a name bound to one, ``self.ds``."""
    prog = unit.program
    local = prog.type_of(expr, scope)
    if local is not None:
        return unit, local
    if isinstance(expr, cst.Call):
        for q in unit.called(expr):
            d = project.resolve_dotted(unit, q)
            if d is not None and d.cls is not None:
                return d.unit, d.cls.qualname
        return None
    if isinstance(expr, cst.Name) and depth < 3:
        owner = prog.binding_scope(scope, expr.value)
        for v in owner.assigned.get(expr.value, []) if owner else []:
            if v is not None:
                found = class_of(unit, v, owner or scope, depth + 1)
                if found is not None:
                    return found
    return None


def class_callable(unit: Unit, qual: str) -> Func | None:
    """What calling an instance of ``qual`` runs: ``__call__``, or an nn.Module's ``forward``."""
    prog = unit.program
    m = prog.method(qual, "__call__") or prog.method(qual, "forward")
    return func_of(unit, prog.scopes[m]) if m else None


def resolve_ref(unit: Unit, expr: cst.BaseExpression, scope: Scope) -> list[Func]:
    """The functions a callable expression stands for: a lambda, a def (nested, module-level
    or a project module's), ``self.method``, ``functools.partial(f, ..)``, an instance of a
    class with ``__call__``."""
    prog = unit.program
    if isinstance(expr, cst.Lambda):
        return [Func(unit, expr, scope, "<lambda>")]
    if isinstance(expr, cst.Call):
        if "functools.partial" in unit.called(expr) and expr.args:
            return resolve_ref(unit, expr.args[0].value, scope)
        cls = class_of(unit, expr, scope)
        f = class_callable(*cls) if cls else None
        return [f] if f else []
    if isinstance(expr, cst.Name):
        owner = prog.binding_scope(scope, expr.value)
        if owner is not None and owner.qualname != MODULE:
            nested = prog.scopes.get(f"{owner.qualname}.{expr.value}")
            if nested is not None:
                f = func_of(unit, nested)
                return [f] if f else []
            return [
                g
                for v in owner.assigned.get(expr.value, [])
                if isinstance(v, cst.Lambda | cst.Call)
                for g in resolve_ref(unit, v, owner)
            ]
        if owner is not None and expr.value in owner.assigned:
            lambdas = [v for v in owner.assigned[expr.value] if isinstance(v, cst.Lambda)]
            if lambdas:
                return [Func(unit, v, owner, expr.value) for v in lambdas]
    if isinstance(expr, cst.Attribute):
        cls_q = prog.type_of(expr.value, scope)
        if cls_q is not None:
            m = prog.method(cls_q, expr.attr.value)
            f = func_of(unit, prog.scopes[m]) if m else None
            return [f] if f else []
    for q in unit.qualified_names(expr):
        d = project.resolve_dotted(unit, q)
        if d is not None and d.scope is not None:
            f = func_of(d.unit, d.scope)
            return [f] if f else []
        if d is not None and d.cls is not None:
            f = class_callable(d.unit, d.cls.qualname)
            return [f] if f else []
    return []
