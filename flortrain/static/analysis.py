"""From a parsed script to its :class:`~flortrain.static.plan.Plan`: the one entry point of the
static analyses."""

from __future__ import annotations

import libcst as cst

from flortrain.errors import FlortrainError, Located
from flortrain.static.changeset import NoEstimate, loop_changeset
from flortrain.static.loops import LoopForest
from flortrain.static.plan import Block, FunctionSpan, MainLoop, Plan, Refusal, Restore, Span
from flortrain.static.program import MODULE, Loop, Program, index
from flortrain.static.source import Source
from flortrain.static.values import value_only


def _span(prog: Program, node: cst.CSTNode) -> Span:
    r = prog.range(node)
    return Span(r.start.line, r.start.column + 1, r.end.line)


def _kind(loop: Loop) -> str:
    return "for" if isinstance(loop, cst.For) else "while"


def loop_id(prefix: str, line: int) -> str:
    """Stable ids: the loop's line in the recorded script."""
    return f"{prefix}{line}"


def module_prefix(module: str) -> str:
    """The id prefix of an imported project module's loops (``mingpt.trainer:L24``): line numbers
    alone collide across files, and the dotted name is what the import system keys a module by.
    The script keeps bare ids (``L24``), so records made before the import hook still read."""
    return f"{module}:"


def analyse(source: Source, prefix: str = "") -> Plan:
    """Every static fact about ``source``; ``prefix`` goes before every block and main-loop id
    (see :func:`module_prefix`). A file too deeply nested for libcst's recursive walks
    (``pydoc_data/topics.py``'s thousand-line string concatenation) is a one-line refusal."""
    try:
        return _analyse(source, prefix)
    except RecursionError:
        raise FlortrainError(
            "too deeply nested for the static pass", Located(source.path), "FT004"
        ) from None


def _analyse(source: Source, prefix: str) -> Plan:
    prog = index(source)
    forest = LoopForest(prog)
    mains: list[MainLoop] = []
    blocks: list[Block] = []
    refused: list[Refusal] = []
    taken: set[Loop] = set()
    for m in forest.main_loops():
        ms = prog.loop_scope[m]
        if isinstance(m, cst.For) and m.asynchronous is not None:
            continue
        if m in prog.class_body_loops:
            continue
        main = MainLoop(loop_id(prefix + "M", prog.line(m)), _kind(m), _span(prog, m), ms.qualname)
        mains.append(main)
        for cand in forest.candidates(m):
            if cand.loop in taken:
                continue
            taken.add(cand.loop)
            span = _span(prog, cand.loop)
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
                    values=tuple(
                        c.expr
                        for c in cs.changes
                        if c.restore is Restore.REBOUND
                        and "." not in c.expr
                        and value_only(prog, cand.scope, cand.loop, c.expr)
                    ),
                )
            )
    functions = tuple(
        FunctionSpan(s.qualname, _span(prog, s.node))
        for s in prog.scopes.values()
        if s.qualname != MODULE and isinstance(s.node, cst.FunctionDef)
    )
    return Plan(source.path, tuple(mains), tuple(blocks), tuple(refused), functions)
