"""Iteration spans: memoizing whole main-loop iterations, for step-based training loops.

Flor memoizes the loops *inside* the main loop. When the main loop's body is itself the training
step (nanoGPT's ``while True`` over ``iter_num``, a step loop over batches), an iteration costs
about as much as checkpointing it, the adaptive period checkpoints few inner instances, and a
replay with an outer probe re-runs nearly all of training. But such probes are almost always
guarded (``if iter_num % 100 == 0:``), and an iteration in which no probe can fire need not run at
all if a later iteration's starting state was checkpointed: the replay *jumps* there.

This module is the static half:

- :func:`boundary_state`: what a main-loop iteration boundary must hold for a replay to resume
  there: the loop's changeset (Flor's rules, as for any loop) plus the names an iteration reads
  before it binds them (*carried*: ``prev_loss`` read at the top of the body). A carried tensor
  that holds an autograd graph may be stored detached only if every read of it that can see the
  carried value is a value read (:mod:`flortrain.static.values`).
- :func:`probe_guard`: whether a probe in the main loop's body can fire in a given iteration,
  decidable *without running it*: the conjunction of the ``if`` tests around the probe, if it is
  a pure expression of names the iteration does not rebind before the test. Such names are either
  carried plain scalars (recorded at every boundary by the runtime: ``iter_num``) or loop
  invariants read from the live frame (``log_interval``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import libcst as cst

from flortrain.static.changeset.loop import loop_changeset
from flortrain.static.expressions import impurity, names_of, pattern_captures
from flortrain.static.plan import Boundary, Change, Guard, Restore
from flortrain.static.program import Loop, Program, Scope
from flortrain.static.values import is_target, occurrences, read_elsewhere, value_read


def boundary_state(prog: Program, loop: Loop) -> Boundary:
    """The state at a main-loop iteration boundary; raises ``NoEstimate`` when there is none."""
    cs = loop_changeset(prog, loop)
    scope = prog.loop_scope[loop]
    targets = tuple(sorted(names_of(loop.target))) if isinstance(loop, cst.For) else ()
    body = list(_suite(loop.body))
    changes: dict[str, Change] = {}
    for c in cs.changes:
        if c.restore is Restore.IN_PLACE and any(
            c.expr.startswith(o.expr + ".") for o in cs.changes if o.restore is Restore.IN_PLACE
        ):
            continue  # `model.eval` is restored with `model`
        changes[c.expr] = c
    for name in targets:
        # the item a jump lands on is restored, not taken from the iterator: skipping items runs
        # the iterable's own code in another state than the record's (RNG drawn in a generator)
        changes.setdefault(name, Change(name, Restore.REBOUND, 3, prog.line(loop)))
    exposed: dict[str, list[tuple[cst.Name, list[cst.CSTNode]]]] = {}
    for name in cs.bound:
        if name in targets:
            continue
        reads: list[tuple[cst.Name, list[cst.CSTNode]]] = []
        _first_reads(body, name, False, reads)
        if reads or name in changes:
            exposed[name] = reads
            if name not in changes:
                line = prog.line(reads[0][0])
                changes[name] = Change(name, Restore.REBOUND, 3, line)
    values = tuple(
        sorted(
            n
            for n, reads in exposed.items()
            if changes[n].restore is Restore.REBOUND
            and all(value_read(node, parents) for node, parents in reads)
            and _value_reads_after(prog, scope, loop, n) is not False
            # a name nothing reads is not proved anything (a probe reading it is then checked)
            and (reads or _value_reads_after(prog, scope, loop, n))
        )
    )
    return Boundary(
        tuple(changes.values()), values, targets, tuple(sorted(set(cs.bound) | set(targets)))
    )


def read_before_bound(loop: Loop, name: str) -> bool:
    """Whether an iteration of ``loop`` (as it is now, probes included) may read ``name`` before
    binding it: then it sees what an earlier iteration left, which a jump must restore."""
    return bool(first_reads(loop, name))


def first_reads(loop: Loop, name: str) -> list[tuple[cst.Name, list[cst.CSTNode]]]:
    """The reads of ``name`` in an iteration of ``loop`` that may see what an earlier iteration
    left (no binding before them on some path), each with its ancestors in its statement."""
    reads: list[tuple[cst.Name, list[cst.CSTNode]]] = []
    _first_reads(list(_suite(loop.body)), name, False, reads)
    return reads


def bindings(body: cst.CSTNode, line: Callable[[cst.CSTNode], int]) -> dict[str, list[int]]:
    """Each name ``body`` binds, with the lines binding it (not inside nested definitions)."""
    return _bindings(body, line)


def _value_reads_after(prog: Program, scope: Scope, loop: Loop, name: str) -> bool | None:
    """Whether ``name`` is read after (or around) the loop only as a number: True, False, or
    None when nothing there reads it."""
    if name in scope.declared_global or read_elsewhere(prog, scope, name):
        return False
    rng = prog.range(loop)
    seen = False
    for node, parents in occurrences(scope.node, name):
        if rng.start.line <= prog.line(node) <= rng.end.line or is_target(parents):
            continue
        if not value_read(node, parents):
            return False
        seen = True
    return True if seen else None


def _suite(body: cst.BaseSuite | None) -> Iterator[cst.CSTNode]:
    if body is None:
        return
    if isinstance(body, cst.SimpleStatementSuite):
        yield from body.body
    elif isinstance(body, cst.IndentedBlock):
        for s in body.body:
            if isinstance(s, cst.SimpleStatementLine):
                yield from s.body
            else:
                yield s


def _reads_in(node: cst.CSTNode, name: str) -> list[tuple[cst.Name, list[cst.CSTNode]]]:
    return [(n, p) for n, p in occurrences(node, name) if not is_target(p)]


def _first_reads(
    stmts: Sequence[cst.CSTNode],
    name: str,
    bound: bool,
    out: list[tuple[cst.Name, list[cst.CSTNode]]],
) -> bool:
    """Collect into ``out`` the reads of ``name`` in ``stmts`` that may see the value it had
    before them (not preceded, on every path, by a binding); returns whether ``name`` is bound on
    every path through them. Conservative: a loop body may not run, a ``try`` may stop anywhere."""
    for s in stmts:
        bound = _first_reads_in(s, name, bound, out)
    return bound


Reads = list[tuple[cst.Name, list[cst.CSTNode]]]


def _first_reads_in(s: cst.CSTNode, name: str, bound: bool, out: Reads) -> bool:
    """:func:`_first_reads` of one statement."""
    if isinstance(s, cst.If):
        return _if_reads(s, name, bound, out)
    if isinstance(s, cst.With):
        return _with_reads(s, name, bound, out)
    if isinstance(s, cst.For | cst.While):
        return _loop_reads(s, name, bound, out)
    if isinstance(s, cst.FunctionDef | cst.ClassDef):
        return bound or s.name.value == name
    # a small statement; or try, match, ...: every read counts, and nothing is surely bound after
    if not bound:
        out.extend(_reads_in(s, name))
    if isinstance(s, cst.Assign) and any(name in names_of(t.target) for t in s.targets):
        return True
    if isinstance(s, cst.AugAssign | cst.AnnAssign) and name in names_of(s.target):
        return bound or isinstance(s, cst.AugAssign) or s.value is not None
    return bound


def _if_reads(s: cst.If, name: str, bound: bool, out: Reads) -> bool:
    if not bound:
        out.extend(_reads_in(s.test, name))
    a = _first_reads(list(_suite(s.body)), name, bound, out)
    orelse = s.orelse
    if isinstance(orelse, cst.If):
        b = _first_reads([orelse], name, bound, out)
    elif isinstance(orelse, cst.Else):
        b = _first_reads(list(_suite(orelse.body)), name, bound, out)
    else:
        b = bound
    return a and b


def _with_reads(s: cst.With, name: str, bound: bool, out: Reads) -> bool:
    if not bound:
        for item in s.items:
            out.extend(_reads_in(item.item, name))
        if any(it.asname is not None and name in names_of(it.asname.name) for it in s.items):
            bound = True
    return _first_reads(list(_suite(s.body)), name, bound, out)


def _loop_reads(s: cst.For | cst.While, name: str, bound: bool, out: Reads) -> bool:
    """A loop's body may not run: what it binds is not surely bound after it."""
    head = s.iter if isinstance(s, cst.For) else s.test
    if not bound:
        out.extend(_reads_in(head, name))
    in_body = bound or (isinstance(s, cst.For) and name in names_of(s.target))
    _first_reads(list(_suite(s.body)), name, in_body, out)
    if s.orelse is not None:
        _first_reads(list(_suite(s.orelse.body)), name, bound, out)
    return bound


# -- probe guards ---------------------------------------------------------------------------------


def probe_guard(
    probe: cst.BaseStatement,
    ancestors: Sequence[cst.CSTNode],
    main: Loop,
    state: Boundary,
    line: Callable[[cst.CSTNode], int],
    module: cst.Module,
    rebindable: set[str],
) -> Guard | str:
    """The guard of a probe in ``main``'s body, or the reason its iterations cannot be told
    without running them. ``ancestors`` run from the probe's parent up to ``main``; ``line``
    gives a node's line in the probed script; ``rebindable`` are the names some function
    declares ``global`` or ``nonlocal`` (a call could rebind them)."""
    tests = _guard_tests(probe, ancestors, main, line, module)
    if isinstance(tests, str):
        return tests
    carried = {c.expr for c in state.changes if c.restore is Restore.REBOUND} | set(state.targets)
    changed = {c.expr.split(".")[0] for c in state.changes} | carried
    recorded: set[str] = set()
    live: set[str] = set()
    through: set[str] = set()
    bindings = _bindings(main.body, line)
    for node, _ in tests:
        bad = impurity(node.test)
        if bad:
            return f"its guard at line {line(node)} {bad}"
        for name, attr in _names(node.test):
            why = _unreadable(name, line(node), bindings, rebindable)
            if why:
                return why
            if name in carried and not attr:
                recorded.add(name)
            elif name in bindings or name in changed:
                return f"its guard reads `{name}`, which the iteration changes"
            else:
                live.add(name)
                if attr:
                    through.add(name)
    source = " and ".join(f"({t})" for _, t in tests)
    return Guard(source, tuple(sorted(recorded)), tuple(sorted(live)), tuple(sorted(through)))


def _guard_tests(
    probe: cst.BaseStatement,
    ancestors: Sequence[cst.CSTNode],
    main: Loop,
    line: Callable[[cst.CSTNode], int],
    module: cst.Module,
) -> list[tuple[cst.If, str]] | str:
    """The ``if`` tests around a probe, each as the condition under which the probe runs (``not
    (..)`` in an ``else:``); or why the probe is not guarded by them alone."""
    tests: list[tuple[cst.If, str]] = []
    if isinstance(probe, cst.If) and probe.orelse is None:
        tests.append((probe, _code(module, probe.test)))
    child: cst.CSTNode = probe
    for anc in ancestors:
        if anc is main:
            break
        if isinstance(anc, cst.If):
            t = _code(module, anc.test)
            # in its body, or in its `else:` or an `elif` chained there
            tests.append((anc, t if child is anc.body else f"not ({t})"))
        elif isinstance(anc, cst.For | cst.While):
            return f"it is inside the loop at line {line(anc)} within the main loop"
        elif isinstance(anc, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            return "it is inside a definition"
        child = anc
    if not tests:
        return "nothing guards it: it runs every iteration"
    return tests


def _unreadable(
    name: str, at: int, bindings: dict[str, list[int]], rebindable: set[str]
) -> str | None:
    """Why a guard at line ``at`` cannot read ``name`` before the iteration runs, if it cannot."""
    if name in rebindable:
        return f"its guard reads `{name}`, which a function may rebind (`global`/`nonlocal`)"
    before = sorted(ln for ln in bindings.get(name, ()) if ln < at)
    if before:
        return f"its guard reads `{name}`, which the iteration rebinds before it (line {before[0]})"
    return None


def _code(module: cst.Module, node: cst.CSTNode) -> str:
    return " ".join(module.code_for_node(node).split())


def _names(expr: cst.CSTNode) -> Iterator[tuple[str, bool]]:
    """Root names an expression reads, and whether through an attribute (``args.log_every``)."""
    if isinstance(expr, cst.Name):
        yield expr.value, False
        return
    if isinstance(expr, cst.Attribute):
        base: cst.CSTNode = expr
        while isinstance(base, cst.Attribute):
            base = base.value
        if isinstance(base, cst.Name):
            yield base.value, True
        else:
            yield from _names(base)
        return
    for c in expr.children:
        yield from _names(c)


def _bindings(body: cst.CSTNode, line: Callable[[cst.CSTNode], int]) -> dict[str, list[int]]:
    """Each name the loop body binds, with the lines binding it (not inside nested definitions,
    which bind their own locals; the definition itself binds its name)."""
    out: dict[str, list[int]] = {}

    def add(target: cst.CSTNode, at: cst.CSTNode) -> None:
        for n in names_of(target):
            out.setdefault(n, []).append(line(at))

    stack: list[cst.CSTNode] = [body]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.FunctionDef | cst.ClassDef):
            add(n.name, n)
            continue
        if isinstance(n, cst.Lambda):
            continue
        if isinstance(
            n,
            cst.AssignTarget
            | cst.AugAssign
            | cst.AnnAssign
            | cst.NamedExpr
            | cst.For
            | cst.CompFor,
        ):
            add(n.target, n)
        elif isinstance(n, cst.AsName):
            add(n.name, n)
        elif isinstance(n, cst.Del):
            add(n.target, n)
        elif isinstance(n, cst.MatchCase):
            for name in pattern_captures(n.pattern):
                out.setdefault(name, []).append(line(n))
        elif isinstance(n, cst.ImportAlias):
            bound = n.asname.name if n.asname is not None else n.name
            if isinstance(bound, cst.Name):
                add(bound, n)
            elif isinstance(bound, cst.Attribute):
                root: cst.CSTNode = bound
                while isinstance(root, cst.Attribute):
                    root = root.value
                add(root, n)
        stack.extend(n.children)
    return out
