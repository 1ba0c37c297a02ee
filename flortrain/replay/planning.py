"""The replay plan: which memoized blocks must execute for the probes to see what they would
have seen, and an estimate of the replay's cost from the record's measured block times.

- a probe inside a memoized loop, or in a function that loop reaches, makes that block execute;
- a probe that reads a name bound only inside a memoized loop of the same function (``loss`` of
  the last batch) makes that block execute, since its checkpoint does not hold that name;
- every other block instance with a checkpoint is skipped and restored (partial replay);
- a loop a probe runs (``print(evaluate(train_data))``) executes inside the probe, isolated, and
  takes no instance of the record: the script's own call after the probe still gets its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from flortrain.replay.observation import callee
from flortrain.replay.plan import ReplayPlan
from flortrain.replay.probes import Probe, ProbeSet
from flortrain.replay.probestate import carried_by_probes, walk
from flortrain.static.plan import Block, FastForward, Guard, Instrumentation, MainLoop, Plan
from flortrain.static.program import MODULE
from flortrain.static.spans import probe_guard, read_before_bound
from flortrain.static.values import reads_only_values


def _ancestors(node: cst.CSTNode, parents: Any) -> Iterator[cst.CSTNode]:
    while node in parents:
        node = parents[node]
        yield node


def _names_read(node: cst.CSTNode) -> set[str]:
    """Free names a probe reads: not attribute names, not its own comprehension/lambda variables."""
    out: set[str] = set()
    own: set[str] = set()

    def targets(n: cst.CSTNode) -> None:
        if isinstance(n, cst.Name):
            own.add(n.value)
        for c in n.children:
            targets(c)

    def walk(n: cst.CSTNode) -> None:
        if isinstance(n, cst.Name):
            out.add(n.value)
        if isinstance(n, cst.Attribute):
            walk(n.value)
            return
        if isinstance(n, cst.CompFor):
            targets(n.target)
        if isinstance(n, cst.Lambda):
            for p in n.params.params:
                own.add(p.name.value)
        for c in n.children:
            walk(c)

    walk(node)
    return out - own


def _names_called(node: cst.CSTNode) -> set[str]:
    """Functions and methods a probe calls, by name (``evaluate`` of ``evaluate(val)`` and of
    ``self.evaluate(val)``): the script's loops in them run inside the probe."""
    out: set[str] = set()

    def walk(n: cst.CSTNode) -> None:
        if isinstance(n, cst.Call) and (name := callee(n)) is not None:
            out.add(name)
        for c in n.children:
            walk(c)

    walk(node)
    return out


def _why_execute(p: Probe, function: str, reads: set[str], b: Block) -> str | None:
    """Why probe ``p`` (in ``function``, reading ``reads``) makes block ``b`` execute, or None:
    it is in a function the block calls, or it reads what only the block binds, or a tensor
    its checkpoints hold without its autograd graph."""
    if function != MODULE and function in b.reaches:
        return f"probe at line {p.line} is in {function}(), which it calls"
    held = {c.expr.split(".")[0] for c in b.changeset}
    if function != MODULE and b.function == MODULE:
        # a function may read the module's names as globals, whenever it is called
        read = sorted((reads & set(b.bound)) - held)
        if read:
            return f"probe at line {p.line} in {function}() may read `{read[0]}`, which only this loop binds"
        return None
    if b.function != function:
        return None
    tensors = sorted(v for v in b.values if v in reads and not reads_only_values(p.node, v))
    if tensors:
        return (
            f"probe at line {p.line} reads `{tensors[0]}` as a tensor; its checkpoints hold it"
            " without its autograd graph"
        )
    only_inside = sorted((reads & set(b.bound)) - held)
    if only_inside:
        return f"probe at line {p.line} reads `{only_inside[0]}`, which only this loop binds"
    return None


def plan_replay(plan: Plan, probes: ProbeSet) -> ReplayPlan:
    """Which blocks the probes make execute, which run inside a probe, and per main loop the
    guards that let iterations be jumped over (or why they cannot be)."""
    current = probes.current
    parents = current.wrapper.resolve(ParentNodeProvider)
    pos = current.wrapper.resolve(PositionProvider)
    to_cur = probes.line_map
    blocks_at: dict[int, Block] = {to_cur[b.span.line]: b for b in plan.blocks}
    mains_at: dict[int, MainLoop] = {to_cur[m.span.line]: m for m in plan.main_loops}
    execute: dict[str, str] = {}
    in_probes: dict[str, str] = {}
    for p in probes.probes:
        function = MODULE
        enclosing: list[str] = []
        for anc in _ancestors(p.node, parents):
            if isinstance(anc, cst.For | cst.While):
                b = blocks_at.get(pos[anc].start.line)
                if b is not None:
                    enclosing.append(b.id)
            if isinstance(anc, cst.FunctionDef) and function == MODULE:
                function = _qualname(anc, parents)
        for bid in enclosing:
            execute.setdefault(bid, f"probe at line {p.line} is inside it")
        for name in sorted(_names_called(p.node)):
            for b in plan.blocks:
                if b.function.rsplit(".", 1)[-1] == name:
                    in_probes.setdefault(b.id, f"at line {p.line} (it calls {name}())")
        reads = _names_read(p.node)
        for b in plan.blocks:
            if b.id not in execute and (why := _why_execute(p, function, reads, b)):
                execute[b.id] = why
    inst = Instrumentation(
        blocks=blocks_at,
        mains=mains_at,
        probes={p.line: p.number for p in probes.probes},
        forward=_forward_at(plan, probes),
    )
    spans, no_spans, unresumable = _span_guards(probes, mains_at, parents, pos)
    main_nodes = [
        (n, mains_at[pos[n].start.line])
        for n in walk(current.module)
        if isinstance(n, cst.For | cst.While) and pos[n].start.line in mains_at
    ]
    carried = carried_by_probes(probes, main_nodes, parents, lambda n: int(pos[n].start.line))
    return ReplayPlan(
        inst, execute, len(probes.probes), in_probes, spans, no_spans, unresumable, carried
    )


def _forward_at(plan: Plan, probes: ProbeSet) -> dict[int, tuple[str, FastForward]]:
    """The recorded plan's fast-forward statements at their lines in the current file, less
    those a probe is inside or reads a name of: a probe in a worker's first iteration may read
    what the last iteration before its segment bound."""
    to_cur = probes.line_map
    reads: set[str] = set()
    for p in probes.probes:
        reads |= _names_read(p.node)
    out: dict[int, tuple[str, FastForward]] = {}
    for m in plan.main_loops:
        for f in m.fast_forward:
            start, end = to_cur.get(f.line), to_cur.get(f.end_line)
            if start is None or end is None or set(f.binds) & reads:
                continue
            if any(start <= p.line <= end for p in probes.probes):
                continue
            out[start] = (m.id, f)
    return out


def _span_guards(
    probes: ProbeSet, mains_at: dict[int, MainLoop], parents: Any, pos: Any
) -> tuple[dict[str, list[Guard]], dict[str, str], dict[str, str]]:
    """Per main loop, the guards of the probes in its body (iteration spans), or why every
    iteration must run: it has no boundary state, or a probe in it cannot be told off a run.
    Third, the main loops whose boundary checkpoints cannot resume a run at all (no boundary
    state, or a probe reads what they do not hold): a subset of the second."""
    unresumable = {
        m.id: f"no boundary state ({m.no_boundary})"
        for m in mains_at.values()
        if m.boundary is None
    }
    if not probes.probes:
        # nothing to look at: the replay re-runs what it must to check the record, and prints it
        return {}, {}, unresumable
    module = probes.current.module
    no_spans = dict(unresumable)
    spans: dict[str, list[Guard]] = {m.id: [] for m in mains_at.values() if m.boundary is not None}
    text = module.code
    rebindable = (
        {
            n.name.value
            for node in walk(module)
            if isinstance(node, cst.Global | cst.Nonlocal)
            for n in node.names
        }
        if "global" in text or "nonlocal" in text
        else set()
    )

    def line(node: cst.CSTNode) -> int:
        return int(pos[node].start.line)

    main_nodes = [
        (n, mains_at[line(n)])
        for n in walk(module)
        if isinstance(n, cst.For | cst.While) and line(n) in mains_at
    ]

    def refuse(main_id: str, why: str) -> None:
        spans.pop(main_id, None)
        no_spans.setdefault(main_id, why)

    for p in probes.probes:
        chain = list(_ancestors(p.node, parents))
        loops = [(i, a) for i, a in enumerate(chain) if isinstance(a, cst.For | cst.While)]
        fn = next(
            (i for i, a in enumerate(chain) if isinstance(a, cst.FunctionDef | cst.Lambda)), None
        )
        mains = [(i, mains_at[line(a)]) for i, a in loops if line(a) in mains_at]
        if fn is not None and (not mains or fn < mains[0][0]):
            for m in mains_at.values():
                refuse(
                    m.id,
                    f"the probe at line {p.line} is inside a function, which any iteration may call",
                )
            continue
        reads = _names_read(p.node)
        inside = mains[0][1].id if mains else None
        for node, m in ((n, m) for n, m in main_nodes if m.boundary is not None):
            why = _unheld_read(p, reads, m, node if m.id == inside else None)
            if why:
                refuse(m.id, f"the probe at line {p.line} {why}")
                unresumable.setdefault(m.id, f"the probe at line {p.line} {why}")
        if not mains:
            continue  # before or after the main loop: it sees the state the loop leaves
        at, main = mains[0]
        if main.boundary is None:
            continue
        loop = chain[at]
        assert isinstance(loop, cst.For | cst.While)
        guard = probe_guard(p.node, chain[: at + 1], loop, main.boundary, line, module, rebindable)
        if isinstance(guard, str):
            refuse(main.id, f"the probe at line {p.line} cannot be told off a run: {guard}")
        elif main.id in spans:
            spans[main.id].append(guard)
    return spans, no_spans, unresumable


def _unheld_read(
    p: Probe, reads: set[str], main: MainLoop, loop: cst.For | cst.While | None
) -> str | None:
    """Why a probe's reads defeat jumping ``main``: it reads a name the loop binds that the
    boundary checkpoints do not hold (``val`` bound only every third epoch), or a name they hold
    detached as a tensor. ``loop`` is the main loop's node when the probe is in its body (a name
    bound earlier in the same iteration is then fine); a probe elsewhere sees what it leaves."""
    b = main.boundary
    assert b is not None
    held = {c.expr for c in b.changes}
    for name in sorted(reads & set(b.bound) - held):
        if loop is None or read_before_bound(loop, name):
            return (
                f"reads `{name}`, which an iteration binds and the boundary checkpoints do not hold"
            )
    for name in sorted(reads & set(b.values)):
        if not reads_only_values(p.node, name):
            return f"reads `{name}` as a tensor; boundary checkpoints hold it without its autograd graph"
    return None


def _qualname(fn: cst.FunctionDef, parents: Any) -> str:
    parts = [fn.name.value]
    for anc in _ancestors(fn, parents):
        if isinstance(anc, cst.FunctionDef | cst.ClassDef):
            parts.append(anc.name.value)
    return ".".join(reversed(parts))
