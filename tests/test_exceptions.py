"""Runs that do not end the ordinary way: an exception that carries control out of a memoized loop
(the instance never reaches its end hook, yet what the script prints afterwards must be attributed
to the main loop and compared by ``diff``), a record killed midway, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.protocol import flortrain, latest_run, probe_lines
from tests.test_cli import invoke, plain_output

SCRIPT = textwrap.dedent(
    """\
    import random

    random.seed(0)
    w = [0.0]
    for epoch in range(3):
        try:
            for b in range(4):
                w[0] += random.random()
                if epoch == 1 and b == 2:
                    raise RuntimeError("diverged")
        except RuntimeError as e:
            print("caught", e)
        #PROBE
        print(epoch, w[0], STAMP)
    """
)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLORTRAIN_STORE", str(tmp_path / ".flortrain"))
    monkeypatch.setenv("FLORTRAIN_PERIOD", "every")
    return tmp_path


def test_output_after_an_exception_left_a_loop_is_compared(work: Path) -> None:
    script = work / "train.py"
    text = SCRIPT.replace("STAMP", '""')
    script.write_text(text)
    rec = invoke("record", "train.py")
    assert rec.stdout == plain_output(script)
    script.write_text(text.replace("    #PROBE", "    print('PROBE', epoch, w[0])"))
    rep = invoke("replay", "train.py")
    assert probe_lines(rep.stdout) == probe_lines(plain_output(script))
    d = invoke("diff")
    assert d.exit_code == 0, d.stdout
    # every line the record printed is compared: the one after the exception too
    assert "4 output lines compared" in d.stdout
    # instances 0 and 2 were skipped; instance 1 re-executed (no checkpoint of a half-run loop)
    assert "2 block instances skipped, 1 executed" in rep.stderr


def test_a_difference_after_an_exception_left_a_loop_is_reported(work: Path) -> None:
    # A line printed after the caught exception differs between record and replay: diff must see
    # it, not drop it as output of a block instance that never ended.
    (work / "train.py").write_text(
        SCRIPT.replace("STAMP", "__import__('time').time_ns() if epoch == 1 else ''")
    )
    assert invoke("record", "train.py").exit_code == 0
    invoke("replay", "train.py")
    d = invoke("diff")
    assert d.exit_code == 1
    assert "iteration 1" in d.stdout


def test_an_exception_out_of_a_callee_loop(work: Path) -> None:
    # The loop lives in a function the exception leaves: its frame is gone from the stack.
    text = textwrap.dedent(
        """\
        import random

        def train_one_epoch(epoch, w):
            for b in range(4):
                w[0] += random.random()
                if epoch == 1 and b == 2:
                    raise RuntimeError("diverged")
            return w[0]

        random.seed(0)
        w = [0.0]
        for epoch in range(3):
            try:
                train_one_epoch(epoch, w)
            except RuntimeError as e:
                print("caught", e)
            #PROBE
            print(epoch, w[0])
        """
    )
    script = work / "train.py"
    script.write_text(text)
    assert invoke("record", "train.py").stdout == plain_output(script)
    script.write_text(text.replace("    #PROBE", "    print('PROBE', epoch, w[0])"))
    rep = invoke("replay", "train.py")
    assert probe_lines(rep.stdout) == probe_lines(plain_output(script))
    d = invoke("diff")
    assert d.exit_code == 0 and "4 output lines compared" in d.stdout, d.stdout


def test_a_record_killed_midway_is_compared_up_to_where_it_stopped(tmp_path: Path) -> None:
    # The record is SIGKILLed in epoch 2 (KILL set only then); the replay runs to the end. The
    # lines both produced must match, and the lines past the record's end are not differences.
    text = textwrap.dedent(
        """\
        import os, random, signal

        random.seed(0)
        w = [0.0]
        for epoch in range(4):
            for b in range(3):
                w[0] += random.random()
            print(epoch, w[0], flush=True)
            if epoch == 2 and os.environ.get("KILL"):
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    (tmp_path / "train.py").write_text(text)
    env = {"FLORTRAIN_PERIOD": "every", "FLORTRAIN_COMMIT_INTERVAL": "0"}  # commit every boundary
    assert flortrain(tmp_path, "record", "train.py", env={**env, "KILL": "1"}).code == -9
    rep = flortrain(tmp_path, "replay", "train.py", env=env)
    assert rep.code == 0 and len(rep.out.splitlines()) == 4
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out
    # the store commits output at iteration boundaries: the kill loses the line of epoch 2
    assert (
        "2 output lines compared" in d.out
        and "2 replay lines past its end were not compared" in d.out
    )


def test_ctrl_c_ends_flortrain_the_way_it_ends_python(tmp_path: Path) -> None:
    # Python dies by SIGINT after printing the traceback; so must `flortrain record`, once the
    # run is finalized (a shell loop around it must see an interrupt, not an ordinary failure).
    (tmp_path / "train.py").write_text(
        "import time\nfor epoch in range(1000):\n    for b in range(3):\n        time.sleep(0.01)\n"
        "    print(epoch, flush=True)\n"
    )
    env = {**os.environ, "FLORTRAIN_STORE": str(tmp_path / ".flortrain")}
    codes = []
    for cmd in (
        [sys.executable, "train.py"],
        [sys.executable, "-m", "flortrain", "record", "train.py"],
    ):
        p = subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # a runner that ignores SIGINT would pass that on, and Python would not raise on it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert p.stdout is not None
        p.stdout.readline()  # training has started
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert "KeyboardInterrupt" in err
        codes.append(p.returncode)
    assert codes == [-signal.SIGINT, -signal.SIGINT]
    run = latest_run(tmp_path)
    assert (
        run["status"] == "interrupted" and run["exit_code"] == 130
    )  # which record --resume continues
