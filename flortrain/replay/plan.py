"""The replay plan as data: what a replay executes, skips and jumps over, and how it says so.

Made by :func:`flortrain.replay.planning.plan_replay` (which needs libcst); defined apart from it
so that a plan made in a forked child (:mod:`flortrain.process.static_child`) unpickles in a process
that never imports libcst.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flortrain.replay.costs import NO_COST, BlockCost
from flortrain.static.plan import Guard, Instrumentation, Plan, fast_forward_line


@dataclass(frozen=True)
class ReplayPlan:
    instrumentation: Instrumentation
    execute: dict[str, str]  # block id -> reason it must run
    probes: int
    #: block id -> the probe that runs it: its instances inside the probe execute (isolated, no
    #: checkpoint) on top of whatever the script's own instances do
    in_probes: dict[str, str] = field(default_factory=dict)
    #: main id -> the guards of the probes in its body: iterations where none fires are jumped
    spans: dict[str, list[Guard]] = field(default_factory=dict)
    #: main id -> why every iteration of it runs
    no_spans: dict[str, str] = field(default_factory=dict)
    #: main id -> why a parallel-replay worker may not resume at its boundary checkpoints (no
    #: boundary state, or a probe reads a name they do not hold): it pseudoresumes from the start
    unresumable: dict[str, str] = field(default_factory=dict)
    #: main id -> the probe state its iterations carry, which no checkpoint holds: a parallel
    #: replay does not divide it (:mod:`flortrain.replay.probestate`)
    carried: dict[str, str] = field(default_factory=dict)

    def fast_forward(self, main_id: str) -> str | None:
        """The statements of main loop ``main_id`` a pseudoresume leaves out, at their lines in
        the current file (None: none)."""
        steps = sorted(
            replace(f, line=at, end_line=at + f.end_line - f.line)
            for at, (m, f) in self.instrumentation.forward.items()
            if m == main_id
        )
        return "; ".join(fast_forward_line(f) for f in steps) or None

    def describe(
        self,
        plan: Plan,
        costs: dict[str, BlockCost],
        why_not: dict[str, str] | None = None,
    ) -> list[str]:
        """Lines for stderr: what runs, what is skipped (and why instances have no checkpoint),
        and the estimated time."""
        why_not = why_not or {}
        out = [f"replay plan: {self.probes} probe(s)"]
        est = 0.0
        for b in plan.blocks:
            cost = costs.get(b.id, NO_COST)
            n, k = cost.instances, cost.checkpoints
            est += cost.replayed(b.id in self.execute)
            if b.id in self.execute:
                out.append(
                    f"  {b.id} ({b.function}): execute {n} instance(s) - {self.execute[b.id]}"
                )
            else:
                out.append(
                    f"  {b.id} ({b.function}): skip {k} of {n} instance(s), restoring checkpoints"
                )
                if k and b.outputs:
                    channels = ", ".join(f"`{expr}` ({kind})" for expr, kind in b.outputs)
                    out.append(
                        f"    a skipped instance writes nothing to {channels}, as it prints nothing"
                    )
                if k < n and b.id in why_not:
                    out.append(
                        f"    the others execute: not checkpointed at record: {why_not[b.id]}"
                    )
            if b.id in self.in_probes:
                out.append(
                    f"  {b.id} ({b.function}): also runs inside the probe {self.in_probes[b.id]}, executed there"
                )
        for r in plan.refused:
            out.append(f"  loop at line {r.span.line}: runs as plain code ({r.reason})")
        for m in plan.main_loops:
            if m.id in self.spans:
                guards = " or ".join(f"`{g.source}`" for g in self.spans[m.id]) or "no probe in it"
                out.append(
                    f"  main loop {m.id}: iterations where no probe fires are jumped over ({guards})"
                )
            elif m.id in self.no_spans:
                out.append(f"  main loop {m.id}: every iteration runs: {self.no_spans[m.id]}")
        out.append(
            f"estimated block time {est:.2f}s (record spent {sum(c.compute for c in costs.values()):.2f}s in blocks)"
        )
        return out
