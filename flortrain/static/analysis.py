"""From a parsed script to its :class:`~flortrain.static.plan.Plan`: the one entry point of the
static analyses."""

from __future__ import annotations

import libcst as cst

from flortrain.errors import FlortrainError, Located
from flortrain.static.changeset.loop import loop_changeset
from flortrain.static.clocks import clock_names
from flortrain.static.effects import NoEstimate
from flortrain.static.fastforward import fast_forward
from flortrain.static.indexing import index
from flortrain.static.loops import LoopForest
from flortrain.static.plan import (
    Block,
    Change,
    FunctionSpan,
    MainLoop,
    Plan,
    Refusal,
    Restore,
    SourceRange,
)
from flortrain.static.program import MODULE, Loop, Program
from flortrain.static.source import TOO_DEEP, Source
from flortrain.static.spans import boundary_state
from flortrain.static.untracked import untracked_writes
from flortrain.static.values import value_only


def _source_range(prog: Program, node: cst.CSTNode) -> SourceRange:
    r = prog.range(node)
    return SourceRange(r.start.line, r.start.column + 1, r.end.line)


def _kind(loop: Loop) -> str:
    return "for" if isinstance(loop, cst.For) else "while"


def rebound_names(changes: tuple[Change, ...]) -> set[str]:
    """The changeset's rebound plain names (not ``a.b``)."""
    return {c.expr for c in changes if c.restore is Restore.REBOUND and "." not in c.expr}


def loop_id(prefix: str, line: int) -> str:
    """Stable ids: the loop's line in the recorded script."""
    return f"{prefix}{line}"


def module_prefix(module: str) -> str:
    """The id prefix of an imported project module's loops (``mingpt.trainer:L24``): line numbers
    alone collide across files, and the dotted name is what the import system keys a module by.
    The script keeps bare ids (``L24``), so records made before the import hook still read."""
    return f"{module}:"


def analyse(source: Source, prefix: str = "", prog: Program | None = None) -> Plan:
    """Every static fact about ``source``; ``prefix`` goes before every block and main-loop id
    (see :func:`module_prefix`). A file too deeply nested for libcst's recursive walks
    (``pydoc_data/topics.py``'s thousand-line string concatenation) is a one-line refusal.
    ``prog``: the file's index when the caller has built it already (``flortrain check``)."""
    try:
        return _analyse(source, prefix, prog)
    except RecursionError:
        raise FlortrainError(TOO_DEEP, Located(source.path), "FT004") from None


def _analyse(source: Source, prefix: str, prog: Program | None) -> Plan:
    if prog is None or prog.exports != bool(prefix):
        prog = index(source, exports=bool(prefix))
    forest = LoopForest(prog)
    mains: list[MainLoop] = []
    blocks: list[Block] = []
    refused: list[Refusal] = []
    taken: set[Loop] = set()
    found = forest.main_loops()
    for m in found:
        ms = prog.loop_scope[m]
        if isinstance(m, cst.For) and m.asynchronous is not None:
            continue
        if m in prog.class_body_loops:
            continue
        try:
            boundary, no_boundary = boundary_state(prog, m), ""
        except NoEstimate as e:
            boundary, no_boundary = None, str(e)
        steps, verdicts = fast_forward(prog, m)
        main = MainLoop(
            loop_id(prefix + "M", prog.line(m)),
            _kind(m),
            _source_range(prog, m),
            ms.qualname,
            forest.why.get(m, ""),
            boundary,
            no_boundary,
            steps,
            tuple((v.line, v.why) for v in verdicts if v.step is None),
        )
        mains.append(main)
        for cand in forest.candidates(m):
            if cand.loop in taken:
                continue
            taken.add(cand.loop)
            span = _source_range(prog, cand.loop)
            try:
                cs = loop_changeset(prog, cand.loop)
            except NoEstimate as e:
                refused.append(Refusal(span, cand.scope.qualname, str(e), main.id))
                continue
            blocks.append(
                Block(
                    id=loop_id(prefix + "L", span.line),
                    kind=_kind(cand.loop),
                    span=span,
                    function=cand.scope.qualname,
                    changeset=cs.changes,
                    reaches=cs.reaches,
                    bound=cs.bound,
                    main=main.id,
                    outputs=cs.outputs,
                    read_after=cs.read_after,
                    unchecked=tuple(
                        sorted(
                            rebound_names(cs.changes) & clock_names(prog, cand.scope, set(cs.bound))
                        )
                    ),
                    values=tuple(
                        c.expr
                        for c in cs.changes
                        if c.restore is Restore.REBOUND
                        and "." not in c.expr
                        and value_only(prog, cand.scope, cand.loop, c.expr)
                    ),
                )
            )
    others = _other_loops(prog, forest, set(found) | taken, blocks, refused)
    functions = tuple(
        FunctionSpan(s.qualname, _source_range(prog, s.node))
        for s in prog.scopes.values()
        if s.qualname != MODULE and isinstance(s.node, cst.FunctionDef)
    )
    untracked = untracked_writes(source) if mains else ()
    return Plan(
        source.path, tuple(mains), tuple(blocks), tuple(refused), functions, others, untracked
    )


def _other_loops(
    prog: Program, forest: LoopForest, taken: set[Loop], blocks: list[Block], refused: list[Refusal]
) -> tuple[Refusal, ...]:
    """Why each loop that is neither a main loop nor a candidate (``taken``) runs as plain code."""
    passed = dict(forest.passed_over)
    by_line = {b.span.line: b for b in blocks}
    refused_lines = {r.span.line for r in refused}
    out: list[Refusal] = []
    for scope in prog.scopes.values():
        for lp in scope.loops:
            if lp in taken:
                continue
            span = _source_range(prog, lp)
            if lp in prog.class_body_loops:
                reason = "a loop in a class body runs once, at class creation"
            elif lp in passed:
                reason = passed[lp]
            else:
                reason = _inside(
                    prog, lp, by_line, refused_lines, {prog.line(p) for p in passed}
                ) or (
                    "outside every main loop as far as the static pass can see: setup, code before or"
                    " after training, or a function reached only through calls it cannot follow"
                    " (a module's forward); runs as plain code"
                )
            out.append(Refusal(span, scope.qualname, reason, ""))
    out.sort(key=lambda r: r.span.line)
    return tuple(out)


def _inside(
    prog: Program, loop: Loop, blocks: dict[int, Block], refused: set[int], passed: set[int]
) -> str | None:
    parent = prog.loop_parent.get(loop)
    while parent is not None:
        line = prog.line(parent)
        if line in passed:
            return f"inside the loop at line {line}, which is not a main loop"
        if line in blocks:
            return f"part of memoized loop {blocks[line].id}, which restores its effects"
        if line in refused:
            return f"inside the loop at line {line}, which is not memoized"
        parent = prog.loop_parent.get(parent)
    qual = prog.loop_scope[loop].qualname
    for b in blocks.values():
        if qual in b.reaches:
            return f"runs in {qual}(), which memoized loop {b.id} calls: part of that loop"
    return None
