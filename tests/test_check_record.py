"""``flortrain record`` warns of ``flortrain check``'s findings before training, once each, on
stderr, and changes nothing the script prints or computes; ``--no-check`` and
``FLORTRAIN_CHECK=off`` silence it. With torch, the check runs in the static pass's forked child:
the training process never imports libcst for it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.protocol import flortrain, plain

#: an unsorted directory listing (DET101, a warning) feeding a pure-Python training loop
LISTING = textwrap.dedent("""\
    import os
    import random
    os.makedirs("data", exist_ok=True)
    for name in ("b", "a", "c"):
        open(os.path.join("data", name), "w").close()
    names = os.listdir("data")
    random.seed(0)
    w = 0.0
    for epoch in range(3):
        for name in sorted(names):
            w += random.random() * len(name)
        print(f"epoch {epoch} w {w:.6f}")
""")
FINDING = "flortrain: check: train.py:6:9: DET101 "

#: the suite turns record's check off (tests/conftest.py); these tests are about it
CHECK_ON = {"FLORTRAIN_CHECK": "on"}


def _findings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("flortrain: check: ")]


def test_record_warns_once_per_finding_and_changes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(LISTING)
    truth = plain(script)
    assert truth.code == 0, truth.err
    rec = flortrain(tmp_path, "record", "train.py", env=CHECK_ON)
    assert rec.code == 0 and rec.out == truth.out, rec.err
    found = _findings(rec.err)
    assert len(found) == 1 and found[0].startswith(FINDING), rec.err
    # the same findings as `flortrain check` reports
    checked = flortrain(tmp_path, "check", "--output-format", "json", "train.py")
    assert found == [
        f"flortrain: check: {f['path']}:{f['line']}:{f['col']}: {f['code']} {f['message']}"
        for f in json.loads(checked.out)
    ], checked.out
    # printed before training, not among what the run says at its end
    assert rec.err.index(FINDING) < rec.err.index("flortrain: record run 1 ")
    for quiet in (
        flortrain(tmp_path, "record", "--no-check", "train.py", env=CHECK_ON),
        flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_CHECK": "off"}),
    ):
        assert quiet.code == 0 and quiet.out == truth.out, quiet.err
        assert _findings(quiet.err) == [], quiet.err
    bad = flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_CHECK": "maybe"})
    assert bad.code == 2 and bad.err.startswith("FT050 FLORTRAIN_CHECK='maybe'"), bad.err


#: a torch script with the same hazard, telling whether its process imported libcst
TORCH = textwrap.dedent("""\
    import os
    import sys
    import torch
    files = os.listdir(".")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(16, 4)
    for epoch in range(2):
        for i in range(0, 16, 8):
            loss = model(data[i:i + 8]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")
    print("libcst imported:", "libcst" in sys.modules)
""")


def test_the_check_runs_in_the_forked_static_pass(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TORCH)
    truth = plain(script)
    assert truth.code == 0 and truth.out.endswith("libcst imported: False\n"), truth.err
    rec = flortrain(tmp_path, "record", "train.py", env=CHECK_ON)
    assert rec.code == 0 and rec.out == truth.out, rec.err
    assert [f.split(" DET101 ")[0] for f in _findings(rec.err)] == [
        "flortrain: check: train.py:4:9:"
    ], rec.err


def test_record_follows_the_projects_check_configuration(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LISTING)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.flortrain.check]\nignore = ["DET101"]\n')
    rec = flortrain(tmp_path, "record", "train.py", env=CHECK_ON)
    assert rec.code == 0 and _findings(rec.err) == [], rec.err
    # a configuration check cannot read stops the check, not the training run
    pyproject.write_text('[tool.flortrain.check]\nselect = "DET"\n')
    rec = flortrain(tmp_path, "record", "train.py", env=CHECK_ON)
    assert rec.code == 0 and rec.out == plain(tmp_path / "train.py").out, rec.err
    assert _findings(rec.err) == [
        "flortrain: check: not run: pyproject.toml: FT070 [tool.flortrain.check] select must be"
        " a list of strings"
    ], rec.err


def test_each_finding_is_printed_once_and_a_refusal_record_states_is_not_repeated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flortrain.check.before_record import Checked, warn
    from flortrain.check.finding import Finding, Severity

    def at(line: int, code: str) -> Finding:
        return Finding("train.py", line, 5, code, "m", Severity.ERROR)

    warn(Checked((at(3, "DET101"), at(3, "DET101"), at(7, "RPL001"), at(9, "RPL001"))), [7])
    assert capsys.readouterr().err.splitlines() == [
        "flortrain: check: train.py:3:5: DET101 m",
        "flortrain: check: train.py:9:5: RPL001 m",
    ]
