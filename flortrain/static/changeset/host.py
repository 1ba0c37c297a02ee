"""What a rule needs from the walker that applies it: the program, the scope, the effects found
so far, and the walker's own steps (record a change, judge a nested call or expression, walk
another body). Rules take this protocol, never the walker, so no rule imports the walker and the
walker imports every rule."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import libcst as cst

from flortrain.static.effects import Effects
from flortrain.static.plan import Restore
from flortrain.static.program import Program, Scope


class Walk(Protocol):
    prog: Program
    scope: Scope
    fx: Effects
    module: cst.Module
    callee_stack: frozenset[str]
    #: `return` ends a callee normally, but escapes a skipped loop
    in_loop: bool

    def add(
        self, expr: str, restore: Restore, rule: int, line: int, is_global: bool = False
    ) -> None: ...

    def bind(self, names: Iterable[str]) -> None: ...

    def rebind(self, names: Iterable[str], line: int) -> None: ...

    def is_global(self, name: str) -> bool: ...

    def through_alias(self, expr: str) -> str: ...

    def add_target_object(self, obj: str, line: int, rule: int) -> None: ...

    def expr_effects(self, node: cst.CSTNode, line: int) -> None: ...

    def call(self, call: cst.Call, line: int, assigned: bool) -> int: ...

    def scope_shadows(self, name: str) -> bool: ...

    def statements(self, stmts: Sequence[cst.CSTNode]) -> None: ...

    def walker(self, scope: Scope, stack: frozenset[str]) -> Walk:
        """A walker of another body (a callee's, a hook's, a lambda's), outside any loop."""
        ...


def body_effects(w: Walk, scope: Scope, stack: frozenset[str]) -> Effects:
    """What a function's whole body changes, in its own terms."""
    sub = w.walker(scope, stack)
    sub.statements(list(scope.body))
    return sub.fx
