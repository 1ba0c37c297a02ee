"""The randomness and GPU-determinism rules (RNG002, RNG003, DET001-DET004) on the fixtures: no
false error on the clean scripts, and each seed taken away or moved found at the first draw it
leaves unseeded, which a plain run confirms is a real hazard."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from flortrain.check.config import CheckConfig
from flortrain.check.finding import Finding, Severity
from flortrain.check.runner import check_paths, check_text
from tests.protocol import FIXTURES, plain, probe_lines

CODES = ("RNG002", "RNG003", "DET001", "DET002", "DET003", "DET004")
CONFIG = CheckConfig(select=CODES)
SEED = re.compile(r"^([ \t]*)(?:random\.seed|np\.random\.seed|torch\.manual_seed)\(.*\)\n", re.M)


def _found(path: Path, text: str | None = None) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in check_text(str(path), text, CONFIG)]


def test_fixtures_have_no_error_and_only_the_known_warnings() -> None:
    found: list[Finding] = check_paths([str(FIXTURES)], CONFIG)
    assert [f.concise() for f in found if f.severity is Severity.ERROR] == []
    # CPU scripts with convolutions and NLLLoss: warnings (errors only where a file uses CUDA)
    where = sorted((Path(f.path).name, f.code, f.line) for f in found)
    assert where == [
        ("dcgan.py", "DET001", 92),
        ("dcgan.py", "DET001", 96),
        ("dcgan.py", "DET001", 120),
        ("dcgan.py", "DET001", 123),
        ("dcgan.py", "DET001", 127),
        ("mnist.py", "DET001", 32),
        ("mnist.py", "DET001", 33),
        ("mnist.py", "DET001", 67),
        ("mnist.py", "DET001", 87),
        ("numpy_augment.py", "DET001", 33),
        ("word_language_model.py", "DET001", 171),
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # the first draw on the path is main()'s, not make_data()'s defined above it
        ("functions_main.py", [("RNG002", 66)]),
        ("while_early_stop.py", [("RNG002", 29)]),
        # one finding per stream, each at its own first draw
        ("random_shuffle.py", [("RNG002", 18), ("RNG002", 30)]),
        ("numpy_augment.py", [("RNG002", 20)]),
        ("rnn_hidden.py", [("RNG002", 25)]),
        ("realcode/dcgan.py", [("RNG002", 67)]),
        ("realcode/word_language_model.py", [("RNG002", 147)]),
    ],
)
def test_unseeded_fixture_found_at_its_first_draw(
    name: str, expected: list[tuple[str, int]]
) -> None:
    path = FIXTURES / name
    text = SEED.sub(r"\1pass\n", path.read_text())
    assert text != path.read_text()
    assert [f for f in _found(path, text) if f[0] == "RNG002"] == expected


def _seeded_by(tmp_path: Path, call_at_top: bool) -> Path:
    """random_shuffle.py with its seeds set by ``seeds.seed_all`` from a project module,
    called where the seeds were or after the first draws."""
    shutil.copy(FIXTURES / "random_shuffle.py", tmp_path / "train.py")
    (tmp_path / "seeds.py").write_text(
        "import random\n\nimport numpy as np\nimport torch\n\n\ndef seed_all(seed):\n"
        "    random.seed(seed)\n    np.random.seed(seed)\n    torch.manual_seed(seed)\n"
    )
    text = SEED.sub("", (tmp_path / "train.py").read_text())
    text = text.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport seeds\n")
    call = "seeds.seed_all(6)\n"
    if call_at_top:
        text = text.replace("\nn, d = 200, 5\n", f"\n{call}n, d = 200, 5\n")
    else:
        text = text.replace("\n\ndef main():", f"{call}\n\ndef main():")
    (tmp_path / "train.py").write_text(text)
    return tmp_path / "train.py"


def test_seed_in_a_project_helper_counts(tmp_path: Path) -> None:
    script = _seeded_by(tmp_path, call_at_top=True)
    assert _found(script) == []
    # the helper seeds exactly what the fixture's own three lines did
    original = plain(FIXTURES / "random_shuffle.py")
    assert original.code == 0
    assert probe_lines(plain(script).out) == probe_lines(original.out)


def test_seed_in_a_project_helper_after_the_draw(tmp_path: Path) -> None:
    script = _seeded_by(tmp_path, call_at_top=False)
    assert _found(script) == [("RNG002", 16)]  # X = torch.randn(n, d), before seeds.seed_all()
    assert script.read_text().splitlines()[15].startswith("X = torch.randn(")


def test_unseeded_stream_is_a_real_hazard(tmp_path: Path) -> None:
    """Only ``random.seed`` gone: RNG002 names that stream alone, and two plain runs of the
    script differ, as the finding says."""
    script = tmp_path / "train.py"
    script.write_text(
        (FIXTURES / "random_shuffle.py").read_text().replace("\nrandom.seed(6)\n", "\n")
    )
    assert _found(script) == [("RNG002", 29)]
    first, second = plain(script, cached=False), plain(script, cached=False)
    assert first.code == second.code == 0
    assert first.out != second.out


def test_seed_from_the_clock_in_a_fixture() -> None:
    path = FIXTURES / "module_level.py"
    text = path.read_text().replace("torch.manual_seed(0)", "torch.manual_seed(int(time.time()))")
    text = "import time\n" + text
    assert ("RNG003", 22) in _found(path, text)
