"""The correctness protocol of DESIGN.md, as reusable steps.

Ground truth is always a plain ``python SCRIPT`` run in a fresh process:
1. ``flortrain record S`` prints the same bytes as ``python S``;
2. ``flortrain replay S'`` prints the probe lines ``python S'`` prints, identical and in order;
3. ``flortrain diff`` exits 0.

What a test's script costs. The suite is bound by the CPU of the processes it starts, and a
process that trains with torch pays about a CPU-second for ``import torch`` and another for
``torch._dynamo``, which torch imports the first time an optimizer is made or called. So each
test's script is as small as its subject allows: plain Python where the subject is Python
state, control flow or the processes around training (0.05 CPU-s a plain run, 0.4 a record);
torch trained by hand (``p -= lr * p.grad`` under ``no_grad``) where tensors, modules or autograd
are the subject but the optimizer is not; ``torch.optim`` where the optimizer is (its state,
groups, closures, schedulers, what shares with it). The fixtures and the toy train with
``torch.optim``, as most scripts do, and the real-code fixtures as their originals do; the toy's
plain-Python twin is :data:`PY_TOY_PRELUDE`. Records and ground truths with the same inputs are
made once a session (:func:`record`, :func:`plain`): tests that replay one script with different
probes share its record.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MARKER = re.compile(r"^(?P<indent>[ \t]*)# flortrain-probe (?P<kind>outer|inner): (?P<stmt>.+)$")


def fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.py"))


def with_probe(text: str, kind: str) -> str:
    """The fixture with one marker comment turned into its probe statement."""
    out = []
    found = 0
    for line in text.splitlines(keepends=True):
        m = MARKER.match(line.rstrip("\n"))
        if m and m.group("kind") == kind:
            out.append(f"{m.group('indent')}{m.group('stmt')}\n")
            found += 1
        else:
            out.append(line)
    assert found == 1, f"expected one {kind} marker, found {found}"
    return "".join(out)


@dataclass
class Result:
    code: int
    out: str
    err: str
    #: how long the run took (for a result :func:`plain` reused: the run that made it)
    seconds: float = 0.0


def run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> Result:
    full_env = {**os.environ, **(env or {})}
    log = os.environ.get(CPU_LOG)
    t0, cpu0 = time.perf_counter(), _children_cpu()
    p = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    result = Result(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)
    if log:
        _log_process(log, cmd, result, _children_cpu() - cpu0)
    return result


#: with this set to a file, conftest appends each test's CPU seconds to it, and :func:`run`
#: appends to ``FILE.processes`` one line per process it starts: the test, what ran, its wall and
#: CPU seconds
CPU_LOG = "FLORTRAIN_TEST_CPU_LOG"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _log_process(log: str, cmd: list[str], result: Result, cpu: float) -> None:
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    what = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd[:4]))
    with open(f"{log}.processes", "a") as f:
        f.write(f"{test}\t{what}\t{result.seconds:.2f}\t{cpu:.2f}\n")


#: where :func:`plain` keeps the runs of this test session (set by conftest for every worker)
PLAIN_RUNS = "FLORTRAIN_TEST_PLAIN_RUNS"


def plain(script: Path, args: list[str] | None = None, cached: bool = True) -> Result:
    """The ground truth: ``python SCRIPT ARGS`` in a fresh process, in the script's directory.

    Many tests run the same script in the same state more than once (the same fixture in
    several test files; a probe replayed under two periods). A fresh process given the same
    inputs prints the same bytes (the suite asserts exactly that of every script it records), so
    a run whose inputs match an earlier one of this session returns that run's result instead
    of paying another ~4 s of torch import. The inputs are the interpreter, the arguments, the
    environment (pytest's and the session's own ``FLORTRAIN_TEST_*`` variables aside) and every
    file under the directory (flortrain's stores excepted: a plain run never reads them); a
    result that names the directory it ran in is reused only there. A hit does not run the
    script, so its side effects (files it writes) do not happen again; a run killed by a signal
    is not kept. The cache lives for one session: a directory of your own
    in ``FLORTRAIN_TEST_PLAIN_RUNS`` is not cleaned, and knows nothing of torch upgrades.

    ``cached=False`` runs the script whatever the cache holds, and keeps nothing: for a script
    whose output is not a function of its inputs (a race inside torch), where a test retries
    the ground truth until it takes one path. Reused, the first run's path would be every
    retry's."""
    cmd = [sys.executable, script.name, *(args or [])]
    cache = os.environ.get(PLAIN_RUNS) if cached else None
    if not cache:
        return run(cmd, script.parent)
    cwd = str(script.parent)
    entry = Path(cache) / f"{_inputs(cmd, script.parent)}.json"
    if entry.exists():
        saved = json.loads(entry.read_text())
        if saved["cwd"] == cwd or not saved["names_cwd"]:
            return Result(saved["code"], saved["out"], saved["err"], saved["seconds"])
    result = run(cmd, script.parent)
    if result.code < 0:  # killed (the machine's load, the OOM killer): not the script's answer
        return result
    names_cwd = any(c in result.out + result.err for c in {cwd, os.path.realpath(cwd)})
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({**vars(result), "cwd": cwd, "names_cwd": names_cwd}, f)
    os.replace(tmp, entry)  # atomic: the other worker may be writing the same entry
    return result


def _inputs(cmd: list[str], cwd: Path, environ: dict[str, str] | None = None) -> str:
    """A digest of everything a plain run of ``cmd`` in ``cwd`` can depend on (see :func:`plain`)."""
    env = os.environ if environ is None else environ
    h = hashlib.sha256(
        json.dumps(
            [
                cmd,
                sorted(
                    (k, v)
                    for k, v in env.items()
                    if not k.startswith(("PYTEST_", "FLORTRAIN_TEST_"))
                ),
            ]
        ).encode()
    )
    for root, dirs, files in os.walk(cwd):
        dirs[:] = sorted(
            d for d in dirs if d != "__pycache__" and not (Path(root) / d / "flortrain.db").exists()
        )
        for name in sorted(files):
            path = Path(root) / name
            h.update(f"\0{path.relative_to(cwd)}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def flortrain(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return run([sys.executable, "-m", "flortrain", *args], cwd, env)


#: where :func:`record` keeps the records of this test session (set by conftest, as PLAIN_RUNS)
RECORDS = "FLORTRAIN_TEST_RECORDS"


def record(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """``flortrain record ARGS`` in ``cwd``, or the directory an earlier record of this session
    with the same inputs left, copied here.

    Tests that replay a script with their own probes first record it, and several record the
    same script with the same knobs (a fixture under test_protocol and the Ray backend, a file's
    shared loop): a record is a torch process, a copy is milliseconds. The inputs are
    :func:`plain`'s (interpreter, arguments, environment with ``env``, every file under ``cwd``),
    and ``cwd`` holds no store yet. The copy's store is moved by replacing the old directory's
    path in its database (its runs' script and cwd, the files the script opened); a record that
    failed, whose output names its directory, that opened files outside it which are still
    there, or whose checkpoints hold its path is not kept. Tests that watch a record's processes, signal it, or record into
    a store that exists call :func:`flortrain` instead."""
    cache = os.environ.get(RECORDS)
    full_env = {**os.environ, **(env or {})}
    if not cache or "FLORTRAIN_STORE" in full_env or any(cwd.rglob("flortrain.db")):
        return flortrain(cwd, "record", *args, env=env)
    here = os.path.realpath(cwd)
    entry = Path(cache) / _inputs(
        [sys.executable, "-m", "flortrain", "record", *args], cwd, full_env
    )
    if (entry / "result.json").exists():
        saved = json.loads((entry / "result.json").read_text())
        shutil.copytree(entry / "dir", cwd, symlinks=True, dirs_exist_ok=True)
        _move_store(cwd / ".flortrain" / "flortrain.db", saved["cwd"], here)
        return Result(saved["code"], saved["out"], saved["err"], saved["seconds"])
    result = flortrain(cwd, "record", *args, env=env)
    if result.code == 0 and _movable(cwd / ".flortrain", here, result):
        tmp = Path(tempfile.mkdtemp(dir=cache, suffix=".tmp"))
        shutil.copytree(cwd, tmp / "dir", symlinks=True)
        (tmp / "result.json").write_text(json.dumps({**vars(result), "cwd": here}))
        try:
            os.rename(tmp, entry)  # atomic: the other worker may have kept the same record
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def _text_columns(db: sqlite3.Connection) -> list[tuple[str, str]]:
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return [
        (t, c[1])
        for t in tables
        if not t.startswith("sqlite_")
        for c in db.execute(f"PRAGMA table_info({t})")
        if c[2].upper() == "TEXT"
    ]


def _movable(store: Path, here: str, result: Result) -> bool:
    """Whether the record in ``store`` names ``here`` only where :func:`_move_store` moves it."""
    if here in result.out + result.err or not (store / "flortrain.db").exists():
        return False
    db = sqlite3.connect(store / "flortrain.db")
    try:
        outside = [
            p
            for table in ("files", "file_states")
            for (p,) in db.execute(
                f"SELECT path FROM {table} WHERE substr(path, 1, ?) != ?",
                (len(here) + 1, here + "/"),
            )
        ]
    finally:
        db.close()
    if any(os.path.lexists(p) for p in outside):  # gone, a temporary file is no test's to share
        return False
    blobs = (p for p in (store / "blobs").rglob("*") if p.is_file())
    return not any(here.encode() in p.read_bytes() for p in blobs)


def _move_store(db_path: Path, old: str, new: str) -> None:
    db = sqlite3.connect(db_path)
    try:
        with db:
            for table, column in _text_columns(db):
                db.execute(
                    f"UPDATE {table} SET {column} = replace({column}, ?, ?) WHERE instr({column}, ?)",
                    (old, new, old),
                )
    finally:
        db.close()


def probe_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("PROBE")]


#: the suite's toy training script, for tests that need a small one rather than a fixture's shape
TOY = FIXTURES / "toy" / "train.py"
_SETUP_ENDS = "# -- the set-up ends here\n"


def toy_script(kind: str | None = None) -> str:
    """The toy training script (``python train.py [EPOCHS]``, three epochs by default), with its
    ``inner`` or ``outer`` probe marker made a probe when ``kind`` says which."""
    text = TOY.read_text()
    return with_probe(text, kind) if kind else text


def toy_prelude() -> str:
    """The toy script's set-up, its comments left out: ``torch`` imported and seeded, ``model``
    (a ``Linear(4, 1)``), ``opt`` (SGD), four ``train`` and two ``val`` batches of eight
    ``(x, y)`` pairs. For a test that writes its own loop after it."""
    text = TOY.read_text()
    head = text[: text.index(_SETUP_ENDS)].splitlines(keepends=True)
    return "".join(ln for ln in head if not ln.startswith("#"))


#: The toy in plain Python, for tests whose subject is Python state or control flow: a linear
#: model fitted by SGD by hand, ``weight`` a list the step changes in place, the data and the
#: batches drawn from the global ``random`` stream.
PY_TOY_PRELUDE = """\
import random
random.seed(0)
data = [[random.gauss(0.0, 1.0) for _ in range(4)] for _ in range(64)]
target = [sum(x) for x in data]
weight = [0.0, 0.0, 0.0, 0.0]
"""

#: One SGD step of :data:`PY_TOY_PRELUDE`'s model over the sample indices ``batch``, inside a
#: batch loop (8 spaces), leaving the batch's mean squared error in ``loss``.
PY_TOY_STEP = """\
        loss = 0.0
        for i in batch:
            err = sum(w * x for w, x in zip(weight, data[i])) - target[i]
            loss += err * err / len(batch)
            for k in range(4):
                weight[k] -= 0.02 * err * data[i][k]
"""


def copy_fixture(name: str, into: Path) -> Path:
    dst = into / f"{name}.py"
    shutil.copy(FIXTURES / f"{name}.py", dst)
    return dst


def block_states(store: Path, run_id: int) -> dict[str, int]:
    """Block instances by state (main-loop boundary checkpoints, state ``boundary``, left out)."""
    db = sqlite3.connect(store / "flortrain.db")
    try:
        rows = db.execute(
            "SELECT state, COUNT(*) FROM blocks WHERE run_id=? AND state != 'boundary' GROUP BY state",
            (run_id,),
        )
        return {s: n for s, n in rows}
    finally:
        db.close()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, each child followed by its own (``flortrain record`` is a
    launcher whose child trains and forks the checkpoint writer)."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for c in (task / "children").read_text().split():
                out += [int(c), *descendants(int(c))]
    except FileNotFoundError:  # a process that just ended
        pass
    return out


def writer_below(pid: int, within: float = 30) -> int:
    """The checkpoint writer (its comm is ``flortrain-ckpt``) among the processes below ``pid``,
    waited for up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for c in descendants(pid):
            try:
                if Path(f"/proc/{c}/comm").read_text().strip() == "flortrain-ckpt":
                    return c
            except FileNotFoundError:
                continue
        time.sleep(0.01)
    raise AssertionError("no writer process found")


def store_count(store: Path, sql: str, *params: object) -> int:
    """The one number a ``SELECT COUNT(*) ...`` over the store's database gives."""
    db = sqlite3.connect(store / "flortrain.db")
    try:
        return int(db.execute(sql, params).fetchone()[0])
    finally:
        db.close()


def latest_run(cwd: Path) -> dict[str, object]:
    r = flortrain(cwd, "runs", "--json")
    assert r.code == 0, r.err
    runs: list[dict[str, object]] = json.loads(r.out)
    return runs[-1]


def replay_matches_plain(
    tmp: Path, text: str, probe: str, env: dict[str, str] | None = None
) -> Result:
    """The whole protocol for one script with a ``#PROBE`` marker line (replaced by ``probe`` at the
    marker's indentation): record == plain, replay's probe lines == plain probed run's, diff 0.
    Returns the replay's result for further assertions."""
    return record_and_replay_match_plain(tmp, text, probe, env)[1]


def record_and_replay_match_plain(
    tmp: Path, text: str, probe: str, env: dict[str, str] | None = None
) -> tuple[Result, Result]:
    """:func:`replay_matches_plain`, returning the record's result too (what record said on
    stderr), so that a test need not record the script a second time to read it."""
    script = tmp / "train.py"
    script.write_text(text)
    truth = plain(script)
    rec = record(tmp, "train.py", env=env)
    assert rec.out == truth.out and rec.code == truth.code, rec.err
    return rec, replay_of_the_record_matches_plain(tmp, text, probe, env)


def replay_of_the_record_matches_plain(
    tmp: Path, text: str, probe: str, env: dict[str, str] | None = None
) -> Result:
    """Steps 2 and 3 of :func:`replay_matches_plain` for a ``train.py`` the test recorded itself
    (watching the record's processes, say): the probed replay of its latest record prints the
    plain probed run's probe lines, and diff exits 0. ``text`` is what was recorded."""
    script = tmp / "train.py"
    marker = next(ln for ln in text.splitlines() if ln.strip() == "#PROBE")
    indent = marker[: len(marker) - len(marker.lstrip())]
    script.write_text(text.replace(marker, indent + probe))
    want = probe_lines(plain(script).out)
    assert want, "the probe printed nothing in a plain run"
    rep = flortrain(tmp, "replay", "train.py", env=env)
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want, rep.err
    d = flortrain(tmp, "diff")
    assert d.code == 0, d.out + d.err
    script.write_text(text)
    return rep
