"""The clock, the environment or the process id deciding how often a training loop runs."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.clocks import clock_names, is_clock_call
from flortrain.static.loops import loop_body
from flortrain.static.plan import Plan
from flortrain.static.program import Loop, Program, Scope

_ENV = frozenset({"os.getenv", "os.environ.get", "os.environ.__getitem__"})
_PID = frozenset({"os.getpid", "os.getppid", "threading.get_ident", "threading.get_native_id"})
_WHY = {
    "clock": "reads the clock: record and replay run a different number of iterations",
    "environment": "reads the environment: a replay run under another environment runs another number of iterations",
    "process id": "reads the process id, which differs in every run: so does the number of iterations",
}


class ClockLoopControl(Rule):
    code = f"{Family.DETERMINISM}103"
    name = "clock-loop-control"
    severity = Severity.ERROR
    message = "loop control reads the clock"
    hint = "bound the loop by a count (of steps or epochs) fixed before training, not by time"
    doc = (
        "A training loop that stops on the clock (`if time.time() > deadline: break`,"
        " `while time.time() - t0 < budget:`), on an environment variable read as it runs, or on"
        " the process id runs a different number of iterations in another run: a replay that"
        " executes the loop reads the clock anew and trains a different stretch, so its output"
        " cannot match the record's. (Clock readings a loop only prints or stores are fine:"
        " the replay leaves them out of its comparison, `static/clocks.py`.) Reported in"
        " training loops (the main loop, the loops in it, the functions it calls) where a `while`"
        " test, a `for` header or an `if` test that leads to `break`, `continue` or `return` reads"
        " a clock, directly or through names made only from clock readings (`deadline = t0 +"
        " budget`), `os.environ`/`os.getenv`, or `os.getpid()`. An environment variable read once"
        " in a `for` header (`range(int(os.environ['EPOCHS']))`) is configuration, like the command"
        " line, and is not reported: the replay must run under the same one. A clock read through a helper"
        " function or another module is not seen."
    )
    valid = (
        Valid(
            """
            import time
            for epoch in range(3):
                t0 = time.time()
                for x in data:
                    model(x).backward()
                print(time.time() - t0)
            """
        ),
        # the environment read once, as configuration: the same at replay as at record
        Valid(
            """
            import os
            for epoch in range(int(os.environ.get("EPOCHS", 3))):
                for x in data:
                    model(x).backward()
            """
        ),
        Valid(
            """
            import time
            deadline = time.time() + 5
            while time.time() < deadline:
                pass
            """
        ),
    )
    invalid = (
        Invalid(
            """
            import time
            deadline = time.time() + 3600
            for epoch in range(100):
                for x in data:
                    model(x).backward()
                if time.time() > deadline:
                    break
            """,
            line=6,
            col=8,
        ),
        Invalid(
            """
            import time
            t0 = time.time()
            budget = 60
            while time.time() - t0 < budget:
                for x in data:
                    model(x).backward()
            """,
            line=4,
            col=7,
        ),
        Invalid(
            """
            import os
            for epoch in range(100):
                for x in data:
                    model(x).backward()
                    if os.environ.get("STOP"):
                        break
            """,
            line=5,
            col=12,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        p = plan_facts.plan(unit)
        prog = plan_facts.program(unit)
        if p is None or prog is None or not _mentions_source(unit.text):
            return
        clocks: dict[str, set[str]] = {}
        for loop in _training_loops(prog, p):
            scope = prog.loop_scope[loop]
            for test in _controls(loop):
                kind = _source(unit, prog, scope, test, clocks)
                if kind == "environment" and isinstance(loop, cst.For) and test is loop.iter:
                    continue  # read once, as configuration (`range(int(os.environ["EPOCHS"]))`)
                if kind is not None:
                    yield Hit(test, message=f"loop control {_WHY[kind]}")


def _mentions_source(text: str) -> bool:
    return any(k in text for k in ("time", "datetime", "environ", "getenv", "getpid", "get_ident"))


def _training_loops(prog: Program, p: Plan) -> Iterator[Loop]:
    mains = [plan_facts.loop_at(prog, m.span) for m in plan_facts.training_mains(p).values()]
    roots = [m for m in mains if m is not None]
    reached: set[str] = set()
    for m in roots:
        reached |= prog.reachable(list(loop_body(m)), prog.loop_scope[m])
    for scope in prog.scopes.values():
        for lp in scope.loops:
            up: Loop | None = lp
            while up is not None and up not in roots:
                up = prog.loop_parent.get(up)
            if up is not None or scope.qualname in reached:
                yield lp


def _controls(loop: Loop) -> Iterator[cst.BaseExpression]:
    """The expressions that decide how often ``loop`` runs: its ``while`` test or ``for``
    iterable, and the tests of ``if`` statements in its body that lead out of an iteration."""
    yield loop.test if isinstance(loop, cst.While) else loop.iter
    stack: list[cst.CSTNode] = list(loop_body(loop))
    while stack:
        n = stack.pop()
        if isinstance(n, cst.For | cst.While | cst.FunctionDef | cst.ClassDef | cst.Lambda):
            continue
        if isinstance(n, cst.If) and _leaves(n):
            yield n.test
        stack.extend(
            c
            for c in n.children
            if isinstance(c, cst.BaseSuite | cst.BaseStatement | cst.If | cst.Else)
        )


def _leaves(node: cst.If) -> bool:
    """Whether the ``if``'s own branches (not nested loops) break, continue or return."""
    stack: list[cst.CSTNode] = [node.body, *([node.orelse] if node.orelse else [])]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Break | cst.Continue | cst.Return):
            return True
        if not isinstance(n, cst.For | cst.While | cst.FunctionDef | cst.ClassDef | cst.Lambda):
            stack.extend(n.children)
    return False


def _source(
    unit: Unit, prog: Program, scope: Scope, test: cst.BaseExpression, clocks: dict[str, set[str]]
) -> str | None:
    """What run-dependent source ``test`` reads, if any."""
    stack: list[cst.CSTNode] = [test]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call):
            names = unit.called(n)
            if is_clock_call(n):
                return "clock"
            if names & _ENV:
                return "environment"
            if names & _PID:
                return "process id"
        elif isinstance(n, cst.Subscript) and "os.environ" in unit.qualified_names(n.value):
            return "environment"
        elif isinstance(n, cst.Name):
            owner = prog.binding_scope(scope, n.value)
            if owner is not None and _is_clock_name(prog, owner, n.value, clocks):
                return "clock"
        if isinstance(n, cst.Lambda):
            continue
        stack.extend(n.children)
    return None


def _is_clock_name(prog: Program, scope: Scope, name: str, cache: dict[str, set[str]]) -> bool:
    """Whether ``name`` of ``scope`` holds only clock readings and values made from them
    (:func:`clock_names`, asked about the name and the names its bindings read)."""
    key = f"{scope.qualname}:{name}"
    if key not in cache:
        candidates = {name}
        todo = [name]
        while todo and len(candidates) < 32:
            for value in scope.assigned.get(todo.pop(), []):
                for n in _names_in(value):
                    if n not in candidates and n in scope.bound:
                        candidates.add(n)
                        todo.append(n)
        cache[key] = clock_names(prog, scope, candidates)
    return name in cache[key]


def _names_in(node: cst.CSTNode | None) -> Iterator[str]:
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            yield n.value
        elif not isinstance(n, cst.Lambda):
            stack.extend(n.children)
