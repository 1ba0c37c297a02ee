"""`flortrain verify` (DETrain's protocol: two records from the start and resumes from recorded
checkpoints, every digest compared) and the names `diff` gives what diverged. Real records of
the toy script, real processes, real stores; ground truth is two plain runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tests.protocol import TOY, flortrain, plain, toy_prelude

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


def test_verify_passes_on_the_deterministic_toy(tmp_path: Path) -> None:
    shutil.copy(TOY, tmp_path / "train.py")
    # the ground truth: two plain runs print the same
    assert plain(tmp_path / "train.py", cached=False).out == plain(tmp_path / "train.py").out
    r = flortrain(tmp_path, "verify", "--json", "-k", "2", "train.py")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["schema"] == 1 and report["reproducible"] is True
    assert report["first_divergence"] is None and report["hazards"] == []
    runs = {run["name"]: run for run in report["runs"]}
    assert list(runs) == ["record 2", "resume at M16 iteration 1", "resume at M16 iteration 2"]
    # three epochs: three boundaries, two of them checkpointed, three block instances
    assert (runs["record 2"]["boundaries"], runs["record 2"]["checkpoints"]) == (3, 5)
    assert runs["record 2"]["lines"] == 3
    assert runs["resume at M16 iteration 2"]["checkpoints"] == 1
    assert all(run["identical"] and run["divergences"] == [] for run in runs.values())
    # nothing of verify's is left in the directory: its store was temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_verify_names_the_first_divergent_iteration_and_tensor(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PERTURBED)
    r = flortrain(tmp_path, "verify", "-k", "1", "train.py")
    assert r.code == 1, r.out + r.err
    lines = r.out.splitlines()
    assert lines[0].startswith("verify train.py: NOT reproducible")
    block = f"L{_line(PERTURBED, 'for x, y in train:')}"
    main = f"M{_line(PERTURBED, 'for epoch in range(4):')}"
    first = next(ln for ln in lines if ln.startswith("first divergence"))
    assert first == (
        f"first divergence (record 2): main loop {main} iteration 2, block {block}"
        f" (checkpoint {block}@{main}.0.2#0): `module#0.weight`, `loss`"
    ), r.out
    # the resume (the middle boundary, iteration 2) diverges where the record did
    assert f"  resume at {main} iteration 2: " in r.out
    # the script's volatile seed is a hazard flortrain check finds, and one the mode leaves
    assert "RNG003" in r.out and "remains under --deterministic" in r.out


# the toy's set-up, a large reduction in the loss, and the second run of the directory switching
# to one thread from the third epoch on: a float sum split over two threads rounds otherwise
THREADS = toy_prelude() + (
    "import os\n"
    "\n"
    "torch.set_num_threads(2)\n"
    "big = torch.randn(4_000_000)\n"
    "runs = int(open('runs.txt').read()) if os.path.exists('runs.txt') else 0\n"
    "with open('runs.txt', 'w') as f:\n"
    "    f.write(str(runs + 1))\n"
    "\n"
    "for epoch in range(4):\n"
    "    if epoch == 2 and runs == 1:\n"
    "        torch.set_num_threads(1)\n"
    "    for x, y in train:\n"
    "        opt.zero_grad()\n"
    "        loss = ((model(x) - y) ** 2).mean() + 1e-3 * (big * model.weight.sum()).sum()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "    print(epoch, f'{loss.item():.9f}')\n"
)


def test_verify_names_where_a_changed_thread_count_diverges(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(THREADS)
    # the ground truth: the first plain run and the second agree until the third epoch
    a, b = plain(script, cached=False), plain(script, cached=False)
    assert a.out.splitlines()[:2] == b.out.splitlines()[:2] and a.out != b.out
    (tmp_path / "runs.txt").unlink()
    r = flortrain(tmp_path, "verify", "--json", "-k", "1", "train.py")
    assert r.code == 1, r.out + r.err
    report = json.loads(r.out)
    first = report["first_divergence"]
    block = f"L{_line(THREADS, 'for x, y in train:')}"
    assert (first["run"], first["kind"], first["iteration"], first["block"]) == (
        "record 2",
        "state",
        2,
        block,
    )
    assert first["names"][0] == "module#0.weight"
    # the third run of the directory (the resume) has two threads again, as the first had
    resumed = report["runs"][1]
    assert resumed["name"].startswith("resume at") and resumed["identical"] is True


def test_verify_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("for i in range(2):\n    pass\nx = (\n")
    (tmp_path / "crash.py").write_text("print('hi')\nraise ValueError('boom')\n")
    cases = {
        ("nope.py",): "nope.py: FT001 no such file",
        ("bad.py",): "bad.py:3:5: FT002 syntax error: '(' was never closed",
        ("crash.py",): "FT080 record 1 of crash.py exited 1: ValueError: boom",
        ("-k", "-1", "crash.py"): "flortrain: Invalid value for '-k' / '--resumes'",
    }
    for args, said in cases.items():
        r = flortrain(tmp_path, "verify", *args)
        assert r.code == 2 and r.out == "", (args, r.out, r.err)
        assert len(r.err.splitlines()) == 1 and r.err.startswith(said), (args, r.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py", "crash.py"]
