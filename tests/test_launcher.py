"""The launcher (``flortrain/process/launcher.py``): ``flortrain record`` forks the training process and waits
for it; the training process hands the writer's backlog over and exits while the writer drains;
the launcher commits the writer's results and exits as the training process did. Real processes,
real signals, a real store. The script is plain Python: torch's import and torch.optim's first
step would add about two CPU-seconds to every process, and nothing here is about torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.protocol import (
    block_states,
    descendants,
    flortrain,
    plain,
    probe_lines,
    store_count,
    writer_below,
)

#: A small training loop (a linear model fitted by hand); at its exit (the script's atexit, after flortrain's flush, and after
#: ``EXIT_WAIT`` seconds) it notes how many checkpoints the store had committed then, and its own
#: pid and parent's.
SCRIPT = """\
import atexit, json, os, random, signal, sqlite3, sys, time


def note():
    time.sleep(float(os.environ.get("EXIT_WAIT", "0")))  # a teardown that takes that long
    n = -1
    if os.path.exists(".flortrain/flortrain.db"):
        db = sqlite3.connect(".flortrain/flortrain.db")
        n = db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        db.close()
    with open("exit.json", "w") as f:
        json.dump({"committed": n, "pid": os.getpid(), "ppid": os.getppid(),
                   "sigchld": SIGCHLD}, f)


SIGCHLD = str(signal.getsignal(signal.SIGCHLD))  # as the script starts
atexit.register(note)
if os.environ.get("ON_TERM"):
    signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), sys.exit(5)))
random.seed(0)
w = [0.0] * 16
data = [([random.random() for _ in range(16)], random.random()) for _ in range(32)]
for epoch in range(int(os.environ.get("EPOCHS", "5"))):
    for step in range(10):
        loss = 0.0
        grad = [0.0] * 16
        for x, y in data:
            err = sum(wi * xi for wi, xi in zip(w, x)) - y
            loss += err * err / len(data)
            grad = [g + 2 * err * xi / len(data) for g, xi in zip(grad, x)]
        w = [wi - 0.01 * g for wi, g in zip(w, grad)]
    #PROBE
    print(f"epoch {epoch} loss {loss:.6f}", flush=True)
    if os.environ.get("SLOW"):
        time.sleep(float(os.environ["SLOW"]))
"""

EVERY = {"FLORTRAIN_PERIOD": "every"}


def _write(tmp: Path, text: str = SCRIPT) -> Path:
    script = tmp / "train.py"
    script.write_text(text)
    return script


def _committed(tmp: Path) -> int:
    return store_count(tmp / ".flortrain", "SELECT COUNT(*) FROM checkpoints WHERE run_id=1")


def _record(tmp: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` ended (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_the_training_process_exits_before_the_writer_is_done_and_the_launcher_commits_it_all(
    tmp_path: Path,
) -> None:
    """A writer slowed to 0.3 s a checkpoint is still writing when the training process exits:
    at that exit the store has committed fewer checkpoints than it ends with. The launcher
    commits every one, counts them in the last line, and the replay restores from them."""
    script = _write(tmp_path)
    truth = plain(script)
    rec = flortrain(
        tmp_path, "record", "train.py", env={**EVERY, "FLORTRAIN_INJECT": "writer-delay=0.3"}
    )
    assert rec.code == 0 and rec.out == truth.out, rec.err
    at_exit = json.loads((tmp_path / "exit.json").read_text())
    final = _committed(tmp_path)
    assert final >= 5  # five epochs: each block instance, and main-loop boundaries
    assert 0 <= at_exit["committed"] < final, at_exit
    assert "5 of 5 block instances checkpointed" in rec.err, rec.err
    assert rec.err.rstrip().splitlines()[-1].startswith("flortrain: record run 1 complete"), rec.err
    assert block_states(tmp_path / ".flortrain", 1) == {"checkpointed": 5}
    script.write_text(SCRIPT.replace("    #PROBE", "    print('PROBE', epoch, max(w))"))
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0 and "5 block instances skipped, 0 executed" in rep.err, rep.err
    assert probe_lines(rep.out) == probe_lines(plain(script).out)
    assert flortrain(tmp_path, "diff").code == 0


def test_the_launcher_commits_what_was_handed_over_while_the_training_process_is_still_exiting(
    tmp_path: Path,
) -> None:
    """A torch script's interpreter takes half a second to tear down after its last line. The
    launcher commits the writer's last checkpoints as soon as they are written, during that
    teardown, not after it: a script whose exit takes 6 s (its atexit sleeps) finds every
    checkpoint of its run committed before it ends, and the record ends as usual."""
    script = _write(tmp_path)
    truth = plain(script)
    rec = flortrain(
        tmp_path,
        "record",
        "train.py",
        env={**EVERY, "FLORTRAIN_INJECT": "writer-delay=0.3", "EXIT_WAIT": "6"},
    )
    assert rec.code == 0 and rec.out == truth.out, rec.err
    assert "5 of 5 block instances checkpointed" in rec.err, rec.err
    at_exit = json.loads((tmp_path / "exit.json").read_text())
    assert at_exit["committed"] == _committed(tmp_path) >= 5, (at_exit, rec.err)
    assert "after training exited" not in rec.err, rec.err  # the writer was done before it exited


def test_the_script_runs_in_a_child_of_the_launcher_unless_it_is_turned_off(tmp_path: Path) -> None:
    _write(tmp_path)
    for setting, parent_is_flortrain in (("on", True), ("off", False)):
        p = _record(tmp_path, {"FLORTRAIN_LAUNCHER": setting, "EPOCHS": "1"})
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        at_exit = json.loads((tmp_path / "exit.json").read_text())
        assert (at_exit["ppid"] == p.pid) is parent_is_flortrain and (
            at_exit["pid"] == p.pid
        ) is not parent_is_flortrain


def test_a_writer_killed_after_the_handoff_loses_what_it_held_with_a_warning_and_claims_nothing_of_it(
    tmp_path: Path,
) -> None:
    """The writer is slowed to 1 s a checkpoint and killed once the training process has exited:
    what it had written is committed, the rest is reported lost and has no row, and the record
    still exits 0 with the script's output; the replay re-executes what was lost and is exact."""
    script = _write(tmp_path)
    truth = plain(script)
    p = _record(tmp_path, {**EVERY, "FLORTRAIN_INJECT": "writer-delay=1"})
    assert p.stdout is not None
    first = p.stdout.readline()
    training = descendants(p.pid)[0]
    writer = writer_below(training)
    rest = "".join(
        p.stdout.readline() for _ in range(4)
    )  # the launcher holds stdout open: read lines
    assert _gone(training, 60)
    os.kill(writer, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert first + rest == truth.out
    assert "not written: the checkpoint writer ended before writing it" in err, err
    committed = _committed(tmp_path)
    assert 0 <= committed < 9, err
    states = block_states(tmp_path / ".flortrain", 1)
    assert states.get("checkpointed", 0) < 5 and sum(states.values()) == 5, states
    script.write_text(SCRIPT.replace("    #PROBE", "    print('PROBE', epoch, sum(w))"))
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == probe_lines(plain(script).out)
    assert flortrain(tmp_path, "diff").code == 0


def test_killing_the_launcher_kills_the_training_process(tmp_path: Path) -> None:
    _write(tmp_path)
    p = _record(tmp_path, {"SLOW": "30", "EPOCHS": "3"})
    assert p.stdout is not None
    p.stdout.readline()
    training = descendants(p.pid)[0]
    p.kill()
    p.communicate(timeout=60)
    assert _gone(training, 10), "the training process outlived its launcher"


def test_a_signal_sent_to_flortrain_reaches_the_training_process_once(tmp_path: Path) -> None:
    """``kill -TERM`` on ``flortrain record`` is forwarded: the script's own handler runs (once)
    and its exit status is flortrain's."""
    _write(tmp_path)
    p = _record(tmp_path, {"SLOW": "30", "EPOCHS": "3", "ON_TERM": "1"})
    assert p.stdout is not None
    first = p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert first.startswith("epoch 0") and out.count("got SIGTERM") == 1, out
    assert p.returncode == 5, err


def test_a_training_process_killed_by_a_signal_is_reported_with_how_to_resume_and_flortrain_dies_of_it(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        SCRIPT.replace(
            "    #PROBE", "    if epoch == 1:\n        os.kill(os.getpid(), signal.SIGKILL)"
        ),
    )
    p = _record(tmp_path, EVERY)
    out, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL, err
    assert out.splitlines() == [out.splitlines()[0]] and out.startswith("epoch 0")
    assert (
        "the training process was killed by signal 9 (SIGKILL); record run 1 is incomplete:"
        " `flortrain record --resume 1 train.py`"
    ) in err, err


def test_the_script_gets_the_sigchld_disposition_it_was_started_with(tmp_path: Path) -> None:
    """A supervisor may start flortrain with SIGCHLD ignored: the launcher needs it (an ignored
    SIGCHLD is never delivered), the script must still see it ignored, as under ``python``."""
    script = _write(tmp_path)
    seen = {}
    for cmd in (
        [sys.executable, "train.py"],
        [sys.executable, "-m", "flortrain", "record", "train.py"],
    ):
        p = subprocess.run(
            cmd,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "EPOCHS": "1"},
            timeout=300,
            preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN),
            check=False,
        )
        assert p.returncode == 0, p.stderr
        seen[cmd[1]] = json.loads((tmp_path / "exit.json").read_text())["sigchld"]
    assert seen["train.py"] == seen["-m"] == str(signal.Handlers.SIG_IGN), seen
    assert script.exists()


def test_a_launcher_that_fails_still_waits_for_training_and_exits_with_its_status(
    tmp_path: Path,
) -> None:
    """A bug in the launcher (injected) must not kill training, which dies with it: it says so,
    waits for the training process, and exits as it did. The checkpoints it would have committed
    stay unclaimed, and the replay is exact all the same."""
    script = _write(tmp_path)
    truth = plain(script)
    rec = flortrain(
        tmp_path,
        "record",
        "train.py",
        env={**EVERY, "FLORTRAIN_INJECT": "launcher-fail=1,writer-delay=0.2"},
    )
    assert rec.code == 0 and rec.out == truth.out, rec.err
    assert (
        "the launcher failed (RuntimeError: injected); waiting for the training process" in rec.err
    ), rec.err
    assert _committed(tmp_path) < 9
    script.write_text(SCRIPT.replace("    #PROBE", "    print('PROBE', epoch, w[-1])"))
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == probe_lines(plain(script).out)
