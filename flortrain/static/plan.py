"""The plan: every fact the analyses found, as frozen, located records.

Analyses produce a :class:`Plan`; the transform and the replay planner consume it and never
re-derive facts. Block and main-loop ids are made from the line of the loop in the *recorded*
script, so a replayed copy with probes added maps back to the same ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from flortrain.errors import FlortrainError


class Restore(StrEnum):
    """How a changeset element is put back when its block is skipped."""

    #: The object is mutated in place (``opt.step()``, ``lst.append``): load state *into* it, so
    #: every alias (an optimizer's reference to the parameters) sees the restored values.
    IN_PLACE = "in_place"
    #: The name or attribute is rebound (``total += x``, ``self.step = s``): assign the value back.
    REBOUND = "rebound"


@dataclass(frozen=True)
class Change:
    """One element of a loop's changeset."""

    expr: str  # "model", "self.optimizer", "total"
    restore: Restore
    rule: int  # the Table 2 rule (1-4) that put it there; 7 = mapped from a callee
    line: int  # where in the loop the statement that activated the rule is
    is_global: bool = False  # a module-level name rebound from inside a function (via a callee)


@dataclass(frozen=True)
class SourceRange:
    """Where a statement stands in the script: its first line and column (1-based), last line."""

    line: int
    col: int
    end_line: int


#: What a write behind the version counter's back costs (see :mod:`flortrain.static.untracked`).
UNTRACKED = (
    "writes a tensor through `.data` or a NumPy view, which its version counter does not see:"
    " every checkpoint copies every tensor (no skipping of unchanged ones)"
)


def not_memoized(reason: str) -> str:
    """A refused loop, as record's stderr and ``flortrain check`` say it."""
    return f"loop not memoized: {reason}"


def no_iteration_spans(reason: str) -> str:
    """A main loop without boundary state, as ``--explain`` and ``flortrain check`` say it."""
    return f"no iteration spans: {reason}"


def outside_iterator(name: str) -> str:
    """Why a memoized loop whose header advances an iterator a name holds is not checkpointed
    (found at record by ``audit.outside_iterator``, before it by ``flortrain check``)."""
    return f"iterates `{name}`, an iterator made before it, whose position no checkpoint holds"


def carries_graph(path: str, node: str = "") -> str:
    """Why a tensor that leaves a loop with its autograd graph makes the loop's instances
    execute; ``node`` is its ``grad_fn``'s type when a run has seen it."""
    seen = f" (grad_fn={node})" if node else ""
    return f"`{path}` holds a tensor carrying an autograd graph{seen}; it executes on replay"


@dataclass(frozen=True)
class Block:
    """A memoized loop: skipped and restored on replay unless probed."""

    id: str
    kind: str  # "for" | "while"
    span: SourceRange
    function: str  # qualified name of the enclosing function, "<module>" at top level
    changeset: tuple[Change, ...]
    reaches: tuple[str, ...]  # local functions reachable by calls from the loop body
    bound: tuple[str, ...]  # names bound in the loop body (loop-scoped or not)
    main: str  # id of the main loop it belongs to
    #: rebound names read after the loop only as numbers (``loss.item()``): a graph-carrying
    #: tensor there may be stored detached (see :mod:`flortrain.static.values`)
    values: tuple[str, ...] = ()
    #: the output channels it writes to, with their kinds (``("log", "logger")``;
    #: ``static/sinks``): not state, and a skipped instance writes nothing to them, as it prints
    #: nothing
    outputs: tuple[tuple[str, str], ...] = ()
    #: names the loop binds that its changeset keeps because a path from the loop's exit reads
    #: them before rebinding them, with the line of such a read (0: the module's importers)
    read_after: tuple[tuple[str, int], ...] = ()
    #: rebound names left out of the comparison with the record's checkpoint (still restored):
    #: clock readings and values made from them (:mod:`flortrain.static.clocks`)
    unchecked: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """A candidate loop that will not be memoized, and why (it runs as plain code)."""

    span: SourceRange
    function: str
    reason: str
    main: str


@dataclass(frozen=True)
class Boundary:
    """What a main-loop iteration boundary holds for a replay to resume there (iteration spans,
    :mod:`flortrain.static.spans`)."""

    changes: tuple[Change, ...]  # objects restored in place; names and attributes reassigned
    values: tuple[str, ...]  # carried names read only as numbers: may be stored detached
    targets: tuple[str, ...]  # the main ``for`` loop's target names (restored on a jump)
    bound: tuple[str, ...] = ()  # every name an iteration binds (a probe reading one is checked)


@dataclass(frozen=True, order=True)
class FastForward:
    """A top-level statement of a main loop's body that a pseudoresume leaves out
    (:mod:`flortrain.static.fastforward`), with what the run-time check must see first."""

    line: int
    end_line: int
    #: names the statement calls as modules: each must hold a module in eval mode whose
    #: submodules all run PyTorch's own ``forward``, with no hooks
    modules: tuple[str, ...] = ()
    #: names it iterates, indexes or calls a pure method of: each must hold plain values
    #: (numbers, strings, tensors, in lists, tuples and dicts) or a module as above
    containers: tuple[str, ...] = ()
    #: the names it binds (a probe reading one makes a replay run it)
    binds: tuple[str, ...] = ()


def fast_forward_line(f: FastForward) -> str:
    """One skipped statement as ``--explain`` and the replay plan name it."""
    lines = f"line {f.line}" if f.end_line == f.line else f"lines {f.line}-{f.end_line}"
    checks = [f"`{m}` a module in eval mode" for m in f.modules]
    checks += [f"`{c}` plain values or a module in eval mode" for c in f.containers]
    return lines + (f" (if {', '.join(checks)})" if checks else "")


@dataclass(frozen=True)
class MainLoop:
    id: str
    kind: str
    span: SourceRange
    function: str
    why: str = ""  # why this loop was chosen as a main loop (``--explain``)
    boundary: Boundary | None = None
    no_boundary: str = ""  # why there is no boundary state (then no iteration spans)
    #: the body's statements a pseudoresume leaves out (:mod:`flortrain.static.fastforward`)
    fast_forward: tuple[FastForward, ...] = ()
    #: the body's other statements, each with why a pseudoresume runs it
    kept: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class FunctionSpan:
    qualname: str
    span: SourceRange


@dataclass(frozen=True)
class Plan:
    path: str
    main_loops: tuple[MainLoop, ...] = ()
    blocks: tuple[Block, ...] = ()
    refused: tuple[Refusal, ...] = ()
    functions: tuple[FunctionSpan, ...] = field(default_factory=tuple)
    #: every other loop (neither a main loop nor a candidate), with why it is plain code
    others: tuple[Refusal, ...] = ()
    #: writes through ``.data`` or a NumPy view, which tensor version counters do not see
    #: (:mod:`flortrain.static.untracked`)
    untracked: tuple[SourceRange, ...] = ()

    def explain(self) -> str:
        """The plan as a person reads it (``flortrain instrument --explain``)."""
        out: list[str] = []
        if not self.main_loops:
            why = "no loop trains" if self.others else "no loop contains another loop"
            out.append(f"{self.path}: no main loop ({why}); nothing is memoized")
        for m in self.main_loops:
            out.append(
                f"{self.path}:{m.span.line}:{m.span.col} main loop {m.id} ({m.kind}) in {m.function}"
                + (f": {m.why}" if m.why else "")
            )
            if m.boundary is not None:
                held = ", ".join(c.expr for c in m.boundary.changes) or "(nothing)"
                out.append(f"  iteration boundary state (iteration spans): {held}")
            else:
                out.append(f"  {no_iteration_spans(m.no_boundary)}")
            if m.fast_forward:  # and why the others run; nothing when every statement runs
                skipped = "; ".join(fast_forward_line(f) for f in m.fast_forward)
                out.append(f"  fast-forward (left out while pseudoresuming): {skipped}")
                for line, why in m.kept:
                    out.append(f"    runs while pseudoresuming: line {line}: {why}")
            for b in (b for b in self.blocks if b.main == m.id):
                out.append(
                    f"  {self.path}:{b.span.line}:{b.span.col} memoized {b.kind} loop {b.id} in {b.function}"
                )
                if not b.changeset:
                    out.append("    changeset: (empty)")
                read_after = dict(b.read_after)
                for c in b.changeset:
                    scope = " global" if c.is_global else ""
                    value = ", read only as a number" if c.expr in b.values else ""
                    value += (
                        ", a clock reading: restored, not compared" if c.expr in b.unchecked else ""
                    )
                    at = read_after.get(c.expr)
                    live = (
                        ""
                        if at is None
                        else f", read after the loop at line {at}"
                        if at
                        else ", read after the loop by the module's importers"
                    )
                    out.append(
                        f"    changeset: {c.expr} [{c.restore.value}{scope}{value}] rule {c.rule} line {c.line}{live}"
                    )
                if b.outputs:
                    channels = ", ".join(f"{expr} ({kind})" for expr, kind in b.outputs)
                    out.append(f"    writes to (output channels, not state): {channels}")
            for r in (r for r in self.refused if r.main == m.id):
                out.append(
                    f"  {self.path}:{r.span.line}:{r.span.col} refused loop in {r.function}: {r.reason}"
                )
        for r in self.others:
            out.append(
                f"{self.path}:{r.span.line}:{r.span.col} loop in {r.function} not memoized: {r.reason}"
            )
        out.extend(f"{self.path}:{u.line}:{u.col} {UNTRACKED}" for u in self.untracked)
        return "\n".join(out)


@dataclass(frozen=True)
class Instrumented:
    """A file's plan and its instrumented text: what the static pass hands the runtime. Plain
    data, defined here rather than beside the pass, so that a forked pass's result unpickles
    without importing libcst (:mod:`flortrain.process.static_child`)."""

    plan: Plan
    code_text: str


@dataclass(frozen=True)
class Guard:
    """A necessary condition for a probe to fire in an iteration, as Python source."""

    source: str
    recorded: tuple[str, ...]  # carried names: their value at the iteration's start, recorded
    live: tuple[str, ...]  # names the loop never binds: read from the running frame
    #: live names read through an attribute (``args.log_every``): at run time only an
    #: ``argparse.Namespace`` is trusted not to change behind the static pass's back
    through: tuple[str, ...] = ()


@dataclass(frozen=True)
class Instrumentation:
    """What to apply, keyed by start line in the script being transformed."""

    blocks: Mapping[int, Block] = field(default_factory=dict)
    mains: Mapping[int, MainLoop] = field(default_factory=dict)
    probes: Mapping[int, int] = field(default_factory=dict)  # statement line -> probe number
    #: statement line -> (main id, the statement's fast-forward facts): left out while
    #: pseudoresuming, when the run-time check passes
    forward: Mapping[int, tuple[str, FastForward]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModulePass:
    """A project module's static pass, done before the module is imported: its text then, and
    its instrumentation (None: no main loop, imported plainly) or why the pass refused it. The
    import hook uses it only if the file still has that text."""

    text: str
    result: Instrumented | None
    error: FlortrainError | None = None


#: project modules' passes done ahead, by (absolute path, dotted name)
ModulePasses = Mapping[tuple[str, str], ModulePass]
