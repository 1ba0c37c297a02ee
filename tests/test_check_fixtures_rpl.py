"""The replay-hazard rules (RPL) and DET102/DET103 over the fixtures and over what a rule's own
cases cannot hold: the hazards the fixtures carry are found at their lines and nothing else is
(a false finding on a correct script is a bug), ``check`` says what ``record`` says, and layouts
of several directories."""

from __future__ import annotations

import os
from pathlib import Path

from flortrain.check.config import CheckConfig
from flortrain.check.finding import Severity
from flortrain.check.runner import check_paths, check_text
from tests.protocol import FIXTURES, flortrain

CODES = ("RPL", "DET102", "DET103")

#: every finding of these codes over fixtures/: the hazards their scripts really have
EXPECTED = {
    ("manual_sgd.py", 48, "RPL003"),  # p.data.add_(..)
    ("realcode/regression.py", 67, "RPL003"),
    ("realcode/word_language_model.py", 238, "RPL003"),
    ("realcode/reinforce.py", 136, "RPL005"),  # policy.saved_log_probs keeps each step's graph
    ("realcode/actor_critic.py", 200, "RPL005"),  # model.saved_actions, likewise
}

#: the suite turns record's check off (tests/conftest.py); these tests are about it
CHECK_ON = {"FLORTRAIN_CHECK": "on"}


def test_the_fixtures_hazards_are_found_and_nothing_else() -> None:
    found = check_paths([str(FIXTURES)], CheckConfig(select=CODES))
    got = {(os.path.relpath(f.path, FIXTURES), f.line, f.code) for f in found}
    assert got == EXPECTED, "\n".join(f.concise() for f in found)
    assert not [f for f in found if f.severity is Severity.ERROR]


SCRIPT = """\
class Opt:
    def __init__(self):
        self.n = 0

    def step(self):
        self.n += 1


def numbers():
    i = 0
    while True:
        i += 1
        yield i


def main(step_fn):
    opt = Opt()
    stream = numbers()
    total = 0
    for epoch in range(3):
        for x in range(4):
            step_fn(x)
            opt.step()
        for i, x in zip(range(2), stream):
            total += x
            opt.step()
        print(epoch, opt.n, total)


main(lambda x: x)
"""


def test_check_says_what_record_says(tmp_path: Path) -> None:
    """A refused loop (RPL001) and a loop over an iterator made before it (RPL004): record's
    stderr carries check's messages word for word (no torch in the script: a cheap record)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    found = check_text(str(tmp_path / "train.py"), None, CheckConfig(select=CODES))
    by_code = {f.code: f for f in found}
    assert {"RPL001", "RPL002", "RPL004"} <= set(by_code)
    record = flortrain(tmp_path, "record", "train.py", env=CHECK_ON)
    assert record.code == 0, record.err
    assert (
        f"train.py:{by_code['RPL001'].line}:{by_code['RPL001'].col}: {by_code['RPL001'].message}"
        in record.err
    )
    assert f"loop L{by_code['RPL004'].line} {by_code['RPL004'].message}" in record.err
    explain = flortrain(tmp_path, "instrument", "--explain", "train.py")
    assert by_code["RPL002"].message.split(": ", 1)[1] in explain.out


def test_a_training_module_above_the_script_is_reported_and_one_beside_it_is_not(
    tmp_path: Path,
) -> None:
    trainer = (
        "def fit(model, loader, opt):\n"
        "    for epoch in range(3):\n"
        "        for x in loader:\n"
        "            model(x).backward()\n"
        "            opt.step()\n"
    )
    script = "from pkg.trainer import fit\nfit(model, loader, opt)\n"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "trainer.py").write_text(trainer)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(script)
    (tmp_path / "beside.py").write_text(script)
    found = check_paths(
        [str(tmp_path / "scripts" / "train.py"), str(tmp_path / "beside.py")],
        CheckConfig(select=("RPL007",)),
    )
    assert [(Path(f.path).name, f.line) for f in found] == [("train.py", 1)]
    assert "outside the script's directory" in found[0].message


def test_a_file_the_static_pass_refuses_is_a_finding() -> None:
    deep = (
        "x = "
        + "+".join(["1"] * 600)
        + "\nfor i in range(2):\n    for j in range(2):\n        pass\n"
    )
    found = check_text("deep.py", deep, CheckConfig(select=CODES))
    assert [(f.code, f.message) for f in found] == [
        ("RPL008", "record refuses this file: FT004 too deeply nested for the static pass")
    ]
