"""Files a script reads and writes: a replay sees each as its record saw it, or refuses.

Ground truth is ``python script.py`` as everywhere. A file the record read that has changed
since is refused by name (an input the script's arithmetic depends on); a file the record wrote
is put back, at the replay's start, as the record found it, and a skipped instance or a jump
leaves the files as the record's instance left them.

Scripts train by hand, or are pure Python where no tensor is involved, unless the optimizer is
part of the subject (a script that saves and reloads its optimizer's state): torch.optim's first
call imports torch._dynamo, about a CPU-second per process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.protocol import flortrain, plain, probe_lines

EVERY = {"FLORTRAIN_PERIOD": "every"}

# -- inputs: a configuration file and a data file -----------------------------------------------
CONFIGURED = """\
import json
import torch

cfg = json.load(open("config.json"))
data = torch.load("data.pt")
torch.manual_seed(0)
model = torch.nn.Linear(4, cfg["hidden"])
x, y = data["x"], data["y"]
for epoch in range(4):
    for i in range(0, 64, cfg["batch"]):
        xb, yb = x[i:i + cfg["batch"]], y[i:i + cfg["batch"]]
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    #PROBE
    print(f"epoch {epoch} {loss.item():.6f}")
"""


def _write_inputs(tmp: Path, batch: int, hidden: int = 2) -> None:
    (tmp / "config.json").write_text(json.dumps({"batch": batch, "hidden": hidden}))


def _recorded(tmp: Path, text: str, probe: str) -> Path:
    """``text`` as ``train.py`` under ``tmp``: its plain run, its record (every instance
    checkpointed) asserted to print python's bytes, then ``probe`` put in its ``#PROBE`` line."""
    script = tmp / "train.py"
    script.write_text(text)
    truth = plain(script)
    rec = flortrain(tmp, "record", "train.py", env=EVERY)
    assert rec.code == 0 and rec.out == truth.out, rec.err
    script.write_text(text.replace("#PROBE", probe))
    return script


def test_a_replay_refuses_inputs_changed_since_the_record_unless_told(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(1)
    torch.save({"x": torch.randn(64, 4), "y": torch.randint(0, 2, (64,))}, tmp_path / "data.pt")
    _write_inputs(tmp_path, batch=8)
    _recorded(tmp_path, CONFIGURED, 'print("PROBE", epoch, round(model.bias.sum().item(), 6))')

    _write_inputs(tmp_path, batch=16)  # the batch size: silently mixed output before
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 2, rep.err
    (line,) = rep.err.strip().splitlines()
    assert line.startswith("config.json: FT033 ") and "record 1" in line, line

    _write_inputs(tmp_path, batch=8, hidden=3)  # the width: a raw load_state_dict traceback before
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 2 and rep.err.startswith("config.json: FT033 "), rep.err

    _write_inputs(tmp_path, batch=8)
    (tmp_path / "data.pt").write_bytes((tmp_path / "data.pt").read_bytes() + b"\0")
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 2 and rep.err.startswith("data.pt: FT033 "), rep.err

    _write_inputs(tmp_path, batch=16)
    rep = flortrain(tmp_path, "replay", "--allow-changed-inputs", "train.py", env=EVERY)
    assert "FT033" not in rep.err and "replay run 2 of record 1" in rep.err, rep.err
    assert "--allow-changed-inputs" in rep.err and "config.json" in rep.err, rep.err
    assert probe_lines(rep.out), rep.err


# -- outputs: a best-model checkpoint, wiped at the start -----------------------------------------
BEST = """\
import os
import shutil
import torch

shutil.rmtree("ckpt", ignore_errors=True)
os.makedirs("ckpt")
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
x = torch.randn(64, 4)
y = torch.randint(0, 2, (64,))
xv, yv = torch.randn(32, 4), torch.randint(0, 2, (32,))
best = float("inf")
for epoch in range(10):
    if epoch % 4 == 3:
        #PROBE
        pass
    for step in range(8):
        xb, yb = x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8]
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
    with torch.no_grad():
        val = torch.nn.functional.cross_entropy(model(xv), yv).item()
    if val < best:
        best = val
        torch.save(model.state_dict(), "ckpt/best.pt")
model.load_state_dict(torch.load("ckpt/best.pt"))
with torch.no_grad():
    print("best", round(best, 6), round(torch.nn.functional.cross_entropy(model(xv), yv).item(), 6))
"""


def test_a_best_checkpoint_saved_in_jumped_iterations_is_there_after_the_loop(
    tmp_path: Path,
) -> None:
    # the plain run leaves ckpt/best.pt behind, as an earlier run would
    script = _recorded(tmp_path, BEST, 'print("PROBE", epoch, round(best, 6))')
    want = plain(script, cached=False)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert rep.out == want.out, rep.err
    assert "main-loop iterations jumped over" in rep.err, rep.err
    assert flortrain(tmp_path, "diff").code == 0
    # divided, one worker's save would reach another's load: such a replay stays serial
    par = flortrain(
        tmp_path, "replay", "train.py", "--jobs", "2", env={**EVERY, "FLORTRAIN_SEGMENTS": "even"}
    )
    assert par.code == 0 and par.out == want.out, par.err
    assert "replaying serially: the script reads back files it writes (ckpt/best.pt)" in par.err, (
        par.err
    )


# -- outputs: a log the memoized loop appends to, read back after the loop ------------------------
LOGGED = """\
import os
import random

if os.path.exists("log.csv"):
    os.remove("log.csv")
rng = random.Random(0)
data = [(rng.gauss(0, 1), rng.gauss(0, 1)) for _ in range(64)]
w = 0.0
for epoch in range(4):
    for step in range(8):
        batch = data[step * 8:(step + 1) * 8]
        loss = sum((w * a - b) ** 2 for a, b in batch) / 8
        w -= 0.1 * sum(2 * (w * a - b) * a for a, b in batch) / 8
        with open("log.csv", "a") as f:
            f.write(f"{epoch},{step},{loss:.6f}\\n")
    #PROBE
rows = open("log.csv").read().splitlines()
print(len(rows), rows[-1], sum(float(r.split(",")[2]) for r in rows))
"""


def test_a_log_a_skipped_instance_appended_to_is_as_the_record_left_it(tmp_path: Path) -> None:
    """The skipped inner loop's lines reach the file: restoring an instance puts back the
    files it wrote, as it left them."""
    script = _recorded(tmp_path, LOGGED, 'print("PROBE", epoch, len(open("log.csv").readlines()))')
    want = plain(script)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0 and rep.out == want.out, rep.err
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


# -- outputs: a script that resumes from its own last checkpoint -----------------------------------
RESUMING = """\
import os
import time
import torch

with open(f"events-{time.time_ns()}.log", "w") as events:  # a TensorBoard-like log, named by the run
    events.write("start\\n")
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4)
y = torch.randint(0, 2, (64,))
start = 0
if os.path.exists("last.pt"):
    ck = torch.load("last.pt")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    start = ck["epoch"] + 1
for epoch in range(start, 5):
    for step in range(8):
        xb, yb = x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    #PROBE
    print(f"epoch {epoch} {loss.item():.6f}")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, "last.pt.tmp")
    os.replace("last.pt.tmp", "last.pt")
print("done", round(model.weight.sum().item(), 6))
"""


def test_a_script_that_resumes_from_its_own_checkpoint_replays_from_where_its_record_began(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    last = tmp_path / "last.pt"
    script.write_text(RESUMING)
    truth = plain(script, cached=False)
    last.unlink()  # the record starts from scratch, as the plain run did
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.code == 0 and rec.out == truth.out and "epoch 4" in rec.out, rec.err
    kept = tmp_path / "kept.pt"
    shutil.copy(last, kept)  # what the record left
    script.write_text(
        RESUMING.replace("#PROBE", 'print("PROBE", epoch, round(model.bias.sum().item(), 6))')
    )
    last.unlink()
    want = plain(script, cached=False)
    shutil.copy(kept, last)
    logs = set(tmp_path.glob("events-*.log"))
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert rep.out == want.out, rep.err
    # set aside for the replay, the record's own log is back where it was; its last.pt too
    assert logs < set(tmp_path.glob("events-*.log")), rep.err
    assert "set aside" in rep.err and "kept in" not in rep.err, rep.err
    assert "5 block instances skipped, 0 executed" in rep.err, rep.err
    assert flortrain(tmp_path, "diff").code == 0


OUTSIDE = """\
import sys

out = sys.argv[1]
total = 0
for epoch in range(3):
    for step in range(4):
        total += step
    with open(out, "w") as f:
        f.write(str(total))
    #PROBE
print(open(out).read())
"""


def test_a_file_written_outside_the_working_directory_and_read_back_is_refused_by_name(
    tmp_path: Path,
) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    script = work / "train.py"
    script.write_text(OUTSIDE)
    rec = flortrain(work, "record", "train.py", str(elsewhere / "out.txt"))
    assert rec.code == 0 and rec.out == "18\n", rec.err
    script.write_text(OUTSIDE.replace("#PROBE", 'print("PROBE", epoch, total)'))
    rep = flortrain(work, "replay", "train.py")
    assert rep.code == 2, rep.err
    (line,) = rep.err.strip().splitlines()
    assert (
        line.startswith("../elsewhere/out.txt: FT034 ") and "outside the working directory" in line
    ), line
