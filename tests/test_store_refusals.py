"""A damaged or tampered store is refused in one line, never a crash, a read or write outside
the store, or a replay that prints the wrong lines (docs/store.md, "Validation"). Each test
records the same pure-Python script (the record is reused across them, tests/protocol.record)
and then edits what someone handing over a store, or a damaged disk, could edit."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from tests.protocol import flortrain, plain, probe_lines, record
from tests.test_security import PROBE, SCRIPT

ENV = {"FLORTRAIN_PERIOD": "every"}


def _recorded(tmp: Path) -> tuple[Path, list[str]]:
    """The script recorded in ``tmp``, probed; the probe lines a plain run prints."""
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    rec = record(tmp, "train.py", env=ENV)
    assert rec.code == 0 and rec.out == plain(script).out, rec.err
    script.write_text(SCRIPT.replace("    #PROBE", PROBE))
    want = probe_lines(plain(script).out)
    assert len(want) == 4
    return script, want


def _sql(tmp: Path, statement: str, *args: object) -> None:
    db = sqlite3.connect(tmp / ".flortrain" / "flortrain.db")
    try:
        with db:
            assert db.execute(statement, args).rowcount > 0, statement
    finally:
        db.close()


def _refused(err: str, code: str, *words: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and code in lines[0] and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), err


def test_a_thread_count_out_of_range_is_refused_not_a_crash(tmp_path: Path) -> None:
    """``runs.threads`` sizes torch's thread pool: 100000 would kill the replay (SIGSEGV)."""
    _recorded(tmp_path)
    _sql(tmp_path, "UPDATE runs SET threads=100000")
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 2, (rep.code, rep.err)
    _refused(rep.err, "FT018", "run 1", "threads 100000")
    runs = flortrain(tmp_path, "runs")
    assert runs.code == 2
    _refused(runs.err, "FT018", "threads")


def test_a_checkpoint_path_that_leaves_the_store_is_refused(tmp_path: Path) -> None:
    """A row naming ``../x`` or an absolute path is refused before any blob is read, even where
    the file it names holds the checkpoint's own bytes."""
    _recorded(tmp_path)
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    key, rel = db.execute("SELECT key, path FROM checkpoints ORDER BY rowid LIMIT 1").fetchone()
    db.close()
    blob = (tmp_path / ".flortrain" / "blobs" / rel).read_bytes()
    outside = tmp_path / "outside.ft"
    outside.write_bytes(blob)
    for path in ("../../outside.ft", str(outside)):
        _sql(tmp_path, "UPDATE checkpoints SET path=? WHERE key=?", path, key)
        rep = flortrain(tmp_path, "replay", "train.py")
        assert rep.code == 2, (path, rep.code, rep.err)
        _refused(rep.err, "FT018", key, "leaves the store")
        assert rep.out == ""  # refused before the script ran


def test_a_symbolic_link_planted_as_a_runs_blob_directory_is_not_followed(tmp_path: Path) -> None:
    """The next record's blob directory (``blobs/2``) made a link to a directory outside the
    store: the record refuses in one line, before the script runs, and writes nothing there."""
    _recorded(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / ".flortrain" / "blobs" / "2")
    rec = flortrain(tmp_path, "record", "train.py", env=ENV)
    assert rec.code == 2, (rec.code, rec.err)
    _refused(rec.err, "FT010", "cannot start run 2", "blobs/2")
    assert rec.out == "" and list(elsewhere.iterdir()) == []


def test_a_symbolic_link_planted_as_the_blob_directory_is_refused(tmp_path: Path) -> None:
    _recorded(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    store = tmp_path / ".flortrain"
    elsewhere = tmp_path / "elsewhere"
    os.rename(store / "blobs", elsewhere)
    os.symlink(elsewhere, store / "blobs")
    before = sorted(p.name for p in elsewhere.rglob("*"))
    rec = flortrain(tmp_path, "record", "train.py", env=ENV)
    assert rec.code == 2, (rec.code, rec.err)
    _refused(rec.err, "FT010")
    assert sorted(p.name for p in elsewhere.rglob("*")) == before


def test_two_checkpoint_rows_swapped_are_re_executed_not_restored(tmp_path: Path) -> None:
    """Each checkpoint's digest covers its key: two rows whose keys are exchanged name each
    other's blobs, which no longer verify, so those instances re-execute (the damaged-checkpoint
    path) and the probe prints what a plain run prints."""
    _, want = _recorded(tmp_path)
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    rows = db.execute(
        "SELECT key, path, sha256, nbytes FROM checkpoints WHERE key LIKE 'L%' ORDER BY rowid"
    ).fetchall()
    db.close()
    assert len(rows) >= 2, rows
    (a, *one), (b, *other) = rows[:2]
    for key, (path, sha, n) in ((a, other), (b, one)):
        _sql(
            tmp_path,
            "UPDATE checkpoints SET path=?, sha256=?, nbytes=? WHERE key=?",
            path,
            sha,
            n,
            key,
        )
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want, rep.out
    assert f"checkpoint {a} is missing or corrupt" in rep.err, rep.err
    assert f"checkpoint {b} is missing or corrupt" in rep.err, rep.err


def test_edited_deterministic_settings_are_refused_before_they_are_applied(tmp_path: Path) -> None:
    """A ``--deterministic`` run's settings (its meta) are applied by replay in the training
    process: a seed that is not a 64-bit count, a field flortrain never writes or a workspace
    setting that is not of torch's form is refused in one line, before the script runs."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    rec = record(tmp_path, "--deterministic", "train.py", env=ENV)
    assert rec.code == 0, rec.err
    script.write_text(SCRIPT.replace("    #PROBE", PROBE))
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0, rep.err  # untouched, the settings replay
    edits = {
        '{"seed": -1}': "seed -1",
        '{"seed": "0"}': "seed '0'",
        '{"seed": 0, "preload": "os"}': "not what --deterministic stores",
        '{"cublas_workspace": ":4096:8 ; rm"}': "cublas_workspace",
        "null": "None is not what --deterministic stores",
    }
    for value, words in edits.items():
        _sql(tmp_path, "UPDATE runs SET meta=json_set(meta, '$.deterministic', json(?))", value)
        rep = flortrain(tmp_path, "replay", "train.py")
        assert rep.code == 2, (value, rep.code, rep.err)
        _refused(rep.err, "FT018", "deterministic settings", words)
        assert rep.out == ""
