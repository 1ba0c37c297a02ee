"""Property tests of the static pass on generated programs (hypothesis, hypothesmith).

Whatever the program, ``instrument_file`` either returns code that compiles or refuses with a
clean :class:`FlortrainError` (a one-line, located reason): it never raises anything else. Two
sources of programs:

- hypothesmith's grammar-based programs: odd but valid Python, the corners a hand-written
  fixture never reaches (decorators, walrus, nested comprehensions, ``global``, star targets);
- training-loop-shaped programs built here: nested ``for``/``while`` loops with assignments,
  augmented assignments, calls, method calls, ``if``/``break``/``continue``, nested functions
  and an outer loop that prints, which is what the changeset rules and the transform act on.

Examples are derandomized, so CI runs the same ones every time; the budget keeps the whole file
within seconds.
"""

from __future__ import annotations

import warnings

import hypothesmith
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flortrain.errors import FlortrainError
from flortrain.instrument import instrument_file

# hypothesmith compiles what it generates, and `1()` compiles with a SyntaxWarning
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


def _instrumented_or_refused(source: str) -> int:
    """The number of memoized loops in the plan, or -1 for a clean refusal."""
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", SyntaxWarning
        )  # generated `1()` and the like compile, with a warning
        try:
            result = instrument_file("gen.py", source)
        except FlortrainError as e:
            assert e.one_line().strip() and "\n" not in e.one_line()
            return -1
        compile(result.code_text, "gen.py", "exec")
    return len(result.plan.blocks)


@SETTINGS
@given(hypothesmith.from_grammar())
@example("for i in range(3):\n    for j in range(2):\n        x = i * j\n    print(x)\n")
@example("while True:\n    break\n")
def test_grammar_programs(source: str) -> None:
    _instrumented_or_refused(source)


@SETTINGS
@given(hypothesmith.from_node())
def test_syntax_tree_programs(source: str) -> None:
    _instrumented_or_refused(source)


NAMES = st.sampled_from(["w", "b", "total", "loss", "step", "acc", "lr", "hist", "state"])
EXPRS = st.one_of(
    st.integers(-3, 9).map(str),
    NAMES,
    st.tuples(NAMES, st.sampled_from(["+", "-", "*"]), st.integers(1, 5)).map(
        lambda t: f"{t[0]} {t[1]} {t[2]}"
    ),
    NAMES.map(lambda n: f"f({n})"),
    NAMES.map(lambda n: f"len([{n}])"),
)


def _statement(depth: int) -> st.SearchStrategy[list[str]]:
    simple = st.one_of(
        st.tuples(NAMES, EXPRS).map(lambda t: [f"{t[0]} = {t[1]}"]),
        st.tuples(NAMES, st.sampled_from(["+=", "-=", "*="]), EXPRS).map(
            lambda t: [f"{t[0]} {t[1]} {t[2]}"]
        ),
        NAMES.map(lambda n: [f"hist.append({n})"]),
        NAMES.map(lambda n: [f"print({n})"]),
        st.just(["state['k'] = step"]),
    )
    if depth == 0:
        return simple
    inner = st.lists(_statement(depth - 1), min_size=1, max_size=3).map(
        lambda ls: [ln for s in ls for ln in s]
    )
    indent = inner.map(lambda lines: ["    " + ln for ln in lines])
    return st.one_of(
        simple,
        st.tuples(NAMES, st.integers(1, 4), indent).map(
            lambda t: [f"for {t[0]} in range({t[1]}):", *t[2]]
        ),
        st.tuples(NAMES, indent).map(lambda t: [f"while {t[0]} < 3:", f"    {t[0]} += 1", *t[1]]),
        st.tuples(NAMES, indent).map(lambda t: [f"if {t[0]} > 1:", *t[1]]),
        indent.map(
            lambda lines: [
                "for _i in range(2):",
                *lines,
                "    if _i:",
                "        break",
                "    continue",
            ]
        ),
        st.tuples(NAMES, indent).map(
            lambda t: [f"def g_{t[0]}():", *t[1], f"    return {t[0]}", f"{t[0]} = g_{t[0]}()"]
        ),
    )


def test_a_shaped_program_is_memoized() -> None:
    # the shaped generator's programs are the kind the static pass memoizes: not a vacuous pass
    body = "    for step in range(3):\n        loss = f(step)\n        total += loss\n        hist.append(loss)\n"
    assert (
        _instrumented_or_refused(
            PRELUDE + "for epoch in range(2):\n" + body + "    print(epoch, total)\n"
        )
        == 1
    )


PRELUDE = "w = b = total = loss = step = acc = lr = 0\nhist = []\nstate = {}\n\ndef f(v):\n    return v\n\n"


@SETTINGS
@given(st.lists(_statement(3), min_size=1, max_size=4))
def test_training_loop_shaped_programs(body: list[list[str]]) -> None:
    lines = [ln for stmt in body for ln in stmt]
    source = (
        PRELUDE
        + "for epoch in range(2):\n"
        + "".join(f"    {ln}\n" for ln in lines)
        + "    print(epoch, total)\n"
    )
    compile(source, "gen.py", "exec")  # the generator's own check: the input is valid Python
    _instrumented_or_refused(source)
