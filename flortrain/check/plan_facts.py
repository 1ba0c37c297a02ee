"""The static pass's plan as the replay rules read it (the RPL family).

``flortrain check`` reports what ``flortrain instrument --explain`` and ``record`` would say, so
it reads the same :class:`~flortrain.static.plan.Plan`. The pass refusing a whole file
(``FT004``) is a finding, not an exception: it is kept here once per file, and the rules that
need a plan see none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import libcst as cst

from flortrain.check.unit import Unit
from flortrain.errors import FlortrainError, Located
from flortrain.static.loops import FALLBACK_MAIN
from flortrain.static.plan import Block, MainLoop, Plan, SourceRange
from flortrain.static.program import Loop, Program, Scope
from flortrain.static.source import TOO_DEEP

_PLANS: WeakKeyDictionary[Unit, Plan | FlortrainError] = WeakKeyDictionary()
_PROGRAMS: WeakKeyDictionary[Unit, Program | None] = WeakKeyDictionary()


def plan_or_refusal(unit: Unit) -> Plan | FlortrainError:
    """The file's plan, or the one-line refusal ``record`` would print for it."""
    found = _PLANS.get(unit)
    if found is None:
        try:
            found = unit.plan
        except FlortrainError as e:
            found = e
        except RecursionError:
            found = FlortrainError(TOO_DEEP, Located(unit.path), "FT004")
        _PLANS[unit] = found
    return found


def plan(unit: Unit) -> Plan | None:
    found = plan_or_refusal(unit)
    return found if isinstance(found, Plan) else None


def program(unit: Unit) -> Program | None:
    """The program index, or None where the pass refuses the file."""
    if unit in _PROGRAMS:
        return _PROGRAMS[unit]
    prog: Program | None = None
    if plan(unit) is not None:
        try:
            prog = unit.program
        except RecursionError:
            prog = None
    _PROGRAMS[unit] = prog
    return prog


def trains(main: MainLoop) -> bool:
    """Whether the pass chose this main loop because it trains (not as a script's fallback:
    a nest of loops in a data-preparation script is not a training loop)."""
    return main.why != FALLBACK_MAIN


def training_mains(p: Plan) -> dict[str, MainLoop]:
    return {m.id: m for m in p.main_loops if trains(m)}


def training_blocks(p: Plan) -> list[Block]:
    mains = training_mains(p)
    return [b for b in p.blocks if b.main in mains]


@dataclass(frozen=True)
class TrainingBlock:
    """A memoized loop of a training main loop, with its node and the function it is in."""

    block: Block
    loop: Loop
    scope: Scope
    program: Program


def training_loops(unit: Unit) -> Iterator[TrainingBlock]:
    """Every memoized loop of the file's training main loops, located in its program index
    (none where the pass refuses the file)."""
    p, prog = plan(unit), program(unit)
    if p is None or prog is None:
        return
    for b in training_blocks(p):
        loop = loop_at(prog, b.span)
        scope = prog.scopes.get(b.function)
        if loop is not None and scope is not None:
            yield TrainingBlock(b, loop, scope, prog)


def loop_at(prog: Program, span: SourceRange) -> Loop | None:
    """The loop node a plan's span names."""
    for scope in prog.scopes.values():
        for lp in scope.loops:
            r = prog.range(lp)
            if r.start.line == span.line and r.start.column + 1 == span.col:
                return lp
    return None


def header(loop: Loop) -> cst.CSTNode:
    """What a finding about a loop points at: its iterable or test, where the hazard shows."""
    return loop.iter if isinstance(loop, cst.For) else loop.test
