"""Which graph-carrying loop outputs are provably read only as numbers (static/values.py)."""

from __future__ import annotations

import textwrap

import pytest

from flortrain.static.analysis import analyse
from flortrain.static.source import parse


def values_of(src: str) -> tuple[str, ...]:
    plan = analyse(parse("t.py", textwrap.dedent(src)))
    (block,) = plan.blocks
    return block.values


NANOGPT = """
    for it in range(10):
        for micro in range(4):
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / 4
            loss.backward()
        opt.step()
        {after}
"""


@pytest.mark.parametrize(
    ("after", "value_only"),
    [
        ("lossf = loss.item() * 4", True),
        ("print(f'{loss:.4f}')", True),
        ("print(f'{loss.mean() * 4:.4f}')", True),
        ("print(float(loss))", True),
        ("print(loss)", False),  # prints grad_fn=
        ("print(f'{loss}')", False),  # no format spec: the tensor's repr
        ("loss.backward()", False),
        ("total = total + loss", False),
        ("losses.append(loss)", False),
        ("f = lambda: loss.item()", False),
        ("loss.mul_(2).item()", False),
    ],
)
def test_reads_after_the_loop(after: str, value_only: bool) -> None:
    assert ("loss" in values_of(NANOGPT.format(after=after))) is value_only


def test_carried_hidden_state_detached_first_is_value_only() -> None:
    src = """
        for epoch in range(3):
            hidden = init()
            for x in data:
                hidden = hidden.detach()
                out, hidden = model(x, hidden)
                out.sum().backward()
            print(f"{hidden.norm().item():.4f}")
    """
    assert values_of(src) == ("hidden",)


@pytest.mark.parametrize(
    "body",
    [
        "out, hidden = model(x, hidden)\nout.sum().backward()",  # the graph spans instances
        "if x:\n    hidden = model(x)\nhidden.sum().backward()",  # a conditional rebind
    ],
)
def test_reads_before_an_unconditional_rebind_are_not_value_only(body: str) -> None:
    src = (
        "hidden = init()\n"
        "for epoch in range(3):\n"
        "    for x in data:\n"
        + textwrap.indent(body, " " * 8)
        + "\n    print(f'{hidden.norm().item():.4f}')\n"
    )
    assert "hidden" not in values_of(src)


def test_a_global_read_by_a_function_is_not_value_only() -> None:
    src = """
        def report():
            print(loss)

        for it in range(3):
            for x in data:
                loss = model(x)
                loss.backward()
            report()
    """
    assert values_of(src) == ()


def test_returned_name_is_not_value_only() -> None:
    src = """
        def train(data):
            for epoch in range(3):
                for x in data:
                    loss = model(x)
                    loss.backward()
            return loss
    """
    assert values_of(src) == ()
