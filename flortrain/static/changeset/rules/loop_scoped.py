"""The loop-scoped filter: a name the loop binds that nobody reads after it is not restored."""

from __future__ import annotations

from flortrain.static.changeset.rule import Case, ChangesetRule, R
from flortrain.static.effects import Effects, NoEstimate
from flortrain.static.expressions import root
from flortrain.static.liveness import inner_reads, liveness_of
from flortrain.static.plan import Change
from flortrain.static.program import Loop, Program, Scope


class LoopScoped(ChangesetRule):
    name = "loop-scoped"
    pattern = "a name the loop binds (an assignment, the loop variable, `with .. as`, `import`, a `case` capture, a walrus)"
    change = "dropped, unless a path from the loop's exit reads it before rebinding it"
    doc = (
        "Flor drops every variable defined in the loop's body, assuming nobody reads it after the"
        " loop; flortrain drops only those liveness (`static/liveness.py`) shows no path from the"
        " loop's exit reads, the next instance of the loop included. A read in another function"
        " that sees the name counts. An `except .. as` name is unbound when its handler ends."
    )
    cases = (
        Case(
            "loop-scoped-dropped-used-after-kept",
            """
            for epoch in range(3):
                for b in loader:
                    loss = model(b)
                    last = model(b)
                print(last)
        """,
            {("last", R)},
        ),
        Case(
            "rebound-before-the-next-instance-reads-it-is-dropped",
            """
            for epoch in range(3):
                seen = 0
                for b in loader:
                    seen = seen + 1
        """,
            set(),
        ),
        Case(
            "read-by-the-next-instance-is-kept",
            """
            seen = 0
            for epoch in range(3):
                for b in loader:
                    seen = seen + 1
        """,
            {("seen", R)},
        ),
        Case(
            "use-in-a-function-counts-as-outside",
            """
            def report():
                print(best)

            for epoch in range(3):
                for b in loader:
                    best = b
                report()
        """,
            {("best", R)},
        ),
        Case(
            "loop-variable-used-after",
            """
            for epoch in range(3):
                for step, b in enumerate(loader):
                    pass
                print(step)
        """,
            {("step", R)},
        ),
        Case(
            "with-as-import-names-used-after",
            """
            for epoch in range(3):
                for b in loader:
                    with open(b) as fh:
                        pass
                    import json as codec
                print(fh, codec)
        """,
            {("fh", R)},
        ),  # an imported module is the same object on replay: nothing to restore
        Case(
            "match-captures-used-after",
            """
            for epoch in range(3):
                for b in loader:
                    match b:
                        case {"x": Point(x=px)}:
                            pass
                        case [head, *tail]:
                            pass
                print(px, head, tail, Point)
        """,
            {("px", R), ("head", R), ("tail", R)},
        ),
        Case(
            "except-as-name-is-not-restored",
            """
            for epoch in range(3):
                for b in loader:
                    try:
                        pass
                    except ValueError as err:
                        pass
                print(err)
        """,
            set(),
        ),
        Case(
            "walrus-binding",
            """
            for epoch in range(3):
                for b in loader:
                    if (n := len(b)) > 2:
                        pass
                print(n)
        """,
            {("n", R)},
        ),
    )


def filter_changes(
    prog: Program,
    scope: Scope,
    loop: Loop,
    fx: Effects,
    defined: dict[str, tuple[int, str]],
) -> tuple[list[Change], dict[str, int]]:
    """The changes a skipped loop must restore, and the names it binds that stay because a path
    from its exit reads them (with the line of such a read; 0 for a project module's importers).
    ``defined``: the names the loop binds by ``def``/``class``, which cannot be restored."""
    live = liveness_of(prog).after(loop)
    if live is None:  # the scope reads its names behind the analysis' back: all of them, by lines
        rng = prog.range(loop)
        live = _names_used_outside(prog, scope, rng.start.line, rng.end.line)
    kept: list[Change] = []
    read_after: dict[str, int] = {}
    for ch in fx.changes.values():
        r = root(ch.expr)
        if r in fx.bound and r not in live and not ch.is_global and r not in scope.declared_global:
            continue  # loop-scoped: no path from the loop's exit reads it before rebinding it
        if r in fx.bound and r in live:
            read_after.setdefault(r, live[r])
        if r in prog.imported and not ch.is_global:
            continue
        if ch.expr in defined:
            # pickled by reference, a function would come back as whatever the name holds when
            # the checkpoint is read; its code, defaults and closure cannot be stored faithfully
            line, kind = defined[ch.expr]
            raise NoEstimate(
                f"line {line}: {kind} `{ch.expr}` is defined inside the loop and used after it;"
                " a skipped loop cannot restore it"
            )
        kept.append(ch)
    return kept, read_after


def _names_used_outside(prog: Program, scope: Scope, start: int, end: int) -> dict[str, int]:
    """Every name mentioned outside the loop's lines, or by another scope that sees it (the
    fallback where liveness cannot answer)."""
    used = {n: line for n, line in scope.names if not start <= line <= end}
    for n, line in inner_reads(prog, scope).items():
        used.setdefault(n, line)
    return used
