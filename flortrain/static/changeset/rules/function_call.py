"""Rule 5: a function called for its effect, unknown to the analysis, gives no estimate."""

from __future__ import annotations

import libcst as cst

from flortrain.static import library
from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, P, Refused
from flortrain.static.changeset.rules import library_knowledge
from flortrain.static.effects import NoEstimate
from flortrain.static.expressions import object_expr


class FunctionCall(ChangesetRule):
    number = 5
    name = "function-call"
    pattern = "`func(...)`"
    change = "no estimate"
    doc = (
        "A function called for its effect may change anything. Not for a module-local function"
        " (its body is analysed: `callees`), a pure builtin the script does not rebind (`print`,"
        " `len`), a builtin known to mutate an argument (`next(it)`) or a library function whose"
        " behaviour is known (`library-knowledge`)."
    )
    cases = (
        Case(
            "rule5-unknown-function",
            """
            for epoch in range(3):
                for b in loader:
                    mystery(b)
        """,
            Refused("rule 5: call to `mystery()`"),
        ),
        Case(
            "rule5-lambda-call",
            """
            for epoch in range(3):
                for b in loader:
                    (lambda v: v)(b)
        """,
            Refused("rule 5"),
        ),
        Case(
            "rule5-not-for-pure-builtins",
            """
            for epoch in range(3):
                for b in loader:
                    print(b)
                    len(b)
                    isinstance(b, int)
        """,
            set(),
        ),
        Case(
            "rule5-for-a-builtin-name-the-script-rebinds",
            """
            print = make_printer()
            for epoch in range(3):
                for b in loader:
                    print(b)
        """,
            Refused("rule 5: call to `print()`"),
        ),
        Case(
            "mutating-builtin-next",
            """
            it = iter(data)
            for epoch in range(3):
                for b in loader:
                    next(it)
        """,
            {("it", P)},
        ),
    )


def function_call(w: Walk, call: cst.Call, func: cst.Name, line: int, assigned: bool) -> int:
    """Apply rule 2 (``assigned``) or 5 to ``func(...)``; return the rule that fired."""
    name = func.value
    if name in library.MUTATING_BUILTINS and not w.scope_shadows(name):
        library_knowledge.mutated_arg(w, call, library.MUTATING_BUILTINS[name], line)
        if name == "next" and call.args and call.args[0].keyword is None:
            it = object_expr(call.args[0].value, w.module)
            if it is not None:
                w.fx.advanced.setdefault(w.through_alias(it), line)
        return 2
    if name in w.prog.imported:
        library_knowledge.library_call(w, name, call, line)
        return 2
    if assigned or (name in library.PURE_BUILTINS and not w.scope_shadows(name)):
        return 2
    raise NoEstimate(f"line {line}: rule 5: call to `{name}()` has no side-effect estimate")


def unnamed_call(w: Walk, func: cst.BaseExpression, line: int, assigned: bool) -> int:
    """A call of an expression that names no function (``(lambda v: v)(b)``, ``fs[0](x)``)."""
    if not assigned:
        raise NoEstimate(
            f"line {line}: rule 5: call to `{w.prog.code(func)}` has no side-effect estimate"
        )
    return 2
