"""Escapes: a loop that can be left midway, or that is not one block, is refused whole."""

from __future__ import annotations

import libcst as cst

from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, Refused
from flortrain.static.effects import NoEstimate
from flortrain.static.expressions import walk_no_defs
from flortrain.static.program import Loop, Program

#: why a generator's loop is refused: it is a data source, resumed by whoever iterates it
YIELDS = "`yield` inside the loop suspends it midway"


class Escapes(ChangesetRule):
    name = "escapes"
    pattern = (
        "`return`, `yield` or `await` inside the loop; a loop with `else:`, an `async for`, a loop"
        " in a class body; `del` of a name the loop does not own"
    )
    change = "no estimate"
    doc = (
        "A skipped loop is restored as one block run to its end: a loop that can return or"
        " suspend midway, whose `else:` depends on how it ended, or that runs in a class body"
        " cannot be. `return` inside a callee ends the callee normally and is fine, as is"
        " `break`."
    )
    cases = (
        Case(
            "return-inside-loop",
            """
            def train():
                for epoch in range(3):
                    for b in loader:
                        if b:
                            return b
        """,
            Refused("`return` inside the loop"),
        ),
        Case(
            "yield-inside-loop",
            """
            def batches():
                for epoch in range(3):
                    for b in loader:
                        yield b
        """,
            Refused("`yield` inside the loop"),
        ),
        Case(
            "for-else",
            """
            for epoch in range(3):
                for b in loader:
                    pass
                else:
                    pass
        """,
            Refused("`else:` clause"),
        ),
        Case(
            "while-else",
            """
            for epoch in range(3):
                while cond():
                    pass
                else:
                    pass
        """,
            Refused("`else:` clause"),
        ),
        Case(
            "async-for-inner-loop",
            """
            async def train():
                for epoch in range(3):
                    async for b in loader:
                        pass
        """,
            Refused("`async for`"),
        ),
        Case(
            "await-inside-loop",
            """
            async def train():
                for epoch in range(3):
                    for b in loader:
                        x = await fetch(b)
        """,
            Refused("`await` inside the loop"),
        ),
        Case(
            "del-of-a-name-the-loop-does-not-own",
            """
            for epoch in range(3):
                for b in loader:
                    del model
        """,
            Refused("`del model`"),
        ),
    )


def refuse_loop(prog: Program, loop: Loop) -> None:
    """Raise :class:`NoEstimate` for a loop that cannot be skipped as one block."""
    if loop.orelse is not None:
        raise NoEstimate("a loop with an `else:` clause cannot be skipped as one block")
    if isinstance(loop, cst.For) and loop.asynchronous is not None:
        raise NoEstimate("`async for` loops are not memoized")
    if loop in prog.class_body_loops:
        raise NoEstimate("loops in a class body are not memoized")


def refuse_escapes(w: Walk, s: cst.CSTNode, line: int) -> None:
    """Raise :class:`NoEstimate` for a statement that leaves the loop midway."""
    if not w.in_loop:
        return
    for n in walk_no_defs(s):
        if isinstance(n, cst.Return):
            raise NoEstimate(f"line {line}: `return` inside the loop leaves it without finishing")
        if isinstance(n, cst.Yield):
            raise NoEstimate(f"line {line}: {YIELDS}")
        if isinstance(n, cst.Await):
            raise NoEstimate(f"line {line}: `await` inside the loop")
