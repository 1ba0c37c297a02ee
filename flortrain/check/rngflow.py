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

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst

from flortrain.check import project
from flortrain.check import streams as st
from flortrain.check.reach import attr_values, callees, calls_in, held_values, key_of, reach
from flortrain.check.regions import (
    Func,
    Kind,
    Region,
    Regions,
)
from flortrain.check.unit import Unit
from flortrain.check.worker_init import worker_seeding
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


def where_drawn(unit: Unit, draw: Draw) -> str:
    """Where ``draw`` is, as the RNG rules' messages say it: ``in `f`, which DataLoader workers
    run`` / ``in `g`, which `f` calls in threads``."""
    region = draw.region
    entry = region.entry.name
    name = f"`{draw.func.name}`"
    if draw.func.unit is not unit:
        line = draw.func.unit.where(draw.node)[0]
        name += f" ({os.path.basename(draw.func.unit.path)}:{line})"
    if draw.func.node is region.entry.node:
        return f"in {name}, which {region.kind.value} run"
    return f"in {name}, which `{entry}` calls in {region.kind.value}"


def _join(
    a: dict[str, State], b: dict[str, State], outside: Callable[[str], State]
) -> dict[str, State]:
    """Where branches meet: unsafe on either branch is unsafe, else safe on either is safe
    (ephemeral only if so on both); a key one branch never bound has its state from outside."""
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
        """The states after ``func`` runs from ``env``; its draws are reported at ``anchor``
        (a call in the checked file) or, in the checked file itself, where they are."""
        key = (id(func.node), frozenset(env.items()))
        if key in self._memo:
            return self._memo[key]
        if id(func.node) in self.stack or len(self.stack) > 12:
            return env
        self.stack.append(id(func.node))
        walk = _Walk(self, func, anchor)
        if isinstance(func.node, cst.Lambda):
            out = dict(env)
            walk.expr(func.node.body, out)
        else:
            out = walk.block(_stmts(func.node.body), dict(env))
        self.stack.pop()
        self._memo[key] = out
        return out


class _Walk:
    """One function's statements in execution order: each compound statement's branches are
    walked from the same states and joined where they meet."""

    def __init__(self, flow: _Flow, func: Func, anchor: cst.CSTNode | None) -> None:
        self.flow, self.func, self.anchor = flow, func, anchor

    def outside(self, key: str) -> State:
        return self.flow.outside(self.func, key)

    def state(self, key: str, env: dict[str, State]) -> State:
        return env[key] if key in env else self.outside(key)

    def block(self, stmts: Sequence[cst.CSTNode], env: dict[str, State]) -> dict[str, State]:
        for s in stmts:
            env = self.stmt(s, env)
        return env

    def suite(self, suite: cst.BaseSuite, env: dict[str, State]) -> dict[str, State]:
        return self.block(_stmts(suite), env)

    def stmt(self, s: cst.CSTNode, env: dict[str, State]) -> dict[str, State]:
        if isinstance(s, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            for small in s.body:
                self.small(small, env)
            return env
        if isinstance(s, cst.FunctionDef | cst.ClassDef):
            return env
        if isinstance(s, cst.If):
            return self.if_(s, env)
        if isinstance(s, cst.For | cst.While):
            return self.loop(s, env)
        if isinstance(s, cst.With):
            for item in s.items:
                self.expr(item.item, env)
                if item.asname is not None:
                    self.bind(item.asname.name, None, env)
            return self.suite(s.body, env)
        if isinstance(s, cst.Try | cst.TryStar):
            return self.try_(s, env)
        if isinstance(s, cst.Match):
            self.expr(s.subject, env)
            out = dict(env)
            for case in s.cases:
                out = _join(out, self.suite(case.body, dict(env)), self.outside)
            return out
        self.expr(s, env)
        return env

    def if_(self, s: cst.If, env: dict[str, State]) -> dict[str, State]:
        self.expr(s.test, env)
        a = self.suite(s.body, dict(env))
        b = dict(env)
        if isinstance(s.orelse, cst.If):
            b = self.stmt(s.orelse, b)
        elif isinstance(s.orelse, cst.Else):
            b = self.suite(s.orelse.body, b)
        return _join(a, b, self.outside)

    def loop(self, s: cst.For | cst.While, env: dict[str, State]) -> dict[str, State]:
        self.expr(s.iter if isinstance(s, cst.For) else s.test, env)
        if isinstance(s, cst.For):
            self.bind(s.target, None, env)
        body = self.suite(s.body, dict(env))
        env = _join(env, body, self.outside)
        if s.orelse is not None:
            env = self.suite(s.orelse.body, env)
        return env

    def try_(self, s: cst.Try | cst.TryStar, env: dict[str, State]) -> dict[str, State]:
        body = self.suite(s.body, dict(env))
        start = _join(env, body, self.outside)
        out = body
        if s.orelse is not None:
            out = self.suite(s.orelse.body, out)
        for h in s.handlers:
            out = _join(out, self.suite(h.body, dict(start)), self.outside)
        if s.finalbody is not None:
            out = self.suite(s.finalbody.body, out)
        return out

    def small(self, s: cst.BaseSmallStatement, env: dict[str, State]) -> None:
        if isinstance(s, cst.Assign):
            self.expr(s.value, env)
            for t in s.targets:
                self.bind(t.target, s.value, env)
        elif isinstance(s, cst.AnnAssign) and s.value is not None:
            self.expr(s.value, env)
            self.bind(s.target, s.value, env)
        else:
            self.expr(s, env)

    def bind(
        self, target: cst.BaseExpression, value: cst.BaseExpression | None, env: dict[str, State]
    ) -> None:
        func = self.func
        key = key_of(func, target)
        if key is None:
            if isinstance(target, cst.Tuple | cst.List):
                for el in target.elements:
                    self.bind(el.value, None, env)
            return
        if value is not None and st.creator(func.unit, value):
            env[key] = Safe(True)
            return
        ref = key_of(func, value) if value is not None else None
        if ref is not None:
            s = self.state(ref, env)
            if not isinstance(s, _NotGen):
                env[key] = s
                return
        env[key] = NOTGEN

    def expr(self, node: cst.CSTNode, env: dict[str, State]) -> None:
        for call in calls_in(self.func.unit, node):
            self.call(call, env)

    def use(self, key: str, node: cst.CSTNode, env: dict[str, State]) -> None:
        s = self.state(key, env)
        if isinstance(s, Origin | Safe):
            flow = self.flow
            flow.draws.append(Draw(flow.region, self.func, node, self.anchor or node, key, s))

    def call(self, call: cst.Call, env: dict[str, State]) -> None:
        func = self.func
        unit = func.unit
        gen = next(
            (a.value for a in call.args if a.keyword and a.keyword.value == "generator"), None
        )
        if gen is not None:
            gkey = key_of(func, gen)
            if gkey is not None:
                self.use(gkey, call, env)
            return
        stream = st.global_draw(unit, call)
        if stream is not None:
            self.use(stream, call, env)
            return
        seeded = st.seeded_stream(unit, call)
        if seeded is not None:
            if not (self.flow.region.kind.threaded and seeded != st.CV2):
                env[seeded] = Safe(True)
            return
        f = call.func
        if isinstance(f, cst.Attribute):
            m = f.attr.value
            if m in st.TENSOR_DRAWS:
                self.use(st.TORCH, call, env)
                return
            rkey = key_of(func, f.value)
            if rkey is not None and (m in st.GENERATOR_DRAWS or m in st.RESEEDS):
                s = self.state(rkey, env)
                if not isinstance(s, _NotGen):
                    if m in st.RESEEDS:
                        if not self.flow.region.kind.threaded:
                            env[rkey] = Safe(True)
                    else:
                        self.use(rkey, call, env)
                    return
            if m.startswith("augment") and self.holds(f.value, st.imgaug_object):
                self.use(st.IMGAUG, call, env)
                return
        if self.holds(f, st.imgaug_object):
            self.use(st.IMGAUG, call, env)
            return
        if self.holds(f, st.random_transform):
            self.use(st.TORCH, call, env)
        self.follow(call, env)

    def holds(
        self, expr: cst.BaseExpression, pred: Callable[[Unit, cst.BaseExpression], bool]
    ) -> bool:
        """``expr`` (a name or ``self.attr``) holds an object ``pred`` recognizes."""
        values = held_values(self.flow.regions, self.func, expr)
        return any(pred(unit, value) for unit, value in values)

    def follow(self, call: cst.Call, env: dict[str, State]) -> None:
        func, flow = self.func, self.flow
        for target, binding, same_self in callees(flow.regions, func, call):
            callee_env: dict[str, State] = {k: v for k, v in env.items() if k.startswith("<")}
            if same_self:
                callee_env.update((k, v) for k, v in env.items() if k.startswith("self."))
            for p, arg in binding.items():
                if st.creator(func.unit, arg):
                    callee_env[p] = Safe(True)
                elif (k := key_of(func, arg)) is not None:
                    s = self.state(k, env)
                    if not isinstance(s, _NotGen):
                        callee_env[p] = s
            here = self.anchor
            if here is None and target.unit is not flow.home:
                here = call
            out = flow.run(target, callee_env, here)
            for k, v in out.items():
                if k.startswith("<") or (same_self and k.startswith("self.")):
                    env[k] = v


def _stmts(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    if isinstance(suite, cst.IndentedBlock):
        return suite.body
    return [suite]


def flow_draws(regions: Regions, chosen: Sequence[Region]) -> list[Draw]:
    """Every draw in the ``chosen`` regions of the file ``regions`` describes, with its state
    there (``flortrain record --deterministic`` asks of more regions than the check reports)."""
    visited = reach(regions, [r.entry for r in chosen])
    draws: list[Draw] = []
    for region in chosen:
        flow = _Flow(regions, region, visited)
        env = _initial(region, regions.unit.config.torch_version)
        if region.loader is not None:
            for init in region.loader.init_fns:
                seeded, attrs = worker_seeding(regions, init, region.dataset)
                env.update((k, Safe(False)) for k in seeded)
                flow.reseeded_attrs |= attrs
        flow.run(region.entry, env, region.anchor)
        draws.extend(flow.draws)
    return draws


class Analysis:
    """Every draw in the checked file's regions, with its state there."""

    def __init__(self, unit: Unit) -> None:
        self.regions = Regions(unit)
        self.draws: list[Draw] = flow_draws(self.regions, self.regions.all)


_CACHE: weakref.WeakKeyDictionary[Unit, Analysis] = weakref.WeakKeyDictionary()


def analysis(unit: Unit) -> Analysis:
    """The file's analysis, shared by the rules that ask for it."""
    if unit not in _CACHE:
        _CACHE[unit] = Analysis(unit)
    return _CACHE[unit]
