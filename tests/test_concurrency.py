"""Several flortrain processes on one store at once (SQLite in WAL mode, run ids from
AUTOINCREMENT, blobs under per-run directories, content-addressed objects renamed into place):
two records of the same script, and a replay while a record is running. The script is plain
Python: what is under test is the processes and the store, not torch, whose import and first
optimizer step cost about two CPU-seconds a process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.protocol import flortrain, plain, probe_lines, with_probe

EVERY = {"FLORTRAIN_PERIOD": "every"}

#: an epoch loop over a shuffled batch loop, a learning rate decayed once an epoch (the line the
#: gated copy below holds after), and an outer probe marker
SCRIPT = """\
import random

random.seed(0)
data = [(random.random(), random.random()) for _ in range(64)]
w = [0.0, 0.0]
lr = 0.1
for epoch in range(3):
    random.shuffle(data)
    total = 0.0
    for step, (x, y) in enumerate(data):
        err = w[0] * x + w[1] - y
        w[0] -= lr * err * x
        w[1] -= lr * err
        total += err * err
        if step % 16 == 0:
            print(f"epoch {epoch} step {step} err {err:.10f}")
    lr *= 0.7
    # flortrain-probe outer: print(f"PROBE outer {epoch} {w[0]:.10f} {w[1]:.10f}")
    print(f"epoch {epoch} loss {total:.10f} lr {lr:.10f}")

print(f"final {w[0] + w[1]:.10f}")
"""


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "flortrain", *args],
        cwd=cwd,
        env={**os.environ, **EVERY},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _runs(cwd: Path) -> list[dict[str, object]]:
    r = flortrain(cwd, "runs", "--json")
    assert r.code == 0, r.err
    out: list[dict[str, object]] = json.loads(r.out)
    return out


def test_two_records_at_once_then_a_replay_while_a_third_records(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    text = SCRIPT
    truth = plain(script)
    # a third script that holds in its second epoch until released: recording while we replay
    gated = tmp_path / "gated.py"
    gated.write_text(
        "import os, time\n"
        + text.replace(
            "    lr *= 0.7\n",
            "    lr *= 0.7\n    while epoch == 1 and not os.path.exists('release'):\n        time.sleep(0.05)\n",
        )
    )
    (tmp_path / "release").touch()
    gated_truth = plain(gated)
    (tmp_path / "release").unlink()

    a, b = _start(tmp_path, "record", script.name), _start(tmp_path, "record", script.name)
    for p in (a, b):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out == truth.out, err
    runs = _runs(tmp_path)
    assert sorted(r["id"] for r in runs) == [1, 2] and {r["status"] for r in runs} == {"complete"}  # type: ignore[type-var]

    # the third record runs while both earlier ones are replayed with a probe
    c = _start(tmp_path, "record", gated.name)
    deadline = time.monotonic() + 60
    while len(_runs(tmp_path)) < 3:
        assert time.monotonic() < deadline, c.stderr
        time.sleep(0.1)
    script.write_text(with_probe(text, "outer"))
    want = probe_lines(plain(script).out)
    for run in (1, 2):
        rep = flortrain(tmp_path, "replay", script.name, "--run", str(run), env=EVERY)
        assert rep.code == 0 and probe_lines(rep.out) == want, rep.err
        assert "replay run" in rep.err and "matches record" in rep.err, rep.err
    assert (
        c.poll() is None and _runs(tmp_path)[2]["status"] == "running"
    )  # the replays overlapped it
    (tmp_path / "release").touch()
    out, err = c.communicate(timeout=300)
    assert c.returncode == 0 and out == gated_truth.out, err
    assert [r["status"] for r in _runs(tmp_path)] == ["complete"] * 5
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out + d.err
