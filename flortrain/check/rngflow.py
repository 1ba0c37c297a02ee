"""DETrain's RNG-safety analysis (Section 3.3, Table 1) over a file's data-parallel regions.

A flow-sensitive pass over the statements of each region's functions, following calls into
methods, module functions, callables kept on ``self`` and project modules. The state maps each
generator (a name, ``self.attr``, or a global stream ``<numpy>``) to whether it is safe here:

- PARALLEL_REGION: on entry every generator created outside the region is unsafe (an
  :class:`Origin` says where it was made); a global stream's state depends on how the region
  runs (DataLoader worker processes reseed python's, torch's and numpy's streams, threads share
  all of them).
- RANDOM_CREATE: ``g = default_rng(idx)`` (or reseeding: ``np.random.seed``, ``g.seed``) makes
  ``g`` safe after that statement.
- RANDOM_USE: a draw from an unsafe generator is a :class:`Draw` with that origin.
- DEFAULT: states flow through other statements; where branches meet, a generator is safe only
  if it is safe on every branch.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from flortrain.check import project
from flortrain.check import streams as st
from flortrain.check.regions import (
    Func,
    Kind,
    Region,
    Regions,
    class_callable,
    class_of,
    func_of,
    scope_of,
)
from flortrain.check.unit import Unit
from flortrain.static.arguments import bind_params
from flortrain.static.program import MODULE


@dataclass(frozen=True)
class Origin:
    """Unsafe in the region: a generator made outside it (``path``, ``line``, ``what``), or a
    global stream the region's copies share or repeat (``reason``)."""

    path: str = ""
    line: int = 0
    what: str = ""
    reason: str = ""

    def where(self, unit: Unit) -> str:
        if self.path == unit.path:
            return f"line {self.line}"
        import os

        return f"{os.path.basename(self.path)}:{self.line}"


@dataclass(frozen=True)
class Safe:
    """Safe in the region; ``ephemeral``: made during this very call (its draws depend on the
    call's arguments only), otherwise it persists from call to call inside the worker."""

    ephemeral: bool


class _NotGen:
    pass


NOTGEN = _NotGen()
State = Origin | Safe | _NotGen


@dataclass(frozen=True)
class Draw:
    region: Region
    func: Func  # the function the draw is in
    node: cst.CSTNode  # the draw, in ``func.unit``
    anchor: cst.CSTNode  # where the checked file reports it
    key: str
    state: Origin | Safe


def _join(a: dict[str, State], b: dict[str, State], outside: _Lookup) -> dict[str, State]:
    out: dict[str, State] = {}
    for k in a.keys() | b.keys():
        va = a[k] if k in a else outside(k)
        vb = b[k] if k in b else outside(k)
        if isinstance(va, Origin):
            out[k] = va
        elif isinstance(vb, Origin):
            out[k] = vb
        elif isinstance(va, Safe) and isinstance(vb, Safe):
            out[k] = Safe(va.ephemeral and vb.ephemeral)
        elif isinstance(va, Safe) or isinstance(vb, Safe):
            out[k] = va if isinstance(va, Safe) else vb
        else:
            out[k] = NOTGEN
    return out


class _Lookup:
    def __init__(self, flow: _Flow, func: Func) -> None:
        self.flow, self.func = flow, func

    def __call__(self, key: str) -> State:
        return self.flow.outside(self.func, key)


_WORKER_STATES = {
    Kind.LOADER: "torch does not reseed it per worker, so every worker starts from the same state",
    Kind.LOADER_THREADS: "the worker threads share it, so each draw depends on thread timing",
    Kind.PROCESSES: "each worker process starts it from a copy of this process's state (or"
    " from fresh entropy), so draws repeat across workers or differ run to run",
    Kind.THREADS: "threads share it, so each draw depends on thread timing",
    Kind.REPLICAS: "the replicas' threads share it, so each draw depends on thread timing",
}


def _initial(region: Region, torch_version: str) -> dict[str, State]:
    kind = region.kind
    shared = Origin(reason=_WORKER_STATES[kind])
    env: dict[str, State] = {k: shared for k in st.STREAM_NAMES}
    if kind is Kind.LOADER:
        env[st.PYTHON] = env[st.TORCH] = Safe(False)
        if version(torch_version) >= (1, 9):
            env[st.NUMPY] = Safe(False)
        else:
            env[st.NUMPY] = Origin(
                reason="torch < 1.9 does not reseed numpy's stream per worker, so every worker"
                " draws the same numbers"
            )
    if kind is Kind.PROCESSES:
        env[st.PYTHON] = Origin(
            reason="python reseeds it from OS entropy in each forked worker, so draws differ run"
            " to run"
        )
    if kind is Kind.REPLICAS:
        env[st.TORCH] = Safe(False)  # each device's replica draws from that device's stream
    if kind in (Kind.THREADS, Kind.LOADER_THREADS, Kind.REPLICAS):
        env[st.CV2] = Origin(reason="OpenCV starts every thread from the same state")
    return env


def version(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


class _Flow:
    def __init__(self, regions: Regions, region: Region, visited: set[int]) -> None:
        self.regions = regions
        self.home = regions.unit
        self.region = region
        self.visited = visited
        self.draws: list[Draw] = []
        self._memo: dict[tuple[int, frozenset[tuple[str, State]]], dict[str, State]] = {}
        self.reseeded_attrs: set[str] = set()
        self.stack: list[int] = []

    # -- outside the region: where a generator this function sees was made --------------
    def outside(self, func: Func, key: str) -> State:
        if key.startswith("<"):
            return NOTGEN
        root, _, attr = key.partition(".")
        if root == "self" and attr and "." not in attr:
            return self.attr_state(func, attr)
        if attr or func.is_local(root):
            return NOTGEN
        unit, prog = func.unit, func.unit.program
        owner = prog.binding_scope(func.scope, root)
        if owner is None:
            return NOTGEN
        values = owner.assigned.get(root, [])
        if owner.qualname == MODULE and root in prog.imported:
            unit, values = project.module_global(unit, root)
        return self._origin(unit, id(owner.node), values)

    def _origin(self, unit: Unit, where: int, values: Sequence[cst.CSTNode | None]) -> State:
        for v in values:
            if isinstance(v, cst.BaseExpression) and (what := st.creator(unit, v)):
                if where in self.visited:
                    return Safe(False)
                return Origin(unit.path, unit.where(v)[0], what)
        return NOTGEN

    def attr_state(self, func: Func, attr: str) -> State:
        if func.scope.cls is None:
            return NOTGEN
        if attr in self.reseeded_attrs:
            return Safe(False)
        kept = False
        for unit, where, value in attr_values(self.regions, func.unit, func.scope.cls, attr):
            s = self._origin(unit, where, [value])
            if isinstance(s, Origin):
                return s
            kept = kept or isinstance(s, Safe)
        return Safe(False) if kept else NOTGEN

    # -- the pass ------------------------------------------------------------------------
    def run(
        self, func: Func, env: dict[str, State], anchor: cst.CSTNode | None
    ) -> dict[str, State]:
        key = (id(func.node), frozenset(env.items()))
        if key in self._memo:
            return self._memo[key]
        if id(func.node) in self.stack or len(self.stack) > 12:
            return env
        self.stack.append(id(func.node))
        look = _Lookup(self, func)
        if isinstance(func.node, cst.Lambda):
            out = dict(env)
            self._expr(func, func.node.body, out, anchor)
        else:
            out = self._block(func, _stmts(func.node.body), dict(env), anchor, look)
        self.stack.pop()
        self._memo[key] = out
        return out

    def _block(
        self,
        func: Func,
        stmts: Sequence[cst.CSTNode],
        env: dict[str, State],
        anchor: cst.CSTNode | None,
        look: _Lookup,
    ) -> dict[str, State]:
        for s in stmts:
            env = self._stmt(func, s, env, anchor, look)
        return env

    def _stmt(
        self,
        func: Func,
        s: cst.CSTNode,
        env: dict[str, State],
        anchor: cst.CSTNode | None,
        look: _Lookup,
    ) -> dict[str, State]:
        blk = self._block
        if isinstance(s, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            for small in s.body:
                self._small(func, small, env, anchor)
            return env
        if isinstance(s, cst.If):
            self._expr(func, s.test, env, anchor)
            a = blk(func, _stmts(s.body), dict(env), anchor, look)
            b = dict(env)
            if isinstance(s.orelse, cst.If):
                b = self._stmt(func, s.orelse, b, anchor, look)
            elif isinstance(s.orelse, cst.Else):
                b = blk(func, _stmts(s.orelse.body), b, anchor, look)
            return _join(a, b, look)
        if isinstance(s, cst.For | cst.While):
            self._expr(func, s.iter if isinstance(s, cst.For) else s.test, env, anchor)
            if isinstance(s, cst.For):
                self._bind(func, s.target, None, env)
            body = blk(func, _stmts(s.body), dict(env), anchor, look)
            env = _join(env, body, look)
            if s.orelse is not None:
                env = blk(func, _stmts(s.orelse.body), env, anchor, look)
            return env
        if isinstance(s, cst.With):
            for item in s.items:
                self._expr(func, item.item, env, anchor)
                if item.asname is not None:
                    self._bind(func, item.asname.name, None, env)
            return blk(func, _stmts(s.body), env, anchor, look)
        if isinstance(s, cst.Try | cst.TryStar):
            body = blk(func, _stmts(s.body), dict(env), anchor, look)
            start = _join(env, body, look)
            out = body
            if s.orelse is not None:
                out = blk(func, _stmts(s.orelse.body), out, anchor, look)
            for h in s.handlers:
                out = _join(out, blk(func, _stmts(h.body), dict(start), anchor, look), look)
            if s.finalbody is not None:
                out = blk(func, _stmts(s.finalbody.body), out, anchor, look)
            return out
        if isinstance(s, cst.FunctionDef | cst.ClassDef):
            return env
        if isinstance(s, cst.Match):
            self._expr(func, s.subject, env, anchor)
            out = dict(env)
            for case in s.cases:
                out = _join(out, blk(func, _stmts(case.body), dict(env), anchor, look), look)
            return out
        self._expr(func, s, env, anchor)
        return env

    def _small(
        self,
        func: Func,
        s: cst.BaseSmallStatement,
        env: dict[str, State],
        anchor: cst.CSTNode | None,
    ) -> None:
        if isinstance(s, cst.Assign):
            self._expr(func, s.value, env, anchor)
            for t in s.targets:
                self._bind(func, t.target, s.value, env)
        elif isinstance(s, cst.AnnAssign) and s.value is not None:
            self._expr(func, s.value, env, anchor)
            self._bind(func, s.target, s.value, env)
        else:
            self._expr(func, s, env, anchor)

    def _bind(
        self,
        func: Func,
        target: cst.BaseExpression,
        value: cst.BaseExpression | None,
        env: dict[str, State],
    ) -> None:
        key = key_of(func, target)
        if key is None:
            if isinstance(target, cst.Tuple | cst.List):
                for el in target.elements:
                    self._bind(func, el.value, None, env)
            return
        if value is not None and st.creator(func.unit, value):
            env[key] = Safe(True)
            return
        ref = key_of(func, value) if value is not None else None
        if ref is not None:
            s = self.state(func, ref, env)
            if not isinstance(s, _NotGen):
                env[key] = s
                return
        env[key] = NOTGEN

    def state(self, func: Func, key: str, env: dict[str, State]) -> State:
        return env[key] if key in env else self.outside(func, key)

    def _expr(
        self, func: Func, node: cst.CSTNode, env: dict[str, State], anchor: cst.CSTNode | None
    ) -> None:
        for call in calls_in(func.unit, node):
            self._call(func, call, env, anchor)

    def _use(
        self,
        func: Func,
        key: str,
        node: cst.CSTNode,
        env: dict[str, State],
        anchor: cst.CSTNode | None,
    ) -> None:
        s = self.state(func, key, env)
        if isinstance(s, Origin | Safe):
            self.draws.append(Draw(self.region, func, node, anchor or node, key, s))

    def _call(
        self, func: Func, call: cst.Call, env: dict[str, State], anchor: cst.CSTNode | None
    ) -> None:
        unit = func.unit
        gen = next(
            (a.value for a in call.args if a.keyword and a.keyword.value == "generator"), None
        )
        if gen is not None:
            gkey = key_of(func, gen)
            if gkey is not None:
                self._use(func, gkey, call, env, anchor)
            return
        stream = st.global_draw(unit, call)
        if stream is not None:
            self._use(func, stream, call, env, anchor)
            return
        seeded = st.seeded_stream(unit, call)
        if seeded is not None:
            if not (self.region.kind.threaded and seeded != st.CV2):
                env[seeded] = Safe(True)
            return
        f = call.func
        if isinstance(f, cst.Attribute):
            m = f.attr.value
            if m in st.TENSOR_DRAWS:
                self._use(func, st.TORCH, call, env, anchor)
                return
            rkey = key_of(func, f.value)
            if rkey is not None and (m in st.GENERATOR_DRAWS or m in st.RESEEDS):
                s = self.state(func, rkey, env)
                if not isinstance(s, _NotGen):
                    if m in st.RESEEDS:
                        if not self.region.kind.threaded:
                            env[rkey] = Safe(True)
                    else:
                        self._use(func, rkey, call, env, anchor)
                    return
            if m.startswith("augment") and self._holds(func, f.value, st.imgaug_object):
                self._use(func, st.IMGAUG, call, env, anchor)
                return
        if self._holds(func, f, st.imgaug_object):
            self._use(func, st.IMGAUG, call, env, anchor)
            return
        if self._holds(func, f, st.random_transform):
            self._use(func, st.TORCH, call, env, anchor)
        self._follow(func, call, env, anchor)

    def _holds(self, func: Func, expr: cst.BaseExpression, pred: object) -> bool:
        """``expr`` (a name or ``self.attr``) holds an object ``pred`` recognizes."""
        assert callable(pred)
        return any(pred(unit, value) for unit, value in held_values(self.regions, func, expr))

    def _follow(
        self, func: Func, call: cst.Call, env: dict[str, State], anchor: cst.CSTNode | None
    ) -> None:
        for target, binding, same_self in callees(self.regions, func, call):
            callee_env: dict[str, State] = {k: v for k, v in env.items() if k.startswith("<")}
            if same_self:
                callee_env.update((k, v) for k, v in env.items() if k.startswith("self."))
            for p, arg in binding.items():
                if st.creator(func.unit, arg):
                    callee_env[p] = Safe(True)
                elif (k := key_of(func, arg)) is not None:
                    s = self.state(func, k, env)
                    if not isinstance(s, _NotGen):
                        callee_env[p] = s
            here = anchor
            if here is None and target.unit is not self.home:
                here = call
            out = self.run(target, callee_env, here)
            for k, v in out.items():
                if k.startswith("<") or (same_self and k.startswith("self.")):
                    env[k] = v


def key_of(func: Func, expr: cst.BaseExpression | None) -> str | None:
    """The generator key of a name or attribute chain (the method's own first parameter is
    ``self``), or None."""
    if isinstance(expr, cst.Name):
        return "self" if expr.value == func.self_param else expr.value
    if isinstance(expr, cst.Attribute):
        inner = key_of(func, expr.value)
        return None if inner is None else f"{inner}.{expr.attr.value}"
    return None


def _stmts(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    if isinstance(suite, cst.IndentedBlock):
        return suite.body
    return [suite]


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


class Analysis:
    """Every draw in the checked file's regions, with its state there."""

    def __init__(self, unit: Unit) -> None:
        self.regions = Regions(unit)
        entries = [r.entry for r in self.regions.all]
        visited = reach(self.regions, entries)
        self.draws: list[Draw] = []
        for region in self.regions.all:
            flow = _Flow(self.regions, region, visited)
            env = _initial(region, unit.config.torch_version)
            if region.loader is not None:
                for init in region.loader.init_fns:
                    seeded, attrs = worker_seeding(self.regions, init, region.dataset)
                    env.update((k, Safe(False)) for k in seeded)
                    flow.reseeded_attrs |= attrs
            flow.run(region.entry, env, region.anchor)
            self.draws.extend(flow.draws)


def worker_seeding(
    regions: Regions, init: Func, dataset: tuple[Unit, str] | None = None
) -> tuple[set[str], set[str]]:
    """What a ``worker_init_fn`` reseeds in each worker: global streams, and attributes of the
    worker's dataset (``get_worker_info().dataset.rng = default_rng(..)``, or a method of the
    dataset that does it: ``info.dataset.reseed(info.seed)``)."""
    streams: set[str] = set()
    attrs: set[str] = set()
    for f in [init, *_local_callees(regions, init)]:
        for call in calls_in(f.unit, f.node.body):
            s = st.seeded_stream(f.unit, call)
            if s is not None:
                streams.add(s)
            fn = call.func
            if not isinstance(fn, cst.Attribute):
                continue
            k = key_of(f, fn.value)
            if k is None or ".dataset" not in f".{k}":
                continue
            if fn.attr.value in st.RESEEDS and ".dataset." in f".{k}":
                attrs.add(k.rsplit(".", 1)[-1])
            elif k.endswith("dataset") and dataset is not None:
                attrs |= _created_by(dataset, fn.attr.value)
        for node in _assigns(f.node.body):
            for t in node.targets:
                k = key_of(f, t.target)
                if k is not None and ".dataset." in f".{k}" and st.creator(f.unit, node.value):
                    attrs.add(k.rsplit(".", 1)[-1])
    return streams, attrs


def _created_by(dataset: tuple[Unit, str], method: str) -> set[str]:
    """The attributes a dataset method gives a new generator (or reseeds)."""
    unit, cls = dataset
    prog = unit.program
    qual = prog.method(cls, method)
    if qual is None:
        return set()
    out = set()
    for info in (prog.classes.get(c) for c in [cls, *prog.classes[cls].bases]):
        for attr, assigned in info.attr_assigned.items() if info else ():
            if any(m == qual and v is not None and st.creator(unit, v) for m, v in assigned):
                out.add(attr)
    node = prog.scopes[qual].node
    for call in calls_in(unit, node.body) if isinstance(node, cst.FunctionDef) else ():
        fn = call.func
        if isinstance(fn, cst.Attribute) and fn.attr.value in st.RESEEDS:
            r = fn.value
            if isinstance(r, cst.Attribute) and isinstance(r.value, cst.Name):
                out.add(r.attr.value)
    return out


def _local_callees(regions: Regions, f: Func) -> list[Func]:
    return [t for c in calls_in(f.unit, f.node.body) for t, _, _ in callees(regions, f, c)]


def _assigns(node: cst.CSTNode) -> list[cst.Assign]:
    out: list[cst.Assign] = []

    class _V(cst.CSTVisitor):
        def visit_Assign(self, n: cst.Assign) -> None:
            out.append(n)

    node.visit(_V())
    return out


_CACHE: weakref.WeakKeyDictionary[Unit, Analysis] = weakref.WeakKeyDictionary()


def analysis(unit: Unit) -> Analysis:
    """The file's analysis, shared by the rules that ask for it."""
    if unit not in _CACHE:
        _CACHE[unit] = Analysis(unit)
    return _CACHE[unit]
