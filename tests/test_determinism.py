"""``record --deterministic`` and ``run --deterministic``: per-example generators (DETrain).

Each test first shows the script is not repeatable as ``python`` runs it (two plain runs, or two
worker counts, print different numbers: what makes the test able to fail), then that its
deterministic records print the same numbers however the work is scheduled, and that replays
with probes print what ``flortrain run --deterministic`` prints for the probed script (the
ground truth in this mode, itself checked against a deterministic record).

The scripts train by hand: their subject is the draws, not the optimizer, and torch.optim's first
call imports torch._dynamo, about a CPU-second per plain run (a deterministic flortrain process
imports it anyway, through ``torch.use_deterministic_algorithms``).
"""

from __future__ import annotations

from pathlib import Path

from tests.protocol import flortrain, plain

EVERY = {"FLORTRAIN_PERIOD": "every"}
#: a parallel replay divided evenly, however little the division saves on this machine
PARALLEL = {"FLORTRAIN_SEGMENTS": "even"}

# numpy's global stream, unseeded, drawn from by four threads: plain runs differ
POOL = """\
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

torch.manual_seed(0)


def augment(x):
    noise = np.random.normal(size=x.shape).astype("float32")
    return x + torch.from_numpy(noise) * 0.1


def augmented(xs):
    with ThreadPoolExecutor(4) as ex:
        return torch.stack(list(ex.map(augment, xs)))


data = torch.randn(64, 4)
model = torch.nn.Linear(4, 1)
for epoch in range(4):
    total = 0.0
    for step in range(4):
        x = augmented(data[step * 16 : (step + 1) * 16])
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            model.weight.sub_(0.1 * model.weight.grad)
            model.bias.sub_(0.1 * model.bias.grad)
        total += loss.item()
    #PROBE
    print(f"epoch {epoch} loss {total:.6f}")
"""

# random augmentation in __getitem__ from python's, numpy's and torch's global streams
LOADED = """\
import random
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
workers = int(sys.argv[1])
persistent = len(sys.argv) > 2


class Noisy(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 4)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        jitter = np.random.uniform(-0.1, 0.1, size=4).astype("float32")
        return self.x[i] * random.random() + torch.from_numpy(jitter) + torch.randn(4) * 0.01


loader = DataLoader(
    Noisy(48), batch_size=8, shuffle=True, num_workers=workers, persistent_workers=persistent
)
model = torch.nn.Linear(4, 1)
for epoch in range(3):
    total = 0.0
    for x in loader:
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            model.weight.sub_(0.05 * model.weight.grad)
            model.bias.sub_(0.05 * model.bias.grad)
        total += loss.item()
    #PROBE
    print(f"epoch {epoch} loss {total:.6f}")
"""


def _numbers(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("epoch")]


OUTER = 'print(f"w {model.weight.sum().item():.6f}")'


def _inner(text: str) -> str:
    """``text`` with a probe in its inner loop (every instance of that loop then runs)."""
    return text.replace(
        "        total += loss.item()\n",
        '        total += loss.item()\n        print(f"x {x.sum().item():.6f}")\n',
    ).replace("#PROBE", "")


def _replays_exactly(tmp: Path, probed: str, args: list[str]) -> None:
    """The ``probed`` script replayed serially and on two workers against the latest record
    prints what ``run --deterministic`` prints for it, and ``diff`` agrees."""
    script = tmp / "train.py"
    script.write_text(probed)
    truth = flortrain(tmp, "run", "--deterministic", "train.py", *args)
    assert truth.code == 0, truth.err
    for jobs, env in (("1", None), ("2", PARALLEL)):
        rep = flortrain(tmp, "replay", "--jobs", jobs, "train.py", env=env)
        assert rep.code == 0, rep.err
        assert rep.out == truth.out, rep.err
        assert "replaying serially" not in rep.err
        assert flortrain(tmp, "diff").code == 0


def test_a_thread_pool_drawing_from_numpys_stream_repeats_under_deterministic(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    text = POOL
    script.write_text(text.replace("#PROBE", ""))
    first, second = plain(script, cached=False), plain(script, cached=False)
    assert first.code == second.code == 0
    assert _numbers(first.out) != _numbers(second.out)  # scheduling and entropy show

    records = [
        flortrain(tmp_path, "record", "--deterministic", "train.py", env=EVERY) for _ in "ab"
    ]
    assert all(r.code == 0 for r in records), records[0].err
    assert records[0].out == records[1].out
    assert len(_numbers(records[0].out)) == 4
    assert "1 draw(s) in data-parallel regions rewritten" in records[0].err
    assert "1 pool submission(s) keyed" in records[0].err
    run = flortrain(tmp_path, "run", "--deterministic", "train.py")
    assert run.code == 0 and run.out == records[1].out, run.err

    _replays_exactly(tmp_path, text.replace("#PROBE", OUTER), [])
    _replays_exactly(tmp_path, _inner(text), [])


def test_dataset_augmentation_is_the_same_for_any_number_of_workers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(LOADED.replace("#PROBE", ""))
    by_workers = [plain(script, [n]).out for n in ("0", "2")]
    assert _numbers(by_workers[0]) != _numbers(by_workers[1])  # each worker its own stream

    outs = []
    for args in (["0"], ["1"], ["2"], ["2", "persistent"]):
        rec = flortrain(tmp_path, "record", "--deterministic", "train.py", *args, env=EVERY)
        assert rec.code == 0, rec.err
        assert "persistent_workers=True" not in rec.err  # no limitation left to warn of
        outs.append(rec.out)
    assert len(_numbers(outs[0])) == 3
    assert all(out == outs[0] for out in outs)

    # the latest record is the persistent one: an outer probe restores epochs, an inner one
    # re-executes them
    _replays_exactly(tmp_path, LOADED.replace("#PROBE", OUTER), ["2", "persistent"])
    _replays_exactly(tmp_path, _inner(LOADED), ["2", "persistent"])


def test_a_seed_changes_the_numbers_and_is_stored_with_the_run(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOADED.replace("#PROBE", ""))
    runs = [
        flortrain(tmp_path, "run", "--deterministic", *seed, "train.py", "0")
        for seed in ([], ["--seed", "0"], ["--seed", "7"])
    ]
    assert all(r.code == 0 for r in runs), runs[0].err
    assert runs[0].out == runs[1].out != runs[2].out
    rec = flortrain(tmp_path, "record", "--deterministic", "--seed", "7", "train.py", "0")
    assert rec.code == 0 and rec.out == runs[2].out, rec.err
    # the replay takes the seed from the run, not from a flag
    probed = LOADED.replace("#PROBE", OUTER)
    (tmp_path / "train.py").write_text(probed)
    truth = flortrain(tmp_path, "run", "--deterministic", "--seed", "7", "train.py", "0")
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0 and rep.out == truth.out, rep.err


def test_seed_without_deterministic_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    for cmd in ("record", "run"):
        r = flortrain(tmp_path, cmd, "--seed", "3", "train.py")
        assert r.code == 2, r.err
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and "--seed" in lines[0] and "Traceback" not in r.err
