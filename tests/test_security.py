"""The store is the user's own (flortrain/store/trust.py): private modes, refused when another user
owns it or its manifest does not verify (a copied store) unless ``--trust``, liveness by lock and
not by pid. Pure-Python training loops, so every process starts in a fraction of a second."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flortrain.store.blobs import digest
from tests.protocol import flortrain, latest_run, plain, probe_lines

SCRIPT = textwrap.dedent(
    """\
    import random

    random.seed(3)
    w = [0.0, 0.0]
    data = [(random.random(), random.random()) for _ in range(30)]
    for epoch in range(4):
        random.shuffle(data)
        total = 0.0
        for x, y in data:
            err = w[0] * x + w[1] - y
            w[0] -= 0.1 * err * x
            w[1] -= 0.1 * err
            total += err * err
        #PROBE
        print(f"epoch {epoch} loss {total:.12f}")
    """
)
PROBE = "    print('PROBE', epoch, repr(w[0]))"


def _recorded(tmp: Path, env: dict[str, str] | None = None) -> Path:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    rec = flortrain(tmp, "record", "train.py", env={"FLORTRAIN_PERIOD": "every", **(env or {})})
    assert rec.code == 0 and rec.out == plain(script).out, rec.err
    return script


def _probed(script: Path) -> list[str]:
    script.write_text(SCRIPT.replace("    #PROBE", PROBE))
    want = probe_lines(plain(script).out)
    assert len(want) == 4
    return want


def _one_line(err: str, code: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and code in lines[0] and "Traceback" not in err, err


def test_the_store_is_private_whatever_the_umask(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    p = subprocess.run(
        ["sh", "-c", f"umask 000; {sys.executable} -m flortrain record train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "FLORTRAIN_PERIOD": "every"},
    )
    assert p.returncode == 0, p.stderr
    store = tmp_path / ".flortrain"
    seen = {"dir": 0, "file": 0}
    for path in [store, *store.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        kind = "dir" if path.is_dir() else "file"
        assert mode == (0o700 if kind == "dir" else 0o600), f"{path} is {oct(mode)}"
        seen[kind] += 1
    assert seen["file"] >= 4, seen  # database, manifest, a lock, checkpoint blobs


def test_a_store_owned_by_someone_else_is_refused_unless_trusted(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("handing the store to another uid takes root")
    script = _recorded(tmp_path)
    want = _probed(script)
    store = tmp_path / ".flortrain"
    os.chown(store, 4242, 4242)
    rep = flortrain(tmp_path, "replay", "train.py")
    _one_line(rep.err, "FT015")
    assert rep.code == 2 and "owned by uid 4242" in rep.err and rep.out == ""
    runs = flortrain(tmp_path, "runs")
    assert runs.code == 2 and "FT015" in runs.err
    trusted = flortrain(tmp_path, "--trust", "replay", "train.py")
    assert trusted.code == 0 and probe_lines(trusted.out) == want, trusted.err
    os.chown(store, 0, 0)


def test_a_group_writable_store_is_refused(tmp_path: Path) -> None:
    _recorded(tmp_path)
    os.chmod(tmp_path / ".flortrain", 0o770)
    r = flortrain(tmp_path, "runs")
    _one_line(r.err, "FT015")
    assert "others can write to it" in r.err


def _crafted(store: Path, marker: Path) -> None:
    """Replace a checkpoint with a pickle that runs a command when loaded, and fix up its hash in
    the database: what someone who hands you a store can do."""

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    data = b"P" + pickle.dumps({"w": Exploit()})
    db = sqlite3.connect(store / "flortrain.db")
    for key, rel in db.execute("SELECT key, path FROM checkpoints").fetchall():
        (store / "blobs" / rel).write_bytes(data)
        db.execute(
            "UPDATE checkpoints SET sha256=?, nbytes=? WHERE key=?",
            (digest(key, data), len(data), key),
        )
    db.commit()
    db.close()


def test_a_copied_store_is_refused_and_its_pickles_never_loaded(tmp_path: Path) -> None:
    # recorded under another identity (another user's key): a store someone handed over
    other = tmp_path / "other.key"
    script = _recorded(tmp_path, env={"FLORTRAIN_KEY_FILE": str(other)})
    _probed(script)
    marker = tmp_path / "PWNED"
    _crafted(tmp_path / ".flortrain", marker)
    rep = flortrain(tmp_path, "replay", "train.py")
    _one_line(rep.err, "FT015")
    assert rep.code == 2 and "manifest does not verify" in rep.err and rep.out == ""
    assert not marker.exists()
    for cmd in (["runs"], ["diff"], ["record", "train.py"]):
        r = flortrain(tmp_path, *cmd)
        assert r.code == 2 and "FT015" in r.err, (cmd, r.err)
    assert not marker.exists()
    # the gate is what stopped it: trusting the store runs the crafted pickle (which is what
    # --trust means, and why it is never the default)
    flortrain(tmp_path, "--trust", "replay", "train.py")
    assert marker.exists()


def test_a_trusted_copy_becomes_the_users_own(tmp_path: Path) -> None:
    other = tmp_path / "other.key"
    script = _recorded(tmp_path, env={"FLORTRAIN_KEY_FILE": str(other)})
    want = _probed(script)
    assert flortrain(tmp_path, "replay", "train.py").code == 2
    trusted = flortrain(tmp_path, "--trust", "replay", "train.py")
    assert trusted.code == 0 and probe_lines(trusted.out) == want, trusted.err
    again = flortrain(tmp_path, "replay", "train.py")  # signed with this user's key now: no --trust
    assert again.code == 0 and probe_lines(again.out) == want, again.err


def test_a_tampered_manifest_does_not_verify(tmp_path: Path) -> None:
    _recorded(tmp_path)
    path = tmp_path / ".flortrain" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["uid"] = 4242
    path.write_text(json.dumps(doc))
    r = flortrain(tmp_path, "runs")
    _one_line(r.err, "FT015")
    (tmp_path / ".flortrain" / "manifest.json").unlink()
    r = flortrain(tmp_path, "runs")
    assert r.code == 2 and "has no manifest" in r.err


def test_a_killed_run_is_incomplete_even_when_its_pid_is_reused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        SCRIPT.replace(
            "    #PROBE",
            "    if epoch == 2:\n        import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        )
    )
    rec = flortrain(tmp_path, "record", "train.py")
    assert rec.code == -signal.SIGKILL
    run = latest_run(tmp_path)
    assert run["status"] == "incomplete"
    # a live process now has the dead run's pid (the pid was reused): still incomplete
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
        db.execute("UPDATE runs SET pid=? WHERE id=?", (sleeper.pid, run["id"]))
        db.commit()
        db.close()
        assert latest_run(tmp_path)["status"] == "incomplete"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_running_record_reads_as_running(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import time\nfor i in range(200):\n    time.sleep(0.05)\nprint('done')\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / ".flortrain" / "flortrain.db").exists() or not json.loads(
            flortrain(tmp_path, "runs", "--json").out or "[]"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert latest_run(tmp_path)["status"] == "running"
    finally:
        p.kill()
        p.wait()
    # the materializer's writer shares the lock and notices its parent's death within a second
    # (docs/reliability.md: a run whose writer is still finishing reads as running)
    deadline = time.monotonic() + 10
    while latest_run(tmp_path)["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert latest_run(tmp_path)["status"] == "incomplete"
