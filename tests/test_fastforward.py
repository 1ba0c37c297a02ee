"""Fast-forward (DETrain's Needed analysis): which statements of a main loop's body a
pseudoresume leaves out, and that a pseudoresuming worker replays exactly with them left out.

The analysis cases are static (no torch): each main-loop body below has its statements marked
``# skip`` (the analysis must find them skippable) or ``# run`` (needed: a later iteration or
the code after the loop reads what it writes, or it may change state, draw random numbers or
change control flow). The protocol tests run real records and ``--jobs 2`` replays whose second
worker pseudoresumes (``FLORTRAIN_RESUME=pseudo``), against a plain ``python`` run.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from flortrain.static.analysis import analyse
from flortrain.static.source import parse
from tests.protocol import flortrain, latest_run, plain, record

PRELUDE = """\
import logging
import random

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 1)
x, y = torch.randn(8, 4), torch.randn(8, 1)
xs = [torch.randn(2, 4) for _ in range(3)]
order = list(range(8))
step = 0


def helper(v):
    return v
"""

CASES = {
    "an evaluation pass under no_grad that only feeds a print": """\
for epoch in range(3):
    for i in range(2):  # run
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()  # run
    with torch.no_grad():  # skip
        val = 0.0
        for xb in xs:
            val += model(xb).sum().item()
    model.train()  # run
    print(f"epoch {epoch} val {val:.4f}")  # skip
    log.info("epoch %d", epoch)  # skip
""",
    "a scheduler step, a counter, a shuffle and an RNG draw are needed": """\
for epoch in range(3):
    random.shuffle(order)  # run
    for i in order:  # run
        opt.step()
    sched.step()  # run
    step += 1  # run
    noise = torch.randn(1)  # run
    print(step, noise)  # skip
""",
    "a value the next iteration reads is needed, one only printed is not": """\
best = 1e9
for epoch in range(3):
    for i in range(2):  # run
        opt.step()
    val = F.mse_loss(model(x), y).item()  # run
    gap = val - best  # skip
    if val < best:  # run
        best = val
    print(epoch, gap)  # skip
""",
    "a value carried to the next iteration is needed, even when only a print reads it": """\
best = 1e9
for epoch in range(3):
    for i in range(2):  # run
        opt.step()
    best = min(best, model(x).sum().item())  # run
    print(best)  # skip
""",
    "iterating is checked: what the pass cannot check runs, the rest waits for the run": """\
for epoch in range(3):
    for i in range(2):  # run
        opt.step()
    first = next(iter(xs))  # run
    print(*helper(xs))  # run
    print(*xs, epoch in order)  # skip
    h, w = model.weight.shape  # skip
""",
    "a value the code after the loop reads is needed": """\
for epoch in range(3):
    for i in range(2):  # run
        opt.step()
    last = model(x).sum().item()  # run
    shown = model(x).mean().item()  # skip
    print(shown)  # skip
print(last)
""",
    "calls the pass cannot see into, files and control flow run": """\
for epoch in range(3):
    for i in range(2):  # run
        opt.step()
    a = helper(x)  # run
    print(a, file=open("log.txt", "a"))  # run
    b = model.weight.tolist()  # skip
    c = F.dropout(x, 0.5)  # run
    if epoch == 5:  # run
        break
    d = {"k": b}  # skip
    xs[0] = x  # run
""",
}


EVALUATION = "an evaluation pass under no_grad that only feeds a print"


def _marked(body: str) -> dict[int, str]:
    """Line (in the whole script) -> the mark of each marked statement."""
    first = PRELUDE.count("\n") + 1
    return {
        first + k: m.group(1)
        for k, line in enumerate(body.splitlines())
        if (m := re.search(r"# (skip|run)$", line))
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_needed_analysis_finds_what_a_pseudoresume_may_leave_out(case: str) -> None:
    body = CASES[case]
    plan = analyse(parse("train.py", PRELUDE + body))
    (main,) = plan.main_loops
    skipped = {f.line for f in main.fast_forward}
    kept = dict(main.kept)
    for line, mark in _marked(body).items():
        if mark == "skip":
            assert line in skipped, f"line {line} should be skippable, kept: {kept.get(line)}"
        else:
            assert line in kept, f"line {line} should run while pseudoresuming"
    # and --explain says so
    text = plan.explain()
    assert ("fast-forward (left out while pseudoresuming)" in text) == bool(skipped), text


def test_what_the_run_time_check_must_see_is_named() -> None:
    plan = analyse(parse("train.py", PRELUDE + CASES[EVALUATION]))
    (main,) = plan.main_loops
    evaluation = next(f for f in main.fast_forward if f.end_line > f.line)
    assert evaluation.modules == ("model",) and evaluation.containers == ("xs",)
    assert "val" in evaluation.binds


def test_a_scope_that_reads_its_own_variables_forwards_nothing() -> None:
    body = CASES[EVALUATION] + "    print(locals())\n"
    (main,) = analyse(parse("train.py", PRELUDE + body)).main_loops
    assert main.fast_forward == ()


#: A main loop with an expensive evaluation pass (full-batch, under no_grad, in eval mode) and
#: prints, and what pseudoresume needs: a scheduler step, a step counter, an RNG draw outside
#: the blocks, a value carried to the next iteration.
SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.8)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    xv, yv = torch.randn(512, 4), torch.randn(512, 1)
    batches = list(zip(xv.split(64), yv.split(64)))
    step = 0
    best = 1e9
    for epoch in range(6):
        model.train()
        for i in range(0, 64, 16):
            loss = F.mse_loss(model(x[i : i + 16]), y[i : i + 16])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        sched.step()
        jitter = torch.rand(1).item()
        best = min(best, loss.item() + jitter)
        model.eval()
        with torch.no_grad():
            val = 0.0
            for xb, yb in batches:
                val += F.mse_loss(model(xb), yb).item()
        model.train()
        print(f"epoch {epoch} val {val:.8f} best {best:.8f}")
        #PROBE
    print("steps", step)
    """
)

PROBE = 'print(f"PROBE {epoch} {step} {jitter:.8f} {sched.get_last_lr()[0]:.8f} {val:.8f}")'
PSEUDO = {"FLORTRAIN_PERIOD": "every", "FLORTRAIN_SEGMENTS": "even", "FLORTRAIN_RESUME": "pseudo"}


def _record_then_probe(tmp_path: Path, text: str, probe: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(text.replace("#PROBE", "#"))
    truth = plain(script)
    rec = record(tmp_path, "train.py", env=PSEUDO)
    assert rec.code == 0 and rec.out == truth.out, rec.err
    script.write_text(text.replace("#PROBE", probe))
    return plain(script).out


def test_a_pseudoresuming_worker_leaves_out_the_evaluation_and_replays_exactly(
    tmp_path: Path,
) -> None:
    # The probe is in the training loop, so the second worker's segment executes it: nothing
    # restores the state the pseudoresume left there. Had fast-forward left out the scheduler's
    # step, the draw of `jitter` or `best`, the segment would train at another learning rate,
    # draw other numbers or print another best, and the output would differ.
    text = SCRIPT.replace("    #PROBE\n", "").replace(
        "        step += 1\n", "        step += 1\n        #PROBE\n"
    )
    assert text.count("#PROBE") == 1
    want = _record_then_probe(tmp_path, text, 'print(f"PROBE {epoch} {i} {loss.item():.8f}")')
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=PSEUDO)
    assert par.code == 0, par.err
    assert par.out == want
    # the evaluation (lines 25-28, once the probe is in: 26-29) and the print, in 3 iterations
    assert "fast-forward left out 6 statement(s) at line(s) 26, 31" in par.err, par.err
    assert "while pseudoresuming, a worker leaves out (fast-forward) lines 26-29" in par.err
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out + d.err


def test_a_probe_reading_what_a_left_out_statement_binds_makes_it_run(tmp_path: Path) -> None:
    want = _record_then_probe(tmp_path, SCRIPT, PROBE)
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=PSEUDO)
    assert par.code == 0, par.err
    assert par.out == want
    assert "lines 25-28" not in par.err, par.err  # `val` is the probe's
    assert "fast-forward left out 3 statement(s) at line(s) 30" in par.err, par.err


def test_off_runs_every_statement(tmp_path: Path) -> None:
    want = _record_then_probe(tmp_path, SCRIPT, 'print(f"PROBE {epoch} {step} {jitter:.8f}")')
    env = {**PSEUDO, "FLORTRAIN_FAST_FORWARD": "off"}
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=env)
    assert par.code == 0, par.err
    assert par.out == want
    assert "fast-forward left out" not in par.err, par.err
    assert "a worker runs every statement (FLORTRAIN_FAST_FORWARD=off)" in par.err, par.err


KILLED = {
    "FLORTRAIN_PERIOD": "every",
    "FLORTRAIN_COMMIT_INTERVAL": "0",
    "FLORTRAIN_MATERIALIZER": "sync",
    "FLORTRAIN_BOUNDARY_EVERY": "100",  # no boundary: the resume runs iterations 0..3 again
}


def test_a_resumed_record_leaves_out_the_evaluation_of_the_iterations_it_replays(
    tmp_path: Path,
) -> None:
    # SIGTERM as epoch 4 starts: the resume records from iteration 4, replaying 0..3
    text = "import os, signal\n" + SCRIPT.replace("    #PROBE\n", "").replace(
        "for epoch in range(6):\n",
        "for epoch in range(6):\n"
        "    if epoch == 4 and os.path.exists('KILL'):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n",
    )
    script = tmp_path / "train.py"
    script.write_text(text)
    truth = plain(script).out
    (tmp_path / "KILL").touch()
    rec = flortrain(tmp_path, "record", "train.py", env=KILLED)
    assert rec.code != 0 and truth.startswith(rec.out), rec.err
    (tmp_path / "KILL").unlink()
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=KILLED)
    assert res.code == 0, res.err
    assert res.out == truth[truth.index("epoch 4 val") :]
    # the evaluation (lines 28-31) and the print (33) of iterations 0..3
    assert "fast-forward left out 8 statement(s) at line(s) 28, 33" in res.err, res.err
    assert latest_run(tmp_path)["status"] == "complete"


def test_a_gated_statement_keeps_its_line_and_column_in_tracebacks() -> None:
    from flortrain.instrument import instrument_file
    from flortrain.static.linemap import line_map

    text = PRELUDE + CASES[EVALUATION]
    code = instrument_file("train.py", text).code_text
    assert 'if __flortrain__.forward("M' in code
    mapping = line_map(text, code)
    original = text.splitlines()
    for j, line in enumerate(code.splitlines()):
        if line.strip().startswith('print(f"epoch'):
            at, shift = mapping[j]
            assert original[at - 1].strip() == line.strip()
            assert shift == 4  # one level deeper, under the gate
            break
    else:
        raise AssertionError(code)
