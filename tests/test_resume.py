"""``flortrain record --resume RUN``: a killed record continues from its last committed main-loop
boundary checkpoint and the iterations after it whose blocks are checkpointed, into the same run. It prints the rest of what ``python`` prints (not what
the killed run already printed), the run's whole log is then python's output, and a probed
replay of it is exact. The fault-injection harness (tests/faults.py) also resumes every run it
kills; these are the deterministic cases and the refusals. Scripts are plain Python, or train
by hand, unless torch is what a case is about: torch's import and torch.optim's first step (which
imports torch._dynamo) cost about two CPU-seconds a process."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.protocol import (
    Result,
    copy_fixture,
    flortrain,
    latest_run,
    plain,
    probe_lines,
    store_count,
)

#: every boundary checkpointed and committed before training goes on, so where the kill leaves
#: the run does not depend on timing
KILLABLE = {
    "FLORTRAIN_PERIOD": "every",
    "FLORTRAIN_COMMIT_INTERVAL": "0",
    "FLORTRAIN_MATERIALIZER": "sync",
}

SCRIPT = textwrap.dedent(
    """\
    import os
    import random
    import signal

    random.seed(3)
    w = [0.0, 0.0]
    data = [(random.random(), random.random()) for _ in range(30)]
    print("setup done")
    for epoch in range(6):
        random.shuffle(data)
        total = 0.0
        for x, y in data:
            err = w[0] * x + w[1] - y
            w[0] -= 0.1 * err * x
            w[1] -= 0.1 * err
            total += err * err
        #PROBE
        print(f"epoch {epoch} loss {total:.12f} draw {random.random():.6f}")
        if epoch == KILL_AT and os.path.exists("KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
    print("done", w)
    """
)


def _log(tmp: Path, run_id: int) -> list[str]:
    db = sqlite3.connect(tmp / ".flortrain" / "flortrain.db")
    try:
        return [
            t for (t,) in db.execute("SELECT text FROM logs WHERE run_id=? ORDER BY seq", (run_id,))
        ]
    finally:
        db.close()


def _killed(tmp: Path, text: str, *args: str) -> tuple[Path, str]:
    """Record ``text`` until it kills itself; returns the script and what python prints unkilled."""
    script = tmp / "train.py"
    script.write_text(text)
    truth = plain(script, list(args))
    (tmp / "KILL").touch()
    rec = flortrain(tmp, "record", "train.py", *args, env=KILLABLE)
    assert rec.code == -9 and truth.out.startswith(rec.out), rec.err
    (tmp / "KILL").unlink()
    assert latest_run(tmp)["status"] == "incomplete"
    return script, truth.out


def test_a_killed_record_resumes_where_it_stopped(tmp_path: Path) -> None:
    text = SCRIPT.replace("KILL_AT", "3")
    script, truth = _killed(tmp_path, text)
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=KILLABLE)
    assert res.code == 0, res.err
    assert "resumes at main loop M9 iteration 3" in res.err
    # the rest of python's output, from the start of the resumed iteration (random draws included)
    assert res.out == truth[truth.index("epoch 3 loss") :]
    run = latest_run(tmp_path)
    assert run["id"] == 1 and run["status"] == "complete"
    assert _log(tmp_path, 1) == truth.splitlines()  # one run, one whole log
    script.write_text(text.replace("    #PROBE", "    print('PROBE', epoch, repr(w[0]))"))
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=KILLABLE)
    assert rep.code == 0 and probe_lines(rep.out) == want, rep.err
    d = flortrain(tmp_path, "diff")
    assert d.code == 0 and "RNG streams equal at 6" in d.out, d.out + d.err


def test_a_killed_torch_record_resumes_with_its_arguments(tmp_path: Path) -> None:
    script = copy_fixture("module_level", tmp_path)
    text = "import os, signal\n" + script.read_text().replace(
        '\nprint(f"final weight sum',
        "\n    if epoch == 1 and os.path.exists('KILL'):\n        os.kill(os.getpid(), signal.SIGKILL)\n"
        'print(f"final weight sum',
    )
    assert text.count("os.kill") == 1
    script, truth = _killed(tmp_path, text, "--epochs", "4")
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=KILLABLE)
    assert res.code == 0, res.err
    assert res.out == truth[truth.index("epoch 1 step 0") :]  # the recorded --epochs 4 is reused
    assert _log(tmp_path, 1) == truth.splitlines()
    marker = "        # flortrain-probe inner: "
    line = next(ln for ln in text.splitlines() if ln.startswith(marker))
    script.write_text(text.replace(line, "        " + line[len(marker) :]))
    want = probe_lines(plain(script, ["--epochs", "4"]).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=KILLABLE)
    assert rep.code == 0 and probe_lines(rep.out) == want, rep.err
    assert flortrain(tmp_path, "diff").code == 0


def _refused(r: object, code: str, says: str) -> None:
    lines = [ln for ln in r.err.splitlines() if ln.strip()]  # type: ignore[attr-defined]
    assert r.code == 2 and len(lines) == 1 and code in lines[0] and says in lines[0], r.err  # type: ignore[attr-defined]


def test_what_cannot_be_resumed_is_refused(tmp_path: Path) -> None:
    # killed in its first iteration: no boundary was committed (iteration 0's is never taken)
    _killed(tmp_path, SCRIPT.replace("KILL_AT", "0"))
    _refused(
        flortrain(tmp_path, "record", "--resume", "1", "train.py"),
        "FT042",
        "nor a checkpointed iteration",
    )
    _refused(
        flortrain(tmp_path, "record", "--resume", "1", "train.py", "--x"), "FT040", "give none"
    )
    (tmp_path / "train.py").write_text(SCRIPT.replace("KILL_AT", "0") + "print('more')\n")
    _refused(
        flortrain(tmp_path, "record", "--resume", "1", "train.py"), "FT040", "changed since run 1"
    )
    (tmp_path / "train.py").write_text(SCRIPT.replace("KILL_AT", "0"))
    assert flortrain(tmp_path, "record", "train.py").code == 0
    _refused(flortrain(tmp_path, "record", "--resume", "2", "train.py"), "FT040", "is complete")
    _refused(flortrain(tmp_path, "record", "--resume", "9", "train.py"), "FT012", "no run 9")


COVERED = textwrap.dedent(
    """\
    import os, signal, torch
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 4)
    x = torch.randn(256, 256, 32)
    y = torch.randint(0, 4, (256, 256))
    for epoch in range(8):
        for i in range(256):
            loss = torch.nn.functional.cross_entropy(head(x[i]), y[i])
            head.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in head.parameters():
                    p.add_(p.grad, alpha=-0.05)
        print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
        if epoch == 5 and os.path.exists("KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _boundaries(tmp: Path) -> int:
    return store_count(
        tmp / ".flortrain", "SELECT COUNT(*) FROM blocks WHERE run_id=1 AND state='boundary'"
    )


def test_a_loop_its_blocks_cover_still_gets_boundaries_to_resume_from(tmp_path: Path) -> None:
    """With the adaptive period, a boundary after a checkpointed batch loop that is the whole
    epoch is worth little to Eq. 4 (a replay restores the block instead), so such a loop gets
    few boundaries from it, and a killed record resumes only from a boundary.
    ``FLORTRAIN_BOUNDARY_INTERVAL`` gives it one per that many seconds of training (here a small
    one, so the 6 epochs before the kill have some, the budget allowing), and the resumed record
    prints the rest of python's output. The rule itself is tested in test_adaptive.py. The
    writer is the synchronous one, so that a boundary is committed before training goes on (a
    background writer at idle priority under a loaded machine may not have reported any when
    the kill comes). ε is 0.2: at the default, how many boundaries the budget affords depends
    too much on the machine's speed and load."""
    env = {
        "FLORTRAIN_COMMIT_INTERVAL": "0",
        "FLORTRAIN_MATERIALIZER": "sync",
        "FLORTRAIN_EPSILON": "0.2",
    }
    script = tmp_path / "train.py"
    script.write_text(COVERED)
    truth = plain(script).out
    (tmp_path / "KILL").touch()
    rec = flortrain(
        tmp_path, "record", "train.py", env={**env, "FLORTRAIN_BOUNDARY_INTERVAL": "0.001"}
    )
    assert rec.code == -9 and truth.startswith(rec.out), rec.err
    (tmp_path / "KILL").unlink()
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    try:
        (n,) = db.execute(
            "SELECT COUNT(*) FROM blocks WHERE run_id=1 AND state='boundary'"
        ).fetchone()
    finally:
        db.close()
    assert n >= 2, n
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=env)
    assert res.code == 0, res.err
    k = int(
        res.err.split("resumes at main loop ")[1].split(" iteration ")[1].split()[0].rstrip(":,.")
    )
    assert 1 <= k <= 6
    assert res.out == truth[truth.index(f"epoch {k} loss") :]
    assert _log(tmp_path, 1) == truth.splitlines()


#: twelve epochs of a few hundredths of a second each (the batch loop waits a little at every
#: step, as a data loader does), so that a signal sent after the third epoch's line lands mid-run
STOPPED = textwrap.dedent(
    """\
    import random
    import time

    random.seed(0)
    w = [0.0, 0.0]
    data = [(random.random(), random.random()) for _ in range(20)]
    for epoch in range(12):
        random.shuffle(data)
        total = 0.0
        for x, y in data:
            time.sleep(0.003)
            err = w[0] * x + w[1] - y
            w[0] -= 0.1 * err * x
            w[1] -= 0.1 * err
            total += err * err
        print(f"epoch {epoch} loss {total:.12f}", flush=True)
    print("final", repr(w))
    """
)


def _stop_after(
    tmp: Path, epochs: int, sig: signal.Signals, group: bool, env: dict[str, str]
) -> tuple[int, str, str]:
    """Record in a session of its own; once ``epochs`` lines are printed, send ``sig`` to the
    launcher, or to its whole process group as a terminal's Ctrl-C or a scheduler does (the
    training process and the checkpoint writer get it too). Its exit status, stdout, stderr."""
    p = subprocess.Popen(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert p.stdout is not None
    seen = [p.stdout.readline() for _ in range(epochs)]
    assert all(s.startswith("epoch") for s in seen), seen
    if group:
        os.killpg(p.pid, sig)
    else:
        p.send_signal(sig)
    out, err = p.communicate(timeout=300)
    return p.returncode, "".join(seen) + out, err


@pytest.mark.parametrize(
    ("sig", "group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
    ids=["sigint-group", "sigterm", "sigterm-group"],
)
def test_a_record_stopped_by_a_signal_resumes_after_its_last_checkpointed_epoch(
    tmp_path: Path, sig: signal.Signals, group: bool
) -> None:
    """Ctrl-C and ``kill``/a scheduler's SIGTERM stop training: the record commits every
    checkpoint it handed to its writer, the run reads ``interrupted``, flortrain dies of the
    signal as python does, and ``record --resume`` continues from the boundary of the epoch the
    signal interrupted: it prints the rest of python's output and the run's log is python's.
    A boundary at every epoch, the background writer and the default commit interval: what the
    writer and the held rows had not committed when the signal came is what was lost before."""
    env = {"FLORTRAIN_PERIOD": "every"}
    script = tmp_path / "train.py"
    script.write_text(STOPPED)
    truth = plain(script).out
    code, out, err = _stop_after(tmp_path, 3, sig, group, env)
    assert code == -sig, err
    printed = [ln for ln in out.splitlines() if ln.startswith("epoch")]
    assert 3 <= len(printed) < 12 and truth.startswith(out), out + err
    assert latest_run(tmp_path)["status"] == "interrupted", err
    assert "record --resume 1 train.py" in err, err
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=env)
    assert res.code == 0, res.err
    k = int(
        res.err.split("resumes at main loop ")[1].split(" iteration ")[1].split()[0].rstrip(":,.")
    )
    # the epoch the signal interrupted, whose boundary checkpoint was handed to the writer; a
    # Ctrl-C that lands between an epoch's last line and the next iteration's boundary hook
    # (one that lands in the hook is raised once the boundary is staged) leaves the one before
    assert k == len(printed) or (sig == signal.SIGINT and k == len(printed) - 1), (
        k,
        printed,
        res.err,
    )
    assert res.out == truth[truth.index(f"epoch {k} loss") :]
    assert latest_run(tmp_path)["status"] == "complete"
    assert _log(tmp_path, 1) == truth.splitlines()


#: Ctrl-C while the script spins in a loop whose only check for a signal is its backward jump,
#: an instruction without a line: the handler's ``KeyboardInterrupt`` has a traceback entry whose
#: ``tb_lineno`` is None, wherever the signal arrives within the spin
LINELESS = textwrap.dedent(
    """\
    import os
    import random
    import signal
    import threading

    random.seed(0)
    w = [0.0, 0.0]
    data = [(random.random(), random.random()) for _ in range(20)]


    def until_interrupted():
        for k in range(10**11):
            if k < 0:
                k = 0


    for epoch in range(4):
        for x, y in data:
            err = w[0] * x + w[1] - y
            w[0] -= 0.1 * err * x
            w[1] -= 0.1 * err
        print(f"epoch {epoch} loss {err * err:.12f}", flush=True)
        if epoch == 1 and os.path.exists("KILL"):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            until_interrupted()
    print("done")
    """
)


def _interruptible(tmp: Path, *cmd: str, env: dict[str, str] | None = None) -> Result:
    """``cmd`` in ``tmp`` with Ctrl-C's default handling (a test runner may start its children
    with SIGINT ignored, and the script would then spin to its end)."""
    p = subprocess.run(
        list(cmd),
        cwd=tmp,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return Result(p.returncode, p.stdout, p.stderr)


def test_a_ctrl_c_that_lands_where_the_script_has_no_line_ends_the_run_interrupted(
    tmp_path: Path,
) -> None:
    """A Ctrl-C handled at an instruction that has no line leaves a traceback entry without a
    line number. Trimming flortrain's frames off that traceback used to raise (TypeError), which
    ended the run as an internal error, left it ``running`` (incomplete) and printed no
    traceback. The record now prints python's traceback byte for byte, ends ``interrupted``,
    dies of SIGINT as python does, and ``record --resume`` continues it to python's output."""
    env = {"FLORTRAIN_PERIOD": "every"}
    script = tmp_path / "train.py"
    script.write_text(LINELESS)
    whole = plain(script).out
    (tmp_path / "KILL").touch()
    truth = _interruptible(tmp_path, sys.executable, "train.py")
    assert truth.code == -signal.SIGINT and "line -1, in until_interrupted" in truth.err, truth
    rec = _interruptible(tmp_path, sys.executable, "-m", "flortrain", "record", "train.py", env=env)
    assert rec.code == -signal.SIGINT, rec.err
    assert rec.out == truth.out == whole[: whole.index("epoch 2")]
    assert truth.err in rec.err and "internal error" not in rec.err, rec.err
    assert latest_run(tmp_path)["status"] == "interrupted", rec.err
    assert "record --resume 1 train.py" in rec.err, rec.err
    (tmp_path / "KILL").unlink()
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=env)
    assert res.code == 0, res.err
    assert " iteration 1, " in res.err and res.out == whole[whole.index("epoch 1") :], res.err
    assert _log(tmp_path, 1) == whole.splitlines()


def test_a_ctrl_c_during_a_checkpoint_is_raised_once_the_checkpoint_is_staged(
    tmp_path: Path,
) -> None:
    """A Ctrl-C that arrives as the first checkpoint is staged (``checkpoint-signal``: sent
    from inside the block's end hook) waits for the hook to finish: the checkpoint is written
    and committed, then the script is interrupted at the hook's call, the run reads
    ``interrupted``, and ``record --resume`` continues it to python's output. Raised where it
    arrived, it lost that checkpoint half-staged."""
    env = {**KILLABLE, "FLORTRAIN_INJECT": f"checkpoint-signal={int(signal.SIGINT)}"}
    script = tmp_path / "train.py"
    script.write_text(LINELESS)
    rec = _interruptible(tmp_path, sys.executable, "-m", "flortrain", "record", "train.py", env=env)
    assert rec.code == -signal.SIGINT and rec.out == "", rec.err
    assert "KeyboardInterrupt" in rec.err and "internal error" not in rec.err, rec.err
    # the traceback python would print: the script's frames only, none of the hook's
    shown = rec.err.split("Traceback (most recent call last):\n")[1].split("KeyboardInterrupt")[0]
    assert [ln for ln in shown.splitlines() if ln.startswith("  File ")] == [
        f'  File "{script}", line 21, in <module>'
    ], rec.err
    assert latest_run(tmp_path)["status"] == "interrupted", rec.err
    assert "1 of 1 block instances checkpointed" in rec.err, rec.err
    assert (
        store_count(
            tmp_path / ".flortrain",
            "SELECT COUNT(*) FROM blocks WHERE run_id=1 AND iteration=0 AND state='checkpointed'",
        )
        == 1
    )


SPACED = textwrap.dedent(
    """\
    import os
    import random
    import signal
    import sys

    random.seed(5)
    w = [0.0, 0.0]
    data = [(random.random(), random.random()) for _ in range(40)]
    print("setup done")
    for epoch in range(10):
        if epoch == 7 and os.path.exists("KILL"):
            os.kill(os.getpid(), signal.SIGTERM)
        random.shuffle(data)
        total = 0.0
        for n, (x, y) in enumerate(data):
            if n == 0:
                print(f"computing epoch {epoch}", file=sys.stderr)
            err = w[0] * x + w[1] - y
            w[0] -= 0.05 * err * x
            w[1] -= 0.05 * err
            total += err * err
        #PROBE
        print(f"epoch {epoch} loss {total:.12f} draw {random.random():.6f}")
    print("done", w)
    """
)

#: the same shape in torch, as a ``while`` loop: a shuffling DataLoader, momentum, and a
#: scheduler stepped outside the batch loop (code a replayed iteration executes)
SPACED_TORCH = textwrap.dedent(
    """\
    import os
    import signal
    import sys

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    loader = DataLoader(
        TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=16, shuffle=True
    )
    print("setup done")
    epoch = 0
    while epoch < 10:
        if epoch == 7 and os.path.exists("KILL"):
            os.kill(os.getpid(), signal.SIGTERM)
        total = 0.0
        for n, (x, y) in enumerate(loader):
            if n == 0:
                print(f"computing epoch {epoch}", file=sys.stderr)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        sched.step()
        #PROBE
        print(f"epoch {epoch} loss {total:.8f} lr {sched.get_last_lr()[0]:.6f} draw {torch.rand(1).item():.6f}")
        epoch += 1
    print("done", f"{model.weight.sum().item():.8f}")
    """
)

#: script, its probe, the boundary stride, what the resume says it restored
SPACED_SCRIPTS = {
    "for": (
        SPACED,
        "    print('PROBE', epoch, repr(w[0]))",
        4,
        "boundary checkpoint (iteration 4) and iterations 4..6",
    ),
    "while-torch": (
        SPACED_TORCH,
        "    print('PROBE', epoch, model.weight.sum().item())",
        4,
        "boundary checkpoint (iteration 4) and iterations 4..6",
    ),
    "no-boundary": (
        SPACED,
        "    print('PROBE', epoch, repr(w[0]))",
        100,
        "after iterations 0..6 with their blocks restored (no boundary",
    ),
}


@pytest.mark.parametrize("name", sorted(SPACED_SCRIPTS))
def test_a_resume_continues_past_its_last_boundary_through_checkpointed_blocks(
    tmp_path: Path, name: str
) -> None:
    """Boundaries at iterations 4 and 8 only (``FLORTRAIN_BOUNDARY_EVERY``), or none, every
    block instance checkpointed, SIGTERM at the start of epoch 7: the resume restores boundary 4
    (or starts the loop afresh) and runs the epochs up to 6 as a replay would (their batch loops
    restored from their checkpoints, the code between them executed, their output not printed
    again), so it computes from epoch 7 on. Its output and the run's log are python's, and a
    probed replay of the resumed run is exact."""
    text, probe, stride, says = SPACED_SCRIPTS[name]
    env = {**KILLABLE, "FLORTRAIN_BOUNDARY_EVERY": str(stride)}
    script = tmp_path / "train.py"
    script.write_text(text)
    truth = plain(script).out
    (tmp_path / "KILL").touch()
    rec = flortrain(tmp_path, "record", "train.py", env=env)
    assert rec.code == -signal.SIGTERM and truth.startswith(rec.out), rec.err
    assert latest_run(tmp_path)["status"] == "interrupted", rec.err
    assert rec.out.count("\nepoch ") == 7 and _boundaries(tmp_path) == 7 // stride, rec.err
    (tmp_path / "KILL").unlink()
    res = flortrain(tmp_path, "record", "--resume", "1", "train.py", env=env)
    assert res.code == 0, res.err
    assert "resumes at main loop M" in res.err and " iteration 7, " in res.err, res.err
    assert says in res.err, res.err
    computed = [ln for ln in res.err.splitlines() if ln.startswith("computing epoch")]
    assert computed == [f"computing epoch {e}" for e in (7, 8, 9)], res.err
    assert res.out == truth[truth.index("epoch 7 loss") :]
    assert latest_run(tmp_path)["status"] == "complete"
    assert _log(tmp_path, 1) == truth.splitlines()
    script.write_text(text.replace("    #PROBE", probe))
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=env)
    assert rep.code == 0 and probe_lines(rep.out) == want, rep.err
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out + d.err
