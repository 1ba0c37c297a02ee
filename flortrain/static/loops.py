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
            if isinstance(
                c,
                cst.BaseSuite
                | cst.BaseStatement
                | cst.ExceptHandler
                | cst.Else
                | cst.Finally
                | cst.MatchCase,
            ):
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


def _training_call(prog: Program, nodes: Sequence[cst.CSTNode]) -> int | None:
    """The line of the first ``x.backward()``, ``torch.autograd.backward(..)`` or ``opt.step()``
    (a ``step`` whose receiver is not a scheduler) in ``nodes``."""
    for call in prog.calls_in(nodes):
        f = call.func
        if not isinstance(f, cst.Attribute):
            continue
        name = f.attr.value
        receiver = prog.code(f.value).lower()
        if name == "backward" or (name == "step" and "sched" not in receiver):
            return prog.line(call)
    return None


#: why a script's loop nest is its main loop when no nest visibly trains (its step may sit in a
#: module it imports): ``flortrain check`` does not report such a nest's refusals
FALLBACK_MAIN = "the outermost loop that contains another loop (no backward() or step() found)"


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
        """The main loops, in line order; :attr:`why` says why each was chosen and
        :attr:`passed_over` why other loop nests were not.

        An outermost loop nest is a main loop. When some nests train (a ``backward()`` or an
        optimizer ``step()`` is reachable from their body) and others do not (inference over a
        list of layers, a final evaluation), only the training ones are: a nest whose training
        step hides behind a call the pass cannot resolve (``layer.train(x)`` on an element of a
        list) must not make the inference nest the main loop. And when the only training loop's
        body is itself the step (``while True:`` over iterations, no inner loop), it is chosen.

        Only the script falls back on a nest that does not visibly train (its step may sit in a
        module it imports): in an imported module, a loop that does not train is not a main loop."""
        nests = self._outermost(self.qualifying)
        trains = {lp: self.training_line(lp) for lp in nests}
        self.why: dict[Loop, str] = {}
        self.passed_over: list[tuple[Loop, str]] = []
        training = [lp for lp in nests if trains[lp] is not None]
        if not training:
            steps = [
                lp
                for lp in self._outermost([lp for s in self.prog.scopes.values() for lp in s.loops])
                if lp not in self.prog.class_body_loops
            ]
            trains.update({lp: self.training_line(lp) for lp in steps})
            training = [
                lp for lp in steps if trains[lp] is not None and not self._under_any(lp, nests)
            ]
            for lp in training:
                self.why[lp] = (
                    f"its body is the training step (line {trains[lp]}); it contains no other loop"
                )
        if not training and self.prog.exports:
            # an imported module where nothing trains (a tokenizer, a data loader's setup): its
            # loops are plain code, run from the script's own main loop or before it
            why = "not a main loop: nothing in this module trains (no backward() or step()); it runs as plain code"
            self.passed_over.extend((lp, why) for lp in nests)
            return []
        for lp in nests:
            if not training:
                self.why[lp] = FALLBACK_MAIN
            elif trains[lp] is not None:
                self.why[lp] = f"it contains the training step (line {trains[lp]})"
            else:
                lines = ", ".join(str(self.prog.line(t)) for t in training)
                self.passed_over.append(
                    (
                        lp,
                        f"not a main loop: it does not train, and the loop at line {lines} does; it runs as plain code",
                    )
                )
        return sorted(training or nests, key=self.prog.line)

    def _outermost(self, loops: list[Loop]) -> list[Loop]:
        """The loops not lexically inside another one of them, nor in a function it reaches."""
        dominated: set[Loop] = set()
        for q in loops:
            reach = self.prog.reachable(list(loop_body(q)), self.prog.loop_scope[q])
            for lp in loops:
                if lp is q:
                    continue
                if self._lexically_inside(lp, q) or self.prog.loop_scope[lp].qualname in reach:
                    dominated.add(lp)
        return [lp for lp in loops if lp not in dominated]

    def _under_any(self, loop: Loop, nests: list[Loop]) -> bool:
        qual = self.prog.loop_scope[loop].qualname
        return any(
            self._lexically_inside(loop, n)
            or qual in self.prog.reachable(list(loop_body(n)), self.prog.loop_scope[n])
            for n in nests
        )

    def training_line(self, loop: Loop) -> int | None:
        """The line of a ``backward()`` or optimizer ``step()`` the loop's body reaches, lexically
        or through calls to local functions; None when there is none."""
        scope = self.prog.loop_scope[loop]
        body = list(loop_body(loop))
        found = _training_call(self.prog, body)
        if found is not None:
            return found
        for q in sorted(self.prog.reachable(body, scope)):
            found = _training_call(self.prog, list(self.prog.scopes[q].body))
            if found is not None:
                return found
        return None

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
