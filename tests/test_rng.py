"""RNG streams: the memo that spares re-hashing an unchanged stream must never hand back a stale
digest (``diff`` compares these digests between a record and its replay), and numpy's stream is
captured only once the script has imported ``numpy.random``.

The script trains by hand (a torch.optim optimizer imports torch._dynamo, about a CPU-second a
process); the streams it draws from are torch's and numpy's either way."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

# the streams these tests compare include numpy's only once numpy.random is imported
import numpy.random
import torch

from flortrain.runtime import rng
from tests.protocol import replay_matches_plain


def _variants(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The state, then copies that each differ from it in one part of one stream only."""
    name, key, pos, has_gauss, gauss = state["numpy"]
    r = state["random"]
    flipped = state["torch"].clone()
    flipped[-1] ^= 1
    other_key = key.copy()
    other_key[0] ^= 1
    return [
        state,
        {**state, "random": (r[0], (*r[1][:-1], r[1][-1] + 1), r[2])},  # its position only
        {**state, "numpy": (name, other_key, pos, has_gauss, gauss)},
        {**state, "numpy": (name, key, pos + 1, has_gauss, gauss)},
        {**state, "numpy": (name, key, pos, 1 - has_gauss, gauss)},
        {**state, "numpy": (name, key, pos, has_gauss, gauss + 0.5)},  # the cached Gaussian only
        {**state, "torch": flipped},
        state,
    ]


def test_a_memoized_digest_is_the_digest_of_the_state_given() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    memo: dict[str, tuple[bytes, str]] = {}
    seen = []
    for state in _variants(rng.capture()):
        got = rng.digest_map(state, memo)
        assert got == rng.digest_map(state)
        seen.append(tuple(sorted(got.items())))
    assert len(set(seen)) == len(seen) - 1  # every variant told apart; the last is the first again


def test_a_stream_the_script_draws_from_gets_a_new_digest_with_the_memo() -> None:
    memo: dict[str, tuple[bytes, str]] = {}
    first = rng.digest_map(rng.capture(), memo)
    np.random.standard_normal()  # numpy moves, and caches the second Gaussian of its pair
    second = rng.digest_map(rng.capture(), memo)
    assert second["numpy"] != first["numpy"]
    assert {k: v for k, v in second.items() if k != "numpy"} == {
        k: v for k, v in first.items() if k != "numpy"
    }
    torch.rand(3)
    random.random()
    third = rng.digest_map(rng.capture(), memo)
    assert third["torch"] != second["torch"] and third["random"] != second["random"]
    assert third == rng.digest_map(rng.capture())


def test_numpys_stream_is_not_captured_or_imported_before_the_script_imports_it() -> None:
    """numpy 2 imports ``numpy.random`` on first use. Capturing the streams must not import it
    for the script (about 40 ms), and until it is imported nothing can have drawn from it."""
    code = (
        "import sys, numpy, torch\n"
        "from flortrain.runtime import rng\n"
        "assert 'numpy.random' not in sys.modules, 'numpy imported its random module itself'\n"
        "first = rng.capture()\n"
        "assert 'numpy' not in first and 'numpy.random' not in sys.modules, sorted(first)\n"
        "numpy.random.seed(3)\n"
        "then = rng.capture()\n"
        "assert then['numpy'][2] == 624 and sorted(then) == ['numpy', 'random', 'torch'], sorted(then)\n"
        "rng.restore(first)  # a state without numpy's stream leaves that stream alone\n"
        "assert rng.digest_map(rng.capture())['numpy'] == rng.digest_map(then)['numpy']\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr


#: the toy script's model and batches, trained by hand; numpy's stream joins from the third epoch
MIDWAY = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
train = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]

for epoch in range(6):
    if epoch == 2:
        import numpy.random
        numpy.random.seed(5)
    for x, y in train:
        noise = float(numpy.random.normal()) if epoch >= 2 else 0.0
        loss = ((model(x) - y - noise) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
        model.zero_grad()
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}")
"""


def test_a_script_that_imports_numpy_random_midway_replays_exactly(tmp_path: Path) -> None:
    """numpy's stream appears in the checkpoints from the third epoch on: the earlier ones do not
    hold it, the later ones restore it, and ``diff`` compares it from where it first appears."""
    probe = 'print(f"PROBE {epoch} {model.weight.sum().item():.6f} {numpy.random.get_state()[2] if epoch >= 2 else -1}")'
    rep = replay_matches_plain(tmp_path, MIDWAY, probe, {"FLORTRAIN_PERIOD": "every"})
    # every epoch restored from its checkpoint, those without numpy's stream and those with it
    assert "6 block instances skipped, 0 executed" in rep.err, rep.err
