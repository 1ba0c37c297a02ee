"""Which loop is the main loop, and which loops inside it are candidates for memoization.

The *main loop* is an outermost loop that contains another loop, directly or through calls to
module-local functions and methods (``train_one_epoch(...)``, ``self.fit()``). Its *candidate inner
loops* are the outermost loops executed by its body: lexically nested, or in a function the body
calls outside any inner loop. A loop reached through calls from inside a candidate is part of that
candidate, not a candidate of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import libcst as cst

from flortrain.static.program import Loop, Program, Scope


def loop_body(loop: Loop) -> Sequence[cst.BaseStatement | cst.SimpleStatementSuite]:
    """The loop's statements; a one-line body (``for b in x: f(b)``) is the suite node itself, so
    that positions resolve (a fresh node would not be in the position metadata)."""
    body = loop.body
    if isinstance(body, cst.IndentedBlock):
        return body.body
    assert isinstance(body, cst.SimpleStatementSuite)
    return [body]


def _stmts_without_loops(stmts: Sequence[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    """Statements under ``stmts`` down to (not into) loops and definitions."""
    for s in stmts:
        if isinstance(s, cst.FunctionDef | cst.ClassDef):
            continue
        yield s
        if isinstance(s, cst.For | cst.While):
            continue
        for c in s.children:
            if isinstance(c, cst.BaseSuite | cst.BaseStatement | cst.ExceptHandler | cst.Else | cst.Finally | cst.MatchCase):
                yield from _stmts_without_loops([c])


def outer_loops(stmts: Sequence[cst.CSTNode]) -> Iterator[Loop]:
    """The outermost loops lexically under ``stmts``."""
    for s in _stmts_without_loops(stmts):
        if isinstance(s, cst.For | cst.While):
            yield s


def non_loop_calls_scope(stmts: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
    """The parts of ``stmts`` that run outside their outermost loops (headers of compound
    statements and simple statements), where a call reaches a callee's own outer loops."""
    out: list[cst.CSTNode] = []
    for s in _stmts_without_loops(stmts):
        if isinstance(s, cst.For):
            out.append(s.iter)
        elif isinstance(s, cst.While):
            out.append(s.test)
        elif isinstance(s, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            out.append(s)
        elif isinstance(s, cst.If):
            out.append(s.test)
        elif isinstance(s, cst.With):
            out.extend(i.item for i in s.items)
    return out


@dataclass(frozen=True)
class Candidate:
    loop: Loop
    scope: Scope
    main: Loop


class LoopForest:
    """Qualifying loops, main loops and their candidates for one program."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self._has_loop: dict[str, bool] = {}
        self.qualifying = [lp for s in prog.scopes.values() for lp in s.loops if self.qualifies(lp)]

    def function_has_loop(self, qual: str, _stack: frozenset[str] = frozenset()) -> bool:
        if qual in self._has_loop:
            return self._has_loop[qual]
        if qual in _stack or qual not in self.prog.scopes:
            return False
        s = self.prog.scopes[qual]
        result = bool(s.loops) or any(
            self.function_has_loop(c, _stack | {qual}) for c in self.prog.callees(list(s.body), s)
        )
        self._has_loop[qual] = result
        return result

    def qualifies(self, loop: Loop) -> bool:
        body = loop_body(loop)
        if any(True for _ in outer_loops(body)):
            return True
        scope = self.prog.loop_scope[loop]
        return any(self.function_has_loop(c) for c in self.prog.callees(list(body), scope))

    def main_loops(self) -> list[Loop]:
        dominated: set[Loop] = set()
        for q in self.qualifying:
            reach = self.prog.reachable(list(loop_body(q)), self.prog.loop_scope[q])
            for lp in self.qualifying:
                if lp is q:
                    continue
                if self._lexically_inside(lp, q) or self.prog.loop_scope[lp].qualname in reach:
                    dominated.add(lp)
        mains = [lp for lp in self.qualifying if lp not in dominated]
        mains.sort(key=self.prog.line)
        return mains

    def _lexically_inside(self, inner: Loop, outer: Loop) -> bool:
        p = self.prog.loop_parent.get(inner)
        while p is not None:
            if p is outer:
                return True
            p = self.prog.loop_parent.get(p)
        return False

    def candidates(self, main: Loop) -> list[Candidate]:
        out: list[Candidate] = []
        seen_loops: set[Loop] = set()
        seen_funcs: set[str] = set()

        def walk(stmts: Sequence[cst.CSTNode], scope: Scope) -> None:
            for lp in outer_loops(stmts):
                if lp not in seen_loops:
                    seen_loops.add(lp)
                    out.append(Candidate(lp, scope, main))
            for callee in self.prog.callees(non_loop_calls_scope(stmts), scope):
                if callee in seen_funcs or callee not in self.prog.scopes:
                    continue
                seen_funcs.add(callee)
                s = self.prog.scopes[callee]
                walk(list(s.body), s)

        walk(list(loop_body(main)), self.prog.loop_scope[main])
        return out
