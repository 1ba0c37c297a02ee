"""The replay plan: which memoized blocks must execute for the probes to see what they would
have seen, and an estimate of the replay's cost from the record's measured block times.

- a probe inside a memoized loop, or in a function that loop reaches, makes that block execute;
- a probe that reads a name bound only inside a memoized loop of the same function (``loss`` of
  the last batch) makes that block execute, since its checkpoint does not hold that name;
- every other block instance with a checkpoint is skipped and restored (partial replay).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from flortrain.replay.probes import ProbeSet
from flortrain.static.plan import Block, MainLoop, Plan
from flortrain.static.program import MODULE
from flortrain.static.transform import Instrumentation


@dataclass(frozen=True)
class ReplayPlan:
    instrumentation: Instrumentation
    execute: dict[str, str]  # block id -> reason it must run
    probes: int

    def describe(self, plan: Plan, costs: dict[str, tuple[int, int, float, float]]) -> list[str]:
        """Lines for stderr: what runs, what is skipped, and the estimated time."""
        out = [f"replay plan: {self.probes} probe(s)"]
        est = 0.0
        for b in plan.blocks:
            n, k, compute, restore = costs.get(b.id, (0, 0, 0.0, 0.0))
            if b.id in self.execute:
                est += compute
                out.append(f"  {b.id} ({b.function}): execute {n} instance(s) - {self.execute[b.id]}")
            else:
                est += restore + compute * (n - k) / max(n, 1)
                out.append(f"  {b.id} ({b.function}): skip {k} of {n} instance(s), restoring checkpoints")
        for r in plan.refused:
            out.append(f"  loop at line {r.span.line}: runs as plain code ({r.reason})")
        out.append(f"estimated block time {est:.2f}s (record spent {sum(c[2] for c in costs.values()):.2f}s in blocks)")
        return out


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


def plan_replay(plan: Plan, probes: ProbeSet) -> ReplayPlan:
    current = probes.current
    parents = current.wrapper.resolve(ParentNodeProvider)
    pos = current.wrapper.resolve(PositionProvider)
    to_cur = probes.line_map
    blocks_at: dict[int, Block] = {to_cur[b.span.line]: b for b in plan.blocks}
    mains_at: dict[int, MainLoop] = {to_cur[m.span.line]: m for m in plan.main_loops}
    execute: dict[str, str] = {}
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
        reads = _names_read(p.node)
        for b in plan.blocks:
            if b.id in execute:
                continue
            if function != MODULE and function in b.reaches:
                execute[b.id] = f"probe at line {p.line} is in {function}(), which it calls"
                continue
            if b.function == function:
                held = {c.expr.split(".")[0] for c in b.changeset}
                only_inside = sorted((reads & set(b.bound)) - held)
                if only_inside:
                    execute[b.id] = f"probe at line {p.line} reads `{only_inside[0]}`, which only this loop binds"
    inst = Instrumentation(
        blocks=blocks_at,
        mains=mains_at,
        probes={p.line: p.number for p in probes.probes},
    )
    return ReplayPlan(inst, execute, len(probes.probes))


def _qualname(fn: cst.FunctionDef, parents: Any) -> str:
    parts = [fn.name.value]
    for anc in _ancestors(fn, parents):
        if isinstance(anc, cst.FunctionDef | cst.ClassDef):
            parts.append(anc.name.value)
    return ".".join(reversed(parts))
