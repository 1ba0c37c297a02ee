"""`flortrain verify` (DETrain's protocol: two records from the start and resumes from recorded
checkpoints, every digest compared) and the names `diff` gives what diverged. Real records of
the toy script, real processes, real stores; ground truth is two plain runs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.protocol import flortrain, plain, toy_prelude

# the toy's set-up and a loop whose batches get noise from OS entropy from the third epoch on:
# epochs 0 and 1 are the same in every run, epoch 2 is not
PERTURBED = toy_prelude() + (
    "import os\n"
    "\n"
    "for epoch in range(4):\n"
    "    for x, y in train:\n"
    "        if epoch >= 2:  # an unseeded draw\n"
    "            noise = torch.Generator().manual_seed(int(os.urandom(4).hex(), 16))\n"
    "            x = x + 0.1 * torch.randn(x.shape, generator=noise)\n"
    "        opt.zero_grad()\n"
    "        loss = ((model(x) - y) ** 2).mean()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "    print(epoch, f'{loss.item():.6f}')\n"
)


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_diff_names_the_tensor_an_executed_instance_changed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PERTURBED)
    a, b = plain(script, cached=False), plain(script, cached=False)
    assert a.code == b.code == 0
    # the ground truth: two plain runs agree on epochs 0 and 1 and not after
    assert a.out.splitlines()[:2] == b.out.splitlines()[:2] and a.out != b.out
    rec = flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_PERIOD": "every"})
    assert rec.code == 0, rec.err
    probe = f"{_line(PERTURBED, 'opt.step()')}:print('P', loss.item())"
    rep = flortrain(tmp_path, "replay", "train.py", "--probe", probe)
    assert rep.code == 1, rep.err
    d = flortrain(tmp_path, "diff")
    assert d.code == 1
    named = re.findall(r"checkpoint after (\S+)@M\d+\.0\.(\d)#0: `([^`]+)`", d.out)
    # epochs 0 and 1 executed equal; epoch 2 names the weights first, then what they changed
    assert {it for _, it, _ in named} == {"2", "3"}, d.out
    at2 = [part for _, it, part in named if it == "2"]
    assert at2[0] == "module#0.weight" and "loss" in at2, d.out
    # the replay's own conclusion names it too
    assert "`module#0.weight`" in rep.err
