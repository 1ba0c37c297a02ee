"""A candidate loop's changeset: the walk of its statements, the hooks it may trigger, and the
loop-scoped filter, as one frozen record the plan is built from."""

from __future__ import annotations

from dataclasses import dataclass

from flortrain.static.changeset.rules import escapes, hooks, loop_scoped
from flortrain.static.changeset.walker import Walker
from flortrain.static.expressions import root
from flortrain.static.plan import Change
from flortrain.static.program import Loop, Program


@dataclass(frozen=True)
class LoopChangeset:
    changes: tuple[Change, ...]
    bound: tuple[str, ...]
    reaches: tuple[str, ...]
    outputs: tuple[tuple[str, str], ...] = ()  # the channels it writes to, and their kinds
    #: names the loop binds that stay because a path from its exit reads them: (name, line of
    #: such a read; 0 for a project module's importers)
    read_after: tuple[tuple[str, int], ...] = ()


def loop_changeset(prog: Program, loop: Loop) -> LoopChangeset:
    """The filtered changeset of a candidate loop; raises
    :class:`~flortrain.static.effects.NoEstimate` to refuse it."""
    scope = prog.loop_scope[loop]
    escapes.refuse_loop(prog, loop)
    w = Walker(prog, scope, frozenset({scope.qualname}))
    w.statement(loop)
    if next(prog.calls_in([loop]), None) is not None:
        hooks.add_hook_effects(w)
    fx = w.fx
    kept, read_after = loop_scoped.filter_changes(prog, scope, loop, fx, w.defined)
    outputs = tuple((expr, kind) for expr, kind in fx.outputs.items() if root(expr) not in fx.bound)
    return LoopChangeset(
        tuple(kept),
        tuple(sorted(fx.bound)),
        tuple(sorted(fx.reaches)),
        outputs,
        tuple(sorted(read_after.items())),
    )
