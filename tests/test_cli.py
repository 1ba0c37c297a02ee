"""The CLI contract through click's CliRunner, on small pure-Python training loops (no torch, so
each run takes milliseconds). Ground truth is still a plain run of the same script."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from click.testing import CliRunner

from flortrain.cli import cli
from flortrain.replay.diff import line_differences
from flortrain.store.logs import LogEntry
from tests.protocol import flortrain, plain, probe_lines

# A training loop in plain Python: weights in a list, a global RNG, an accumulator carried over.
SCRIPT = textwrap.dedent(
    """\
    import random
    import sys

    random.seed(1)
    data = [(random.random(), random.random()) for _ in range(40)]
    w = [0.0, 0.0]
    history = []
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for epoch in range(epochs):
        random.shuffle(data)
        total = 0.0
        for x, y in data:
            err = w[0] * x + w[1] - y
            w[0] -= 0.1 * err * x
            w[1] -= 0.1 * err
            total += err * err
        history.append(total)
        print(f"epoch {epoch} loss {total:.12f} w {w[0]:.12f}")
    print("done", len(history))
    """
)


def plain_output(path: Path, argv: list[str] | None = None) -> str:
    """What `python path` prints: the ground truth."""
    import sys

    buf = io.StringIO()
    saved = sys.argv
    sys.argv = [str(path), *(argv or [])]
    try:
        with redirect_stdout(buf):
            exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = saved
    return buf.getvalue()


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLORTRAIN_STORE", str(tmp_path / ".flortrain"))
    monkeypatch.setenv("FLORTRAIN_PERIOD", "every")
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_line_error(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def runs_json() -> list[dict[str, object]]:
    r = invoke("runs", "--json")
    assert r.exit_code == 0
    data: list[dict[str, object]] = json.loads(r.stdout)
    return data


def test_record_prints_what_python_prints(work: Path) -> None:
    r = invoke("record", "train.py")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == plain_output(work / "train.py")
    [run] = runs_json()
    assert {"id", "script", "kind", "status", "started", "duration"} <= set(run)
    assert run["kind"] == "record" and run["status"] == "complete"
    assert run["script"] == str(work / "train.py")
    assert isinstance(run["duration"], float) and run["duration"] >= 0


def test_record_passes_arguments_and_replay_reuses_them(work: Path) -> None:
    r = invoke("record", "train.py", "2")
    assert r.stdout == plain_output(work / "train.py", ["2"])
    assert "epoch 2" not in r.stdout
    text = SCRIPT.replace(
        "    history.append(total)\n",
        "    history.append(total)\n    print('PROBE', epoch, w[1])\n",
    )
    (work / "train.py").write_text(text)
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    probes = probe_lines(rep.stdout)
    assert probes == probe_lines(plain_output(work / "train.py", ["2"]))
    assert len(probes) == 2


def test_outer_probe_replay_skips_and_matches_plain_run(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    probed = SCRIPT.replace(
        "    history.append(total)\n",
        "    history.append(total)\n    print('PROBE', epoch, repr(w[1]), len(data))\n",
    )
    (work / "train.py").write_text(probed)
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    want = probe_lines(plain_output(work / "train.py"))
    assert probe_lines(rep.stdout) == want
    assert "4 block instances skipped, 0 executed" in rep.stderr
    d = invoke("diff")
    assert d.exit_code == 0, d.stdout
    assert "matches" in d.stdout


def test_inner_probe_replay_executes_the_block(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    probed = SCRIPT.replace(
        "        total += err * err\n",
        "        total += err * err\n        print('PROBE', round(err, 9))\n",
    )
    (work / "train.py").write_text(probed)
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    want = probe_lines(plain_output(work / "train.py"))
    assert len(want) == 160
    assert probe_lines(rep.stdout) == want
    assert "0 block instances skipped, 4 executed" in rep.stderr
    assert invoke("diff").exit_code == 0


def test_probe_option_logs_an_expression_without_editing(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    line = SCRIPT.splitlines().index("    history.append(total)") + 1
    rep = invoke("replay", "train.py", "--probe", f"{line}:round(w[0], 9)")
    assert rep.exit_code == 0, rep.stderr
    got = [ln for ln in rep.stdout.splitlines() if ln.startswith("round(w[0], 9) =")]
    assert len(got) == 4
    expected_w0 = [
        ln.split(" w ")[1]
        for ln in plain_output(work / "train.py").splitlines()
        if ln.startswith("epoch")
    ]
    assert [float(g.split("= ")[1]) for g in got] == [round(float(v), 9) for v in expected_w0]
    assert (work / "train.py").read_text() == SCRIPT


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("abc", "expected LINE:EXPR"),
        ("1:", "expected LINE:EXPR"),
        ("3:)(", "not a Python expression"),
        ("9:w", "does not end a simple statement"),
    ],
)
def test_bad_probe_option_is_one_line(work: Path, spec: str, message: str) -> None:
    assert invoke("record", "train.py").exit_code == 0
    line = one_line_error(invoke("replay", "train.py", "--probe", spec))
    assert message in line and "FT024" in line


def test_changed_script_is_refused_naming_the_line(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(SCRIPT.replace("0.1 * err * x", "0.2 * err * x"))
    line = one_line_error(invoke("replay", "train.py"))
    n = SCRIPT.splitlines().index("        w[0] -= 0.1 * err * x") + 1
    assert line.startswith(f"train.py:{n}:1: FT020")
    assert "0.2 * err * x" in line
    assert len(runs_json()) == 1  # nothing ran


def test_trailing_comments_and_spaces_are_not_changes(work: Path) -> None:
    # comments and trailing whitespace on training lines, the memoized loop's header among them,
    # plus a probe: the recorded lines still map to the current ones and the loop is still skipped
    assert invoke("record", "train.py").exit_code == 0
    edited = (
        SCRIPT.replace("    total = 0.0\n", "    total = 0.0  # accumulate\n")
        .replace("    for x, y in data:\n", "    for x, y in data:  # one pass over the batches\n")
        .replace("    random.shuffle(data)\n", "    random.shuffle(data)   \t\n")
        .replace(
            "    history.append(total)\n",
            "    history.append(total)\n    print('PROBE', epoch, repr(w[1]))\n",
        )
    )
    (work / "train.py").write_text(edited)
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    want = probe_lines(plain_output(work / "train.py"))
    assert len(want) == 4
    assert probe_lines(rep.stdout) == want
    assert "4 block instances skipped, 0 executed" in rep.stderr
    assert invoke("diff").exit_code == 0


@pytest.mark.parametrize(
    ("recorded", "current"),
    [
        ("    total = 0.0  # accumulate\n", "    total = 0.0  # sum of squared errors\n"),
        ("    total = 0.0  # accumulate\n", "    total = 0.0\n"),
        ("    total = 0.0\n", "    total=0.0 # spacing between tokens is not code either\n"),
    ],
    ids=["changed", "removed", "spacing"],
)
def test_comment_changed_on_a_line_alone_replays(work: Path, recorded: str, current: str) -> None:
    text = SCRIPT.replace("    total = 0.0\n", recorded)
    (work / "train.py").write_text(text)
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(text.replace(recorded, current))
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    assert rep.stdout == plain_output(work / "train.py")
    assert invoke("diff").exit_code == 0


def test_code_edit_on_a_commented_line_is_refused(work: Path) -> None:
    text = SCRIPT.replace("    total = 0.0\n", "    total = 0.0  # accumulate\n")
    (work / "train.py").write_text(text)
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(
        text.replace("    total = 0.0  # accumulate\n", "    total = 1.0  # accumulate\n")
    )
    line = one_line_error(invoke("replay", "train.py"))
    n = text.splitlines().index("    total = 0.0  # accumulate") + 1
    assert line.startswith(f"train.py:{n}:1: FT020")
    assert "total = 1.0" in line
    assert len(runs_json()) == 1  # nothing ran


def test_edit_inside_a_statement_is_refused(work: Path) -> None:
    multi = SCRIPT.replace(
        "data = [(random.random(), random.random()) for _ in range(40)]",
        "data = [\n    (random.random(), random.random()) for _ in range(40)\n]",
    )
    (work / "train.py").write_text(multi)
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(
        multi.replace(
            "    (random.random(), random.random()) for _ in range(40)\n",
            "    (random.random(), random.random()) for _ in range(40)\n    if True\n",
        )
    )
    line = one_line_error(invoke("replay", "train.py"))
    assert "FT021" in line or "FT002" in line or "FT020" in line


def test_probe_that_rebinds_a_training_name_is_refused(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(
        SCRIPT.replace("    history.append(total)\n", "    history.append(total)\n    total = 0\n")
    )
    assert "FT023" in one_line_error(invoke("replay", "train.py"))


@pytest.mark.parametrize(
    ("probe", "says"),
    [
        ("w[0] = 0.0", "assigns to `w[0]`"),
        ("w[1] += 1.0", "assigns to `w[1]`"),
        ("history.append(0.0)", "calls `history.append()`"),
        ("history.sort()", "calls `history.sort()`"),
        ("random.shuffle(data)", "calls `random.shuffle()` on `data`"),
    ],
)
def test_probe_that_changes_training_state_is_refused(work: Path, probe: str, says: str) -> None:
    # Without the refusal this replays "exactly" and diff passes, because the restored
    # checkpoints overwrite the change, while `python` on the probed script trains differently:
    # a silent disagreement with the ground truth.
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(
        SCRIPT.replace("    history.append(total)\n", f"    history.append(total)\n    {probe}\n")
    )
    line = one_line_error(invoke("replay", "train.py"))
    assert "train.py:18:1: FT025" in line and says in line, line


@pytest.mark.parametrize(
    "probe",
    [
        "print('PROBE', sorted(history)[:1], w[:1], len(data))",  # sorted() copies; slices copy
        "snap = list(w); snap.append(0.0); print('PROBE', snap)",  # the probe's own list
        "print('PROBE', random.random())",  # the global stream is restored after the probe
    ],
)
def test_probes_that_only_observe_replay(work: Path, probe: str) -> None:
    assert invoke("record", "train.py").exit_code == 0
    (work / "train.py").write_text(
        SCRIPT.replace("    history.append(total)\n", f"    history.append(total)\n    {probe}\n")
    )
    r = invoke("replay", "train.py")
    assert r.exit_code == 0, r.stderr
    assert probe_lines(r.stdout) and "FT025" not in r.stderr


def test_replay_without_record_and_diff_without_replay(work: Path) -> None:
    assert "FT013" in one_line_error(invoke("diff"))  # read-only commands never create a store
    assert invoke("runs", "--json").stdout.strip() == "[]"
    assert "FT013" in one_line_error(invoke("replay", "train.py"))  # nor does replay
    assert not (work / ".flortrain").exists()
    (work / "other.py").write_text("print('other')\n")
    assert invoke("record", "other.py").exit_code == 0
    assert "FT031" in one_line_error(invoke("replay", "train.py"))  # no record of this script
    assert "FT030" in one_line_error(invoke("diff"))
    assert "no such file" in one_line_error(invoke("record", "missing.py"))


@pytest.mark.parametrize("as_json", [False, True])
def test_runs_on_a_store_that_is_not_a_directory_is_an_error(work: Path, as_json: bool) -> None:
    # only an absent store has no runs; a file in its place is an error, as it is for record
    (work / "notadir").write_text("")
    args = ["--store", "notadir", "runs", *(["--json"] if as_json else [])]
    r = invoke(*args)
    line = one_line_error(r)
    assert "FT010" in line and "not a directory" in line.lower()
    assert r.stdout == ""
    assert "FT010" in one_line_error(invoke("--store", "notadir", "record", "train.py"))
    (work / "garbage").mkdir()
    (work / "garbage" / "flortrain.db").write_text("not a database\n" * 100)
    # a store flortrain did not make is refused before anything in it is read; trusted, its
    # database is still not one
    assert "FT015" in one_line_error(invoke("--store", "garbage", "runs", *args[3:]))
    assert "FT010" in one_line_error(invoke("--trust", "--store", "garbage", "runs", *args[3:]))
    assert invoke("--store", "absent", *args[2:]).stdout.strip() in (
        "[]",
        f"no runs in {work / 'absent'}",
    )


@pytest.mark.parametrize(
    "args",
    [
        ["instrument"],
        ["diff", "abc"],
        ["replay", "train.py", "--jobs", "x"],
        ["replay", "train.py", "--nope"],
        ["frobnicate"],
    ],
)
def test_usage_errors_are_one_line(work: Path, args: list[str]) -> None:
    line = one_line_error(invoke(*args))
    assert line.startswith("flortrain: ") and "--help" in line


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("FLORTRAIN_EPSILON", "abc"),
        ("FLORTRAIN_EPSILON", "-1"),
        ("FLORTRAIN_PERIOD", "often"),
        ("FLORTRAIN_COMMIT_INTERVAL", "-2"),
        ("FLORTRAIN_WRITER_BACKLOG_MB", "lots"),
        ("FLORTRAIN_ARENA_WARM_MB", "-5"),
    ],
)
def test_bad_knobs_fail_before_running(
    work: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    assert "FT050" in one_line_error(invoke("record", "train.py"))
    assert runs_json() == []


def test_parallel_replay_with_nothing_to_divide_runs_serially(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert invoke("record", "train.py").exit_code == 0
    rep = invoke("replay", "train.py", "--jobs", "2")  # too small a loop to pay for workers
    assert rep.exit_code == 0, rep.stderr
    assert "replaying serially: dividing main loop" in rep.stderr and "cannot pay" in rep.stderr
    monkeypatch.setenv(
        "FLORTRAIN_SEGMENTS", "even"
    )  # divide whatever the costs: the planner decides
    rep = invoke("replay", "train.py", "--jobs", "2")  # no probe: nothing worth dividing
    assert rep.exit_code == 0, rep.stderr
    assert "replaying serially: no probes" in rep.stderr
    assert "matches record" in rep.stderr
    assert "--jobs" in one_line_error(invoke("replay", "train.py", "--jobs", "0"))


def test_diff_reports_a_nondeterministic_script(work: Path) -> None:
    # An unseeded RNG: record and replay genuinely differ, and diff must say so.
    (work / "train.py").write_text(SCRIPT.replace("random.seed(1)", "random.seed()"))
    assert invoke("record", "train.py").exit_code == 0
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 1 and "not faithful" in rep.stderr, rep.stderr
    d = invoke("diff")
    assert d.exit_code == 1
    # Every block was skipped and restored, so the printed losses agree; the RNG digests taken at
    # each main-loop boundary still expose the unseeded stream from the first iteration on.
    # ... and name it: Python's global stream, the one the script draws from
    assert "RNG streams differ at the start of M9 iteration 0 (entry 0): `rng.random`" in d.stdout


def test_a_replay_that_finds_itself_unfaithful_exits_1(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Training reads an environment variable that changed since the record: the inner loop the
    # probe makes execute trains with another rate, and the replay's own check sees it. It must
    # print every probe line (what this run computes) and say what differed, and exit 1 as
    # `diff` does, so that a script or CI does not take it for a faithful replay.
    text = SCRIPT.replace("import sys\n", "import os\nimport sys\n").replace(
        "w[0] -= 0.1 * err * x", "w[0] -= float(os.environ.get('LR', '0.1')) * err * x"
    )
    (work / "train.py").write_text(text)
    assert invoke("record", "train.py").stdout == plain_output(work / "train.py")
    probe = "        if (x, y) == data[0]: print('PROBE', epoch, err)\n"
    (work / "train.py").write_text(
        text.replace("        total += err * err\n", "        total += err * err\n" + probe)
    )
    monkeypatch.setenv("LR", "0.2")
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 1, rep.stderr
    assert probe_lines(rep.stdout) == probe_lines(plain_output(work / "train.py"))
    assert len(probe_lines(rep.stdout)) == 4
    assert "differs from record 1" in rep.stderr and "record: epoch 0 loss" in rep.stderr, (
        rep.stderr
    )
    assert "state differs from the record's checkpoint" in rep.stderr
    assert "warning: the replay is not faithful" in rep.stderr
    assert invoke("diff").exit_code == 1


def test_seeding_inside_the_main_loop_is_deterministic(work: Path) -> None:
    # The stream is seeded at the top of every iteration: its state at the first boundary is the
    # process's OS entropy, never drawn from, and must not count as a divergence.
    text = textwrap.dedent(
        """\
        import random

        for run in range(3):
            random.seed(run)
            w = 0.0
            for i in range(5):
                w += random.random()
            #PROBE
            print(run, w)
        """
    )
    (work / "train.py").write_text(text)
    assert invoke("record", "train.py").stdout == plain_output(work / "train.py")
    probed = work / "train.py"
    probed.write_text(text.replace("    #PROBE", "    print('PROBE', run, w)"))
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    assert probe_lines(rep.stdout) == probe_lines(plain_output(probed))
    assert "not faithful" not in rep.stderr
    d = invoke("diff")
    assert d.exit_code == 0, d.stdout
    assert "RNG streams equal at 3 main-loop iteration boundaries" in d.stdout


def test_diff_shows_loop_context_of_a_tampered_line(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    assert invoke("replay", "train.py").exit_code == 0
    db = sqlite3.connect(os.environ["FLORTRAIN_STORE"] + "/flortrain.db")
    db.execute(
        "UPDATE logs SET text='epoch 2 loss tampered' WHERE run_id=1 AND text LIKE 'epoch 2 %'"
    )
    db.commit()
    db.close()
    d = invoke("diff", "2")
    assert d.exit_code == 1
    assert "iteration 2" in d.stdout and "epoch 2 loss tampered" in d.stdout


def test_script_exit_code_and_traceback_point_at_user_file(work: Path) -> None:
    bad = SCRIPT.replace(
        "        total += err * err\n",
        "        total += err * err\n        if epoch == 1:\n            raise ValueError('boom')\n",
    )
    (work / "train.py").write_text(bad)
    r = invoke("record", "train.py")
    assert r.exit_code == 1
    n = bad.splitlines().index("            raise ValueError('boom')") + 1
    # the frame Python itself would show: the absolute path of the user's file, its own line
    assert f'File "{work / "train.py"}", line {n}, in <module>' in r.stderr
    assert "ValueError: boom" in r.stderr
    # the whole traceback, carets included, is the one `python train.py` prints
    truth = plain(work / "train.py")
    assert truth.err in r.stderr
    assert "flortrain/" not in r.stderr.split("Traceback")[1].split("ValueError")[0]
    assert runs_json()[0]["status"] == "failed"
    (work / "train.py").write_text(
        SCRIPT.replace('print("done", len(history))', "raise SystemExit(3)")
    )
    assert invoke("record", "train.py").exit_code == 3


def test_warnings_point_at_user_file_and_line(work: Path) -> None:
    warned = SCRIPT.replace(
        "    history.append(total)\n",
        "    history.append(total)\n    if epoch == 1:\n        import warnings; warnings.warn('loss plateau')\n",
    )
    (work / "train.py").write_text(warned)
    truth = plain(work / "train.py")
    n = warned.splitlines().index("        import warnings; warnings.warn('loss plateau')") + 1
    assert f"{work / 'train.py'}:{n}: UserWarning: loss plateau" in truth.err
    # a real process: pytest would catch the warning of an in-process CliRunner call
    r = flortrain(work, "record", "train.py")
    assert r.code == 0 and r.out == truth.out
    # the warning and the source line under it, exactly as `python train.py` shows them
    assert truth.err in r.err


def test_instrument_and_explain(work: Path) -> None:
    r = invoke("instrument", "train.py")
    assert r.exit_code == 0
    compile(r.stdout, "train.py", "exec")
    assert "__flortrain__.main_iteration(" in r.stdout
    e = invoke("instrument", "--explain", "train.py")
    assert "main loop M9" in e.stdout
    assert "memoized for loop L12" in e.stdout
    assert "w [in_place]" in e.stdout and "total [rebound]" in e.stdout
    (work / "bad.py").write_text("for x in y:\nprint(x)\n")
    line = one_line_error(invoke("instrument", "bad.py"))
    assert line.startswith("bad.py:2:") and "FT002" in line


DOTS = textwrap.dedent(
    """\
    import random

    random.seed(2)
    w = 0.0
    for epoch in range(3):
        print(f"epoch {epoch} ", end="")
        for i in range(8):
            w += random.random() - 0.5
            print(".", end="", flush=True)
            #INNER
        print(f" done {w:.9f}")
        #OUTER
    """
)


@pytest.mark.parametrize(
    ("marker", "probe"),
    [("#OUTER", "print('PROBE', epoch, w)"), ("#INNER", "print('PROBE', i)")],
)
def test_lines_that_span_regions_and_probes(work: Path, marker: str, probe: str) -> None:
    # A progress line is written partly by the epoch loop and partly by the batch loop; an inner
    # probe's newline lands in the middle of it. diff must compare what both runs printed.
    (work / "train.py").write_text(DOTS)
    rec = invoke("record", "train.py")
    assert rec.exit_code == 0 and rec.stdout == plain_output(work / "train.py"), rec.stderr
    indent = " " * (8 if marker == "#INNER" else 4)
    probed = (
        DOTS.replace(indent + marker, indent + probe).replace("#INNER", "").replace("#OUTER", "")
    )
    (work / "train.py").write_text(probed)
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    truth = plain_output(work / "train.py")
    if marker == "#INNER":
        assert rep.stdout == truth  # the probed batch loops re-executed: byte-identical
    else:  # the batch loops restored, not run: python's output without their eight dots each
        assert truth.count("." * 8) == 3 and rep.stdout == truth.replace("." * 8, "")
    d = invoke("diff")
    assert d.exit_code == 0, d.stdout


WHILE_INNER = textwrap.dedent(
    """\
    import random

    random.seed(5)
    w = 1.0
    steps = 0
    epoch = 0
    while epoch < 4:
        i = 0
        while i < 6 and w > 0:
            w -= random.random() * 0.01
            i += 1
            steps += 1
        print(f"epoch {epoch} w {w:.12f} steps {steps}")
        #PROBE
        epoch += 1
    """
)


def test_while_inner_loop_is_skipped_and_restored(work: Path) -> None:
    # an inner `while` block: skipped through `live() and (cond)` without evaluating cond
    (work / "train.py").write_text(WHILE_INNER)
    assert invoke("record", "train.py").exit_code == 0
    # the probe reads what the loop leaves for the code after it (`i` is reset before any read,
    # so no checkpoint holds it, and a probe of it would execute the loop: test_liveness.py)
    (work / "train.py").write_text(
        WHILE_INNER.replace("    #PROBE", "    print('PROBE', repr(w), steps)")
    )
    rep = invoke("replay", "train.py")
    assert rep.exit_code == 0, rep.stderr
    want = probe_lines(plain_output(work / "train.py"))
    assert probe_lines(rep.stdout) == want
    assert "4 block instances skipped, 0 executed" in rep.stderr
    assert invoke("diff").exit_code == 0


def test_bare_flortrain_prints_help(work: Path) -> None:
    r = invoke()
    assert r.exit_code == 0
    assert r.stdout.startswith("Usage: ") and "Commands:" in r.stdout and "replay" in r.stdout


def test_a_store_from_another_schema_is_refused_before_the_script_runs(work: Path) -> None:
    store = work / ".flortrain"
    store.mkdir()
    db = sqlite3.connect(store / "flortrain.db")
    db.execute("CREATE TABLE logs (run_id INTEGER, seq INTEGER, text TEXT)")  # an older layout
    db.commit()
    db.close()
    assert "FT015" in one_line_error(invoke("record", "train.py"))  # no manifest: not provably ours
    r = invoke("--trust", "record", "train.py")
    assert "FT014" in one_line_error(r) and "another version of flortrain" in r.stderr
    assert r.stdout == ""  # refused before the script printed anything
    assert "FT014" in one_line_error(invoke("runs"))  # trusted once: now it is signed as ours


def test_replay_with_a_mistyped_store_creates_nothing(work: Path) -> None:
    assert invoke("record", "train.py").exit_code == 0
    r = invoke("--store", str(work / "typo"), "replay", "train.py")
    assert "FT013" in one_line_error(r)
    assert not (work / "typo").exists()


def test_the_script_sees_the_globals_python_gives_it(work: Path) -> None:
    (work / "train.py").write_text(
        "print(type(__builtins__).__name__, type(__loader__).__name__, __spec__, __cached__,"
        " __annotations__, __builtins__.len([1]))\n"
    )
    r = invoke("record", "train.py")
    assert r.exit_code == 0
    # a real interpreter: `plain_output` execs in-process, with other globals
    assert r.stdout == plain(work / "train.py").out == "module SourceFileLoader None None {} 1\n"


def test_traceback_through_the_stdout_tee_is_pythons(work: Path) -> None:
    # The error is raised inside flortrain's stdout tee, below the user's frame: the traceback
    # must still be the one `python train.py` prints, with no flortrain frame in it.
    (work / "train.py").write_text('import sys\nsys.stdout.write("a\\n")\nsys.stdout.write(5)\n')
    truth = plain(work / "train.py")
    assert truth.code == 1 and "TypeError" in truth.err
    r = flortrain(work, "record", "train.py")
    assert r.code == 1 and r.out == truth.out
    assert truth.err in r.err
    assert "flortrain/" not in r.err.split("Traceback")[1]


def test_instrument_output_of_a_latin1_file_runs_as_printed(work: Path) -> None:
    (work / "l1.py").write_bytes(b'# -*- coding: latin-1 -*-\nprint("caf\xe9")\n')
    r = invoke("instrument", "l1.py")
    assert r.exit_code == 0 and r.stdout.startswith("# -*- coding: utf-8 -*-\n")
    (work / "printed.py").write_text(r.stdout, encoding="utf-8")
    assert plain(work / "printed.py").out == "café\n"


def test_executed_instances_are_compared_with_the_checkpointed_state(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLORTRAIN_PERIOD", "every")
    assert invoke("record", "train.py").exit_code == 0
    probed = SCRIPT.replace(
        "        total += err * err\n",
        "        total += err * err\n        print('PROBE', round(err, 9))\n",
    )
    (work / "train.py").write_text(probed)
    assert invoke("replay", "train.py").exit_code == 0
    d = invoke("diff")
    assert d.exit_code == 0, d.stdout
    assert "state equal at 4 checkpoints" in d.stdout
    # a record whose checkpoint of epoch 2 held other weights than the replay computes
    db = sqlite3.connect(os.environ["FLORTRAIN_STORE"] + "/flortrain.db")
    ((key, sha),) = db.execute(
        "SELECT key, state_sha FROM blocks WHERE run_id=1 AND iteration=2 AND state != 'boundary'"
    ).fetchall()
    parts = json.loads(sha)
    parts["objects:w"] = parts["objects:w"][:1] + "0" * 32  # same kind of digest, other state
    db.execute("UPDATE blocks SET state_sha=? WHERE run_id=1 AND key=?", (json.dumps(parts), key))
    db.commit()
    db.close()
    d = invoke("diff")
    assert d.exit_code == 1
    assert f"state differs from the record's checkpoint after {key}: `w`" in d.stdout


def test_an_inserted_line_is_one_difference() -> None:
    def line(seq: int, text: str) -> LogEntry:
        return LogEntry(seq, text, "M1", 0, seq, None, False)

    a = [line(i, t) for i, t in enumerate("abcdef")]
    extra = line(2, "extra")
    assert line_differences(a, [*a[:2], extra, *a[2:]]) == [(None, extra)]
    assert line_differences(a, a) == []
    changed = line(3, "D")
    assert line_differences(a, [*a[:3], changed, *a[4:]]) == [(a[3], changed)]
    assert line_differences(a, a[:4]) == [(a[4], None), (a[5], None)]


def test_a_broken_install_is_one_line_not_a_traceback(work: Path) -> None:
    """One of flortrain's own modules failing to import (a half-upgraded install) is an internal
    error: one line and exit 2, even though the console script's interrupt check runs after it."""
    breaker = textwrap.dedent(
        """\
        import sys
        from importlib.abc import MetaPathFinder

        class Broken(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "flortrain.checkpoint.writer":
                    raise SyntaxError("'(' was never closed")
                return None

        sys.meta_path.insert(0, Broken())
        sys.argv = ["flortrain", "record", "train.py"]
        from flortrain.cli import main
        main()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", breaker], cwd=work, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "flortrain: internal error: SyntaxError: '(' was never closed (FLORTRAIN_DEBUG=1 shows the traceback)"
    ], proc.stderr
    assert not (work / ".flortrain").exists()
