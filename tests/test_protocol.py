"""Every fixture under the correctness protocol (DESIGN.md), for an outer and an inner probe,
replayed serially, and the inner probe by two parallel workers as well (``--jobs 2``: where
parallelism is what makes a replay fast).

Checkpoints are taken at every block instance here (FLORTRAIN_PERIOD=every) so the skip path is
exercised on every instance; ``test_adaptive_period`` covers the default adaptive period. The
parallel replay divides the main loop evenly (FLORTRAIN_SEGMENTS=even), whatever its estimate
says: these fixtures are too small for a division to pay, and it must still be exact.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tests.protocol import (
    PLAIN_RUNS,
    RECORDS,
    block_states,
    copy_fixture,
    fixture_names,
    flortrain,
    latest_run,
    plain,
    probe_lines,
    record,
    replay_of_the_record_matches_plain,
    with_probe,
)

EVERY = {"FLORTRAIN_PERIOD": "every"}
PARALLEL = {**EVERY, "FLORTRAIN_SEGMENTS": "even"}

#: The fixtures whose outer probe executes its inner loop, and the reason the replay gives: the
#: probe reads a name that loop binds and the script never reads after it (a hidden state reset
#: each epoch), so no checkpoint holds it. Every other outer probe skips every instance.
OUTER_EXECUTES = {"rnn_hidden": "reads `hidden`, which only this loop binds"}


@pytest.mark.parametrize("name", fixture_names())
def test_protocol(name: str, tmp_path: Path) -> None:
    script = copy_fixture(name, tmp_path)
    original = script.read_text()
    truth = plain(script)
    assert truth.code == 0, truth.err

    # 1. record prints exactly what a plain run prints
    rec = record(tmp_path, script.name, env=EVERY)
    assert rec.code == 0, rec.err
    assert rec.out == truth.out
    record_id = latest_run(tmp_path)["id"]
    recorded = block_states(tmp_path / ".flortrain", int(record_id))  # type: ignore[call-overload]
    assert recorded.get("checkpointed", 0) > 0, recorded

    for kind in ("outer", "inner"):
        probed = with_probe(original, kind)
        script.write_text(probed)
        expected = plain(script)
        assert expected.code == 0, expected.err
        want = probe_lines(expected.out)
        assert want, f"the {kind} probe printed nothing in a plain run"

        # 2. replay prints the probe lines a plain run of the probed script prints
        rep = flortrain(tmp_path, "replay", script.name, env=EVERY)
        assert rep.code == 0, rep.err
        assert probe_lines(rep.out) == want
        replay = latest_run(tmp_path)
        assert replay["kind"] == "replay" and replay["status"] == "complete"
        states = block_states(tmp_path / ".flortrain", int(replay["id"]))  # type: ignore[arg-type]
        why = OUTER_EXECUTES.get(name) if kind == "outer" else "is inside it"
        if why is None:
            # partial replay: every block instance the record checkpointed is skipped and restored
            assert states == {"skipped": recorded["checkpointed"]}, (states, recorded)
            assert "): execute " not in rep.err, rep.err
        else:
            # the plan executes the probed loop and says why; the replay meets every instance
            assert why in rep.err and states.get("executed", 0) > 0, (states, rep.err)
            assert sum(states.values()) == sum(recorded.values()), (states, recorded)

        # 3. diff proves the replay faithful
        d = flortrain(tmp_path, "diff")
        assert d.code == 0, d.out + d.err

        if kind == "outer":
            script.write_text(original)
            continue  # two workers on outer probes: test_parallel.py and test_ray_backend.py
        # the same with two workers: the merged output is the serial replay's, line for line
        par = flortrain(tmp_path, "replay", script.name, "--jobs", "2", env=PARALLEL)
        assert par.code == 0, par.err
        assert "parallel replay: main loop" in par.err and "worker 2/2 done" in par.err, par.err
        assert par.out == rep.out, par.err
        assert probe_lines(par.out) == want
        d = flortrain(tmp_path, "diff")
        assert d.code == 0, d.out + d.err
        script.write_text(original)


def test_a_ground_truth_is_reused_unless_the_test_says_its_script_races(tmp_path: Path) -> None:
    """``plain`` reuses a run whose inputs match an earlier one; ``cached=False`` runs afresh
    each time and keeps nothing, so a test that retries a racy ground truth gets a new try."""
    assert os.environ.get(PLAIN_RUNS), "conftest sets the session's cache of plain runs"
    script = tmp_path / "coin.py"
    script.write_text("import os\nprint(os.urandom(8).hex())\n")
    first = plain(script)
    assert plain(script).out == first.out
    fresh = [plain(script, cached=False).out for _ in range(2)]
    assert fresh[0] != fresh[1] and first.out not in fresh
    assert plain(script).out == first.out  # a fresh run did not replace the kept one


def test_a_record_is_reused_in_another_directory_and_replays_there(tmp_path: Path) -> None:
    """``record`` copies an earlier record with the same inputs (its process ids are the first
    record's), moved to its new directory: the replay there reads and writes that store only,
    and matches the plain run. A record whose output names its directory is made afresh."""
    assert os.environ.get(RECORDS), "conftest sets the session's cache of records"
    text = (
        "import random\nrandom.seed(3)\nw = 0.0\nfor epoch in range(3):\n"
        "    for i in range(5):\n        w += random.random()\n    #PROBE\n"
        "    print(epoch, round(w, 9))\n"
    )
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
        (d / "train.py").write_text(text)
    assert record(first, "train.py", env=EVERY).code == 0
    rec = record(second, "train.py", env=EVERY)
    assert rec.out == plain(second / "train.py").out and rec.code == 0

    def run_rows(d: Path) -> list[tuple[str, str, str, int]]:
        db = sqlite3.connect(d / ".flortrain" / "flortrain.db")
        try:
            return list(db.execute("SELECT kind, script, cwd, pid FROM runs ORDER BY id"))
        finally:
            db.close()

    [(_, _, _, pid)] = run_rows(first)
    assert run_rows(second) == [("record", str(second / "train.py"), str(second), pid)]
    rep = replay_of_the_record_matches_plain(second, text, 'print("PROBE", epoch, w)', EVERY)
    assert "block instances skipped" in rep.err, rep.err
    assert [r[:3] for r in run_rows(second)] == [
        ("record", str(second / "train.py"), str(second)),
        ("replay", str(second / "train.py"), str(second)),
    ]
    assert len(run_rows(first)) == 1  # the first directory's store is left as it was
    where = "import os\nprint(os.getcwd())\n"
    for d in (first / "a", first / "b"):
        d.mkdir()
        (d / "where.py").write_text(where)
        assert record(d, "where.py").out == f"{d}\n"
