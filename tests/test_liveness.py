"""Liveness at a loop's exit: the loop-scoped filter keeps a name the loop binds only if some path
from the loop's exit reads it before rebinding it.

The static cases put one training loop binding ``out`` in a main loop, then the code after it,
and pin whether ``out`` stays in the changeset; the protocol test records and replays the
tutorial shape, whose test loop rebinds ``outputs`` after training; it steps by hand:
torch.optim's first step imports torch._dynamo, about a CPU-second a process.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from flortrain.static.analysis import analyse
from flortrain.static.plan import Block
from flortrain.static.source import parse
from tests.protocol import block_states, flortrain, replay_matches_plain

HEAD = """\
import torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.randn(3, 2) for _ in range(2)]
c = len(data) > 1
model.eval()  # a method, not the builtin `eval`
"""

TRAIN = """\
for epoch in range(2):
    for x in data:
        out = model(x)
        out.sum().backward()
        opt.step()
"""


def block_of(src: str, prefix: str = "") -> Block:
    plan = analyse(parse("train.py", src), prefix)
    assert len(plan.blocks) == 1, plan.explain()
    return plan.blocks[0]


def kept(after: str, train: str = TRAIN) -> bool:
    b = block_of(HEAD + train + dedent(after))
    return "out" in {c.expr for c in b.changeset}


LIVE = {
    "read": "print(out)\n",
    "read in one branch": "if c:\n    out = 1\nprint(out)\n",
    "read in a branch before rebinding": "if c:\n    print(out)\nout = 2\nprint(out)\n",
    "a later loop reads before rebinding": "for y in data:\n    print(out)\n    out = y\n",
    "a later loop may run no iteration": "for y in data:\n    out = y\nprint(out)\n",
    "a later loop may break before rebinding": "for y in data:\n    if c:\n        break\n    out = y\nprint(out)\n",
    "a while loop's test reads it": "while out is None:\n    out = 1\n",
    "an exception before rebinding reaches the handler": (
        "try:\n    out = model(data[0])\nexcept Exception:\n    print(out)\n"
    ),
    "a finally reads it": "try:\n    out = model(data[0])\nfinally:\n    print(out)\n",
    "a with block that may swallow the exception": (
        "import contextlib\nwith contextlib.suppress(ValueError):\n    out = model(data[0])\nprint(out)\n"
    ),
    "a function called after the loop reads the global": "def show():\n    print(out)\nshow()\n",
    "a lambda reads it later": "f = lambda: out\nout = 0\nprint(f())\n",
    "a generator expression reads it lazily": "g = (out for _ in data)\nout = 0\nprint(list(g))\n",
    "a generator expression reads it lazily in a call that keeps it": (
        "g = map(abs, (out for _ in data))\nout = 0\nprint(list(g))\n"
    ),
    "a builtin of that name the script rebinds may keep it": (
        "def sum(it):\n    return it\ng = sum(out for _ in data)\nout = 0\nprint(list(g))\n"
    ),
    "a comprehension reads it": "print([out for _ in data])\nout = 0\n",
    "del reads it": "del out\n",
    "augmented assignment reads first": "out += 1\n",
    "a match reads it": "match c:\n    case True:\n        out = 1\nprint(out)\n",
    "locals() reads every name": "print(len(locals()))\nout = 0\nprint(out)\n",
}

DEAD = {
    "rebound before any read": "out = 0\nprint(out)\n",
    "rebound on every branch": "if c:\n    out = 1\nelse:\n    out = 2\nprint(out)\n",
    "a later loop rebinds it first": "for y in data:\n    out = model(y)\n    print(out.sum().item())\n",
    "a later loop's target rebinds it": "for out in data:\n    print(out.shape)\n",
    "a grad-mode with block rebinds it": "with torch.no_grad():\n    out = model(data[0])\nprint(out)\n",
    "rebound by an import": "from os import sep as out\nprint(out)\n",
    "rebound by a def": "def out():\n    return 1\nprint(out())\n",
    "a function that binds its own local": "def show():\n    out = 3\n    print(out)\nshow()\n",
    "the try rebinds it before anything can raise": "try:\n    out = 1\n    print(out)\nexcept ValueError:\n    pass\n",
    "never mentioned again": "print('done')\n",
    "a generator expression a builtin consumes at once": (
        "out = 0\nprint(sum(out for _ in data), max(y + out for y in range(2)))\n"
    ),
    "a generator expression's outermost iterable is read where it is made": (
        "out = data\ng = (y for y in out)\nprint(list(g))\n"
    ),
}


@pytest.mark.parametrize("after", LIVE.values(), ids=list(LIVE))
def test_a_name_read_before_rebinding_after_the_loop_stays_in_the_changeset(after: str) -> None:
    assert kept(after)


@pytest.mark.parametrize("after", DEAD.values(), ids=list(DEAD))
def test_a_name_rebound_before_any_read_after_the_loop_is_dropped(after: str) -> None:
    assert not kept(after)


def test_the_next_instance_of_the_loop_reading_it_first_keeps_it() -> None:
    """The main loop's back edge: the next epoch's batch loop reads ``out`` before rebinding it."""
    train = "out = torch.zeros(3, 1)\n" + TRAIN.replace(
        "out = model(x)", "out = model(x) + out.detach()"
    )
    assert kept("", train=train)


def test_a_name_only_the_loop_mentions_is_kept_when_its_next_instance_reads_it_first() -> None:
    """Mentioned nowhere outside the loop's lines, ``h`` is still read by the next epoch's
    instance before it is rebound: a skipped instance must leave it as the record did."""
    train = TRAIN.replace(
        "        out = model(x)\n",
        "        if epoch == 0:\n            h = 0\n        h = h + 1\n        out = model(x)\n",
    )
    b = block_of(HEAD + train)
    assert "h" in {c.expr for c in b.changeset}, b


def test_the_rest_of_the_main_loop_body_reading_it_keeps_it() -> None:
    assert kept("", train=TRAIN + "    print(out.sum().item())\n")


def test_a_function_loops_names_are_dead_when_it_returns() -> None:
    """word_language_model's ``train()``: ``start_time`` bound before the batch loop and rebound
    in it is read by nothing once the function returns."""
    src = HEAD + dedent(
        """\
        import time
        def train():
            start_time = time.time()
            total = 0.0
            for x in data:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                total += loss.item()
                elapsed = time.time() - start_time
                start_time = time.time()
            return total
        for epoch in range(2):
            print(train())
        """
    )
    names = {c.expr for c in block_of(src).changeset}
    assert names == {"opt", "total"}, names


def test_a_global_the_function_declares_stays() -> None:
    src = HEAD + dedent(
        """\
        best = 0.0
        def train():
            global best
            for x in data:
                best = model(x).sum().item()
                model(x).sum().backward()
                opt.step()
        for epoch in range(2):
            train()
        """
    )
    assert "best" in {c.expr for c in block_of(src).changeset}


def test_a_project_modules_names_are_read_by_its_importers() -> None:
    """An imported module's body ends with its names read by whoever imports it."""
    assert "out" in {c.expr for c in block_of(HEAD + TRAIN, prefix="helpers:").changeset}
    assert "out" not in {c.expr for c in block_of(HEAD + TRAIN).changeset}


def test_explain_names_the_read_that_keeps_a_name() -> None:
    src = HEAD + TRAIN + "out = out + 1\n"
    plan = analyse(parse("train.py", src))
    line = src.splitlines().index("out = out + 1") + 1
    assert (
        f"changeset: out [rebound] rule 2 line 9, read after the loop at line {line}"
        in plan.explain()
    )


# -- the tutorial shape, recorded and replayed -------------------------------------------------------
TUTORIAL = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
criterion = torch.nn.CrossEntropyLoss()
lr = 0.1
train_loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(5)]
test_loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(2)]

for epoch in range(3):
    for i, (images, labels) in enumerate(train_loader):
        outputs = model(images)
        loss = criterion(outputs, labels)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            model.weight.add_(model.weight.grad, alpha=-lr)
            model.bias.add_(model.bias.grad, alpha=-lr)
        if (i + 1) % 5 == 0:
            print(f"Epoch {epoch + 1}, Step {i + 1}, Loss: {loss.item():.4f}")
    #PROBE

with torch.no_grad():
    correct = 0
    total = 0
    for images, labels in test_loader:
        outputs = model(images)
        _, predicted = torch.max(outputs.data, 1)
        total += labels.size(0)
        correct += (predicted == labels).sum().item()
    print(f"Accuracy: {100 * correct / total} %")
"""


def test_the_tutorial_batch_loop_is_checkpointed_and_skipped(tmp_path: Path) -> None:
    """``outputs`` (with its autograd graph) and ``loss`` are rebound by the test loop before any
    read: the batch loop is checkpointed, and an outer probe's replay skips every instance."""
    env = {"FLORTRAIN_PERIOD": "every"}
    rep = replay_matches_plain(
        tmp_path, TUTORIAL, 'print("PROBE", epoch, model.weight.sum().item())', env=env
    )
    assert block_states(tmp_path / ".flortrain", 1) == {"checkpointed": 3}
    assert block_states(tmp_path / ".flortrain", 2) == {"skipped": 3}, rep.err
    assert "autograd graph" not in rep.err
    explain = flortrain(tmp_path, "instrument", "--explain", "train.py")
    assert "outputs" not in explain.out and "memoized for loop L11" in explain.out, explain.out


def test_explain_gives_every_loop_not_memoized_a_reason_in_the_scripts_lines() -> None:
    text = TUTORIAL.replace("    #PROBE\n", "")
    plan = analyse(parse("train.py", text))
    lines = text.splitlines()
    memoized = {b.span.line for b in plan.blocks} | {m.span.line for m in plan.main_loops}
    loops = [i + 1 for i, ln in enumerate(lines) if ln.lstrip().startswith("for ")]
    plain = [line for line in loops if line not in memoized]
    assert plain == [25], (loops, memoized)  # the test loop after training
    for line in plain:
        reasons = [r for r in plan.explain().splitlines() if r.startswith(f"train.py:{line}:")]
        assert len(reasons) == 1 and "not memoized: " in reasons[0], reasons


HELPER = TUTORIAL.replace(
    "for epoch in range(3):\n",
    "def report():\n    pass\n\n\nfor epoch in range(3):\n",
).replace("    #PROBE\n", "    report()\n")


def test_a_probe_in_a_function_reading_a_dropped_global_executes_the_loop(tmp_path: Path) -> None:
    """``outputs`` is not in the batch loop's changeset (the test loop rebinds it first); a probe
    added to a function the main loop calls reads the training value as a global, so the loop's
    instances execute instead of leaving the value from before the loop."""
    text = HELPER.replace("def report():\n    pass\n", "def report():\n    #PROBE\n    pass\n")
    probe = 'print("PROBE", f"{outputs.sum().item():.6f}")'
    rep = replay_matches_plain(tmp_path, text, probe, env={"FLORTRAIN_PERIOD": "every"})
    assert "may read `outputs`" in rep.err, rep.err
