"""The background materializer (checkpoint/materializer.py, checkpoint/writer.py): staged checkpoints
written by a forked writer, unchanged large tensors written once, failures that lose a checkpoint
and never a run, and a DataLoader's workers unaffected.

The recorded scripts train by hand (the writer sees their tensors either way), and the killed
writer's is pure Python: torch.optim's first call imports torch._dynamo, and torch's import
takes as long again, each about a CPU-second per process."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import xxhash

from flortrain.checkpoint.blob import deserialize, digests
from flortrain.checkpoint.key import CheckpointKey
from flortrain.checkpoint.materializer import BackgroundMaterializer
from flortrain.checkpoint.staging import EXTERNAL_MIN
from flortrain.store.db import Store
from flortrain.store.records import BlockRow, BlockState, RunStatus
from tests.outcomes import Outcomes
from tests.protocol import (
    Result,
    flortrain,
    plain,
    probe_lines,
    record_and_replay_match_plain,
    replay_matches_plain,
    replay_of_the_record_matches_plain,
    run,
    writer_below,
)


def _objects(store: Path) -> list[Path]:
    return sorted(p for p in (store / "blobs" / "objects").rglob("*") if p.is_file())


def _load(store: Store, key: str) -> dict[str, object]:
    data = store.read_blob(store.checkpoints(1)[key])
    assert data is not None
    return deserialize(data, store.read_object)


def test_unchanged_large_tensors_are_written_once_and_changed_ones_again(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    table = torch.randn(EXTERNAL_MIN // 4 * 2)  # twice the threshold: content-addressed
    head = torch.randn(10)  # small: inline
    values = []
    want = {}
    for step in range(4):
        if step == 2:
            table.add_(1.0)  # in place: the version counter moves, so it is staged again
        head.add_(1.0)
        values.append((table.clone(), head.clone()))
        payload = {"objects": {"t": {"kind": "tensor", "value": table.detach(), "h": head}}}
        want[f"k{step}"] = digests(payload)
        m.submit(f"k{step}", "B", payload)
    m.flush()
    assert results.lost == {} and results.warnings == []
    assert sorted(results.committed) == ["k0", "k1", "k2", "k3"]
    objects = _objects(tmp_path / "s")
    assert len(objects) == 2  # the table before and after its change; never once per checkpoint
    for p in objects:
        assert xxhash.xxh3_128_hexdigest(p.read_bytes()) == p.name
    for step, (t, h) in enumerate(values):
        got = _load(store, f"k{step}")["objects"]["t"]  # type: ignore[index]
        assert torch.equal(got["value"], t) and torch.equal(got["h"], h)  # type: ignore[index]
    # the writer's digests are those a replay computes in-process for the same state (diff
    # compares the two), whether the bytes were staged or referred to as unchanged
    assert results.committed == want


def test_objects_go_around_the_page_cache_whether_training_runs_or_the_run_waits_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large tensor's object is written with O_DIRECT both while training runs and once the
    run waits for the writer (a ``stop`` queued behind it): buffered writes at exit were the
    slower ones on this VM (the LSTM shape's final flush: 0.33 to 0.53 s buffered, 0.22 to
    0.28 s direct), and their cost depends on how many dirty pages the machine already holds.
    The writer is forked from this process, so a wrapper set here runs in it and appends each
    call's ``direct`` to a file."""
    from flortrain.store import direct

    log = tmp_path / "direct.log"
    real = direct.write_object

    def logged(root: Path, rel: str, data: memoryview, go_direct: bool) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {int(go_direct)}\n")
        real(root, rel, data, go_direct)

    monkeypatch.setattr(direct, "write_object", logged)
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    writer = m.pid
    m.submit("k0", "B", {"objects": {"t": {"kind": "tensor", "value": torch.randn(EXTERNAL_MIN)}}})
    m.poll()
    deadline = time.monotonic() + 30
    while "k0" not in results.committed:  # written while "training" goes on
        assert time.monotonic() < deadline
        m.poll()
        time.sleep(0.01)
    m.submit("k1", "B", {"objects": {"t": {"kind": "tensor", "value": torch.randn(EXTERNAL_MIN)}}})
    m.flush()  # "stop" is queued right behind k1: the writer writes it as the run waits
    assert sorted(results.committed) == ["k0", "k1"] and results.warnings == []
    writes = [line.split() for line in log.read_text().splitlines()]
    assert [d for pid, d in writes if int(pid) == writer] == ["1", "1"]  # not the calibration's
    for key in ("k0", "k1"):
        assert torch.is_tensor(_load(store, key)["objects"]["t"]["value"])  # type: ignore[index]


def test_a_prepared_checkpoint_is_priced_before_anything_is_staged_and_may_be_dropped(
    tmp_path: Path,
) -> None:
    """``prepare`` lays a checkpoint out and prices it (the bytes staging copies, the seconds it
    holds training and the writer's) without copying a byte: one the caller drops is never
    written, and the tensor it would have staged is staged, in full, by the next checkpoint."""
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    t = torch.randn(EXTERNAL_MIN)
    payload = {"objects": {"t": {"kind": "tensor", "value": t}}}
    dropped = m.prepare("k0", "B", payload)
    est = dropped.estimate
    assert est is not None and est.staged == t.nbytes and est.hashed == 0
    assert est.blocked_s > 0 and est.writer_s > 0 and not m.inflight
    kept = m.prepare("k1", "B", payload)
    assert kept.estimate is not None and kept.estimate.staged == t.nbytes
    assert m.stage(kept) == pytest.approx(kept.estimate.writer_s)
    m.flush()
    assert list(results.committed) == ["k1"] and results.warnings == []
    assert store.checkpoints(run).keys() == {"k1"}
    assert torch.equal(_load(store, "k1")["objects"]["t"]["value"], t)  # type: ignore[index]


def test_the_writer_is_reaped_by_pid_after_its_goodbye_and_the_scripts_children_are_left_alone(
    tmp_path: Path,
) -> None:
    """``flush`` returns once the writer said goodbye (all it wrote committed) and reaps it in the
    background: no zombie is left behind in a process that lives on, and a child the script
    started keeps its exit status for the script (never ``waitpid(-1)``)."""
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    writer = m.pid
    assert writer is not None
    sibling = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(1.5); raise SystemExit(3)"]
    )
    m.submit("k0", "B", {"objects": {"t": {"kind": "tensor", "value": torch.randn(EXTERNAL_MIN)}}})
    m.flush()
    assert list(results.committed) == ["k0"] and results.warnings == []
    assert store.checkpoints(run).keys() == {"k0"}
    deadline = time.monotonic() + 30
    while Path(f"/proc/{writer}").exists():  # a zombie keeps its /proc entry until reaped
        assert time.monotonic() < deadline, Path(f"/proc/{writer}/status").read_text()
        time.sleep(0.02)
    assert sibling.wait(timeout=30) == 3


def test_held_claims_are_written_in_order_at_the_commit_and_before_the_run_completes(
    tmp_path: Path,
) -> None:
    """A record holds its block rows and checkpoint claims for one transaction per commit
    interval: another connection sees none of them before, all of them after, the row's update
    applied after its insert; finishing the run writes what is still held."""
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    store.hold_claims()
    other = sqlite3.connect(tmp_path / "s" / "flortrain.db")
    try:
        store.put_block(
            run,
            BlockRow(
                "L1@M.0.1#0", "L1", "M", 0, 1, 0, BlockState.RECORDED, note="checkpoint pending"
            ),
        )
        store.commit_checkpoint(run, "L1@M.0.1#0", "blobs/x", "ab" * 32, 10)
        store.mark_checkpointed(run, "L1@M.0.1#0", {"objects:m": "f1"})
        assert other.execute("SELECT COUNT(*) FROM blocks").fetchone() == (0,)
        assert other.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (0,)
        store.write_held()
        assert other.execute("SELECT state, note FROM blocks").fetchall() == [
            ("checkpointed", None)
        ]
        assert other.execute("SELECT key FROM checkpoints").fetchall() == [("L1@M.0.1#0",)]
        store.put_block(
            run,
            BlockRow(
                "L1@M.0.2#0", "L1", "M", 0, 2, 0, BlockState.RECORDED, note="checkpoint pending"
            ),
        )
        store.commit_checkpoint(run, "L1@M.0.2#0", "blobs/y", "cd" * 32, 10)
        store.finish_run(run, RunStatus.COMPLETE, 0)
        assert other.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (2,)
        assert other.execute("SELECT status FROM runs").fetchone() == ("complete",)
    finally:
        other.close()
        store.close()


def test_a_run_whose_held_claims_fail_to_write_is_not_marked_complete(tmp_path: Path) -> None:
    """The store fails while writing the held claims at the end (a full disk, here a statement
    that cannot run): the run stays ``running``, so it reads as incomplete, not complete with
    claims missing."""
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    store.guarded = True
    store.hold_claims()
    store.commit_checkpoint(run, "k", "blobs/x", "ab" * 32, 10)
    store._held.append(("INSERT INTO no_such_table VALUES (?)", [(1,)]))  # type: ignore[union-attr]
    store.finish_run(run, RunStatus.COMPLETE, 0)
    assert store.failed is not None and "no_such_table" in store.failed
    store.close()
    db = sqlite3.connect(tmp_path / "s" / "flortrain.db")
    try:
        assert db.execute("SELECT status FROM runs WHERE id=?", (run,)).fetchone() == ("running",)
        assert db.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (
            0,
        )  # rolled back together
    finally:
        db.close()


def test_a_reallocated_tensor_at_the_same_address_is_not_mistaken_for_the_old_one(
    tmp_path: Path,
) -> None:
    """A gradient freed and re-allocated every step often lands at the same address with the same
    version: the tracker keeps the old one alive, so the new one cannot look unchanged."""
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    n = EXTERNAL_MIN // 4
    expect = []
    for step in range(3):
        g = torch.full((n,), float(step))
        expect.append(g.clone())
        m.submit(f"k{step}", "B", {"objects": {"g": {"kind": "tensor", "value": g}}})
        del g
    m.flush()
    for step in range(3):
        assert torch.equal(_load(store, f"k{step}")["objects"]["g"]["value"], expect[step])  # type: ignore[index]


def test_a_checkpoint_larger_than_the_buffer_is_written_on_the_training_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLORTRAIN_BUFFER_MB", "1")
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    big = torch.randn((2 << 20) // 4)  # 2 MB, twice the buffer
    m.submit("k0", "B", {"objects": {"t": {"kind": "tensor", "value": big}}})
    m.flush()
    assert "k0" in results.committed and any("staging buffer" in w for w in results.warnings)
    assert torch.equal(_load(store, "k0")["objects"]["t"]["value"], big)  # type: ignore[index]


FROZEN = """\
import torch
torch.manual_seed(0)
table = torch.nn.Embedding(4096, 128)          # 2 MB, frozen: a fine-tuning shape
table.weight.requires_grad_(False)
head = torch.nn.Linear(128, 2)
x = torch.randint(0, 4096, (64,))
y = torch.randint(0, 2, (64,))
for epoch in range(6):
    for step in range(5):
        loss = torch.nn.functional.cross_entropy(head(table(x)), y)
        head.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in head.parameters():
                p -= 0.1 * p.grad
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
"""


def test_a_frozen_table_is_named_not_written_and_replays_exactly(tmp_path: Path) -> None:
    """A module tensor unchanged since the main loop's entry is named by its sha256 in every
    checkpoint, never staged or written: a jump over iterations restores it from the replay's
    own prologue, verified against that name."""
    env = {"FLORTRAIN_PERIOD": "every"}
    probe = 'if epoch == 4: print(f"PROBE {table.weight.sum().item():.4f} {head.weight.sum().item():.6f}")'
    rep = replay_matches_plain(tmp_path, FROZEN, probe, env)
    assert "4 main-loop iterations jumped over" in rep.err, rep.err
    table_bytes = 4096 * 128 * 4
    assert not [p for p in _objects(tmp_path / ".flortrain") if p.stat().st_size == table_bytes]
    assert (
        sum(p.stat().st_size for p in (tmp_path / ".flortrain" / "blobs").rglob("*") if p.is_file())
        < table_bytes
    )
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    (n,) = db.execute("SELECT COUNT(*) FROM checkpoints WHERE run_id=1").fetchone()
    assert n >= 6  # 6 blocks and 5 boundaries checkpointed, and not one copy of the table


def test_a_tensor_the_replay_made_differently_is_not_restored(tmp_path: Path) -> None:
    """The replay's prologue makes a different table (seeded from the environment here, an
    unseeded initialization in life): the boundaries that name the record's table cannot be
    used, the replay says why and runs the iterations instead of restoring the rest of the state
    around the wrong table."""
    text = FROZEN.replace(
        "torch.manual_seed(0)\n",
        'import os\ntorch.manual_seed(int(os.environ.get("TABLE_SEED", "0")))\n',
        1,
    )
    text = text.replace("head = torch.nn.Linear", "torch.manual_seed(0)\nhead = torch.nn.Linear")
    script = tmp_path / "train.py"
    script.write_text(text)
    env = {"FLORTRAIN_PERIOD": "every"}
    assert flortrain(tmp_path, "record", "train.py", env=env).code == 0
    script.write_text(
        text.replace(
            "    #PROBE", '    if epoch == 4: print(f"PROBE {table.weight.sum().item():.4f}")'
        )
    )
    own = probe_lines(run([sys.executable, "train.py"], tmp_path, {"TABLE_SEED": "1"}).out)
    rep = flortrain(tmp_path, "replay", "train.py", env={**env, "TABLE_SEED": "1"})
    assert rep.code == 0, rep.err
    assert (
        "that no live module tensor matches: the code before the loop made it differently"
        in rep.err
    ), rep.err
    assert "iterations jumped over" not in rep.err, rep.err
    assert probe_lines(rep.out) == own and own != probe_lines(plain(script).out)


DATA_WRITES = """\
import torch
torch.manual_seed(0)
w = torch.zeros(512, 1024)   # 2 MB
lr = torch.tensor(0.5)
for epoch in range(5):
    for step in range(3):
        w.data.add_(lr)              # behind the version counter's back
    #PROBE
    print(f"epoch {epoch} {w.sum().item():.1f}", flush=True)
"""


def test_writes_through_data_turn_off_the_unchanged_tensor_shortcut(tmp_path: Path) -> None:
    env = {"FLORTRAIN_PERIOD": "every"}
    rec, rep = record_and_replay_match_plain(
        tmp_path, DATA_WRITES, 'print(f"PROBE {w[0, 0].item():.1f}")', env
    )
    assert rep.code == 0
    assert "train.py:7:9: writes a tensor through `.data`" in rec.err, rec.err


#: A model whose checkpoints hold large tensors (its 2 MB layer's weights and gradients)
LARGE = """\
import time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 10))
x = torch.randn(32, 512)
for epoch in range(8):
    for step in range(3):
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
    time.sleep(0.25)
"""


#: The killed writer's script, in pure Python: the writer process is the subject, and it stages
#: and writes these values as it does tensors
KILLABLE = """\
import os, random, sys, time
random.seed(0)
weights = [random.gauss(0, 1) for _ in range(20000)]
for epoch in range(8):
    for step in range(3):
        weights = [w * 0.99 + 0.01 * random.random() for w in weights]
    #PROBE
    print(f"epoch {epoch} {sum(weights):.6f}", flush=True)
    if epoch == 0 and os.environ.get("KILL_WAIT"):
        sys.stdin.readline()   # the test kills the writer here and waits for it to be gone
    time.sleep(0.25)   # training goes on after the kill: a new writer must take over
"""


def _wait_until_dead(pid: int, deadline: float) -> None:
    """Until ``pid`` has ended (a zombie, or reaped)."""
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not end")


def test_a_killed_writer_loses_its_checkpoints_with_a_warning_and_the_run_completes(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(KILLABLE)
    truth = plain(script)
    env = {
        **os.environ,
        "FLORTRAIN_PERIOD": "every",
        "FLORTRAIN_INJECT": "writer-delay=0.5",
        "KILL_WAIT": "1",
    }
    p = subprocess.Popen(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    first = p.stdout.readline()  # epoch 0 done: its checkpoints are staged, the writer is sleeping
    writer = writer_below(p.pid)  # fails the test if none is found
    os.kill(writer, signal.SIGKILL)
    # a killed process ends only once it is scheduled, and the writer runs at SCHED_IDLE: on busy
    # cores that can take seconds. The script waits until it has (a writer dying after training
    # ended is the launcher's to report: test_launcher.py)
    _wait_until_dead(writer, time.monotonic() + 120)
    out, err = p.communicate("\n", timeout=300)
    assert p.returncode == 0, err
    assert first + out == truth.out  # the script's output is untouched
    assert "checkpoint writer died (killed by signal 9)" in err and "checkpoint(s) lost" in err, err
    store = Store(tmp_path / ".flortrain")
    ck = store.checkpoints(1)
    lost = {
        k
        for (k, note) in store.db.execute(
            "SELECT key, note FROM blocks WHERE run_id=1 AND note LIKE 'checkpoint lost%'"
        )
    }
    assert lost, "the killed writer held staged checkpoints"
    assert not lost & set(ck), "a lost checkpoint has a commit row"
    assert len(ck) > 0, "a new writer took over after the kill"
    for c in ck.values():  # every claimed checkpoint is on disk and verifies
        data = store.read_blob(c)
        assert data is not None
        deserialize(data, store.read_object)
    # and the record replays exactly, re-executing what was lost
    script.write_text(KILLABLE.replace("    #PROBE", '    print(f"PROBE {weights[0]:.6f}")'))
    want = [ln for ln in plain(script).out.splitlines() if ln.startswith("PROBE")]
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0, rep.err
    assert [ln for ln in rep.out.splitlines() if ln.startswith("PROBE")] == want
    assert flortrain(tmp_path, "diff").code == 0


def test_a_writer_whose_every_write_fails_leaves_a_complete_run_with_no_checkpoint_claimed(
    tmp_path: Path,
) -> None:
    """``FLORTRAIN_INJECT=writer-fail=1`` (a full disk for every item; ``record_variants.py``
    uses it to time the training side of a record alone): each staged checkpoint is reported
    lost, none has a commit row, the output is untouched, and the replay re-executes all."""
    script = tmp_path / "train.py"
    script.write_text(LARGE.replace("    time.sleep(0.25)\n", ""))
    truth = plain(script)
    rec = flortrain(
        tmp_path,
        "record",
        "train.py",
        env={"FLORTRAIN_PERIOD": "every", "FLORTRAIN_INJECT": "writer-fail=1"},
    )
    assert rec.code == 0, rec.err
    assert rec.out == truth.out
    assert "0 of 8 block instances checkpointed" in rec.err, rec.err
    lost = re.findall(
        r"checkpoint \S+ not written: No space left on device \(injected: writer-fail\)", rec.err
    )
    assert len(lost) >= 8, rec.err  # the loop's 8 instances, and the boundaries staged
    store = Store(tmp_path / ".flortrain")
    assert store.checkpoints(1) == {}
    assert _objects(tmp_path / ".flortrain") == []
    script.write_text(
        script.read_text().replace(
            "    #PROBE", '    print(f"PROBE {model[0].weight.sum().item():.6f}")'
        )
    )
    want = [ln for ln in plain(script).out.splitlines() if ln.startswith("PROBE")]
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 0, rep.err
    assert [ln for ln in rep.out.splitlines() if ln.startswith("PROBE")] == want
    assert flortrain(tmp_path, "diff").code == 0


def test_a_failed_write_loses_that_checkpoint_only(tmp_path: Path) -> None:
    """The objects directory cannot be created (a file is in its way, as a full or broken disk
    would refuse it): every checkpoint holding a large tensor (here, all of them) is lost, each
    with a warning naming it and a note on its row; the run completes, and no checkpoint is
    claimed whose bytes cannot be read back.

    Who warns depends on timing: the training process when the writer reports during training ("...;
    training goes on"), or the launcher when the writer's backlog was handed over at exit (a loaded
    machine can leave the idle-priority writer no CPU until training ends). Either way the line is
    ``checkpoint KEY not written: REASON``."""
    objects = tmp_path / ".flortrain" / "blobs" / "objects"
    objects.parent.mkdir(parents=True)
    objects.write_text("in the way")
    env = {"FLORTRAIN_PERIOD": "every"}
    script = tmp_path / "train.py"
    script.write_text(LARGE)
    truth = plain(script)
    rec = flortrain(tmp_path, "record", "train.py", env=env)
    assert rec.code == 0 and rec.out == truth.out, rec.err
    store = Store(tmp_path / ".flortrain")
    rows = store.db.execute("SELECT key, state, note FROM blocks WHERE run_id=1").fetchall()
    assert len([r for r in rows if r[1] != "boundary"]) == 8, rows  # one row per epoch's block
    for key, state, note in rows:
        assert state != "checkpointed" and (note or "").startswith("checkpoint lost: "), (
            key,
            state,
            note,
        )
        assert f"checkpoint {key} not written: " in rec.err, rec.err
    assert store.checkpoints(1) == {}


WORKER_CRASH = """\
import os, signal, torch
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)

class Data(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 40 and EPOCH[0] == 1:
            os.kill(os.getpid(), signal.SIGKILL)   # a worker dies
        return float(i)

def floats(batch):
    # plain floats through the worker queue: a tensor would travel as a shared-memory file
    # descriptor, and a worker killed mid-handover fails in a different way on every run
    return batch

EPOCH = [0]
model = torch.nn.Linear(1, 1)
for epoch in range(3):
    EPOCH[0] = epoch
    for xs in DataLoader(Data(), batch_size=8, num_workers=2, collate_fn=floats):
        loss = model(torch.tensor(xs).unsqueeze(1)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
    print(f"epoch {epoch} {loss.item():.6f}", flush=True)
"""


#: what DataLoader's SIGCHLD handler raises for a worker killed by a signal, and what its
#: fallback raises when a wait for data times out (5 s) and it finds the worker dead
HANDLER, FALLBACK = "killed by signal", "exited unexpectedly"


def _worker_crash(attempt: Callable[[], Result], tries: int = 3) -> Result:
    """Run until the dead worker is reported by DataLoader's SIGCHLD handler, at most ``tries``
    times. torch's detection races on its own: under the load of a parallel test run, a plain
    ``python`` run of WORKER_CRASH (or a record) occasionally reports the death through the fallback
    instead. A flortrain that replaced the handler after DataLoader set it would report the death
    through the fallback every time, and so still fail here. Each try must be a fresh run: the plain
    runs bypass the test session's cache of ground truths, which would hand every retry the first
    run's path."""
    for _ in range(tries):
        result = attempt()
        assert result.code == 1 and "DataLoader worker (pid" in result.err, result.err
        if HANDLER in result.err:
            return result
        assert FALLBACK in result.err, result.err
    raise AssertionError(
        f"the dead worker was reported {tries} times by the fallback, never by the handler:\n{result.err}"
    )


def test_a_dataloader_worker_crash_is_still_reported_under_record(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKER_CRASH)
    truth = _worker_crash(lambda: plain(script, cached=False))  # a race: each try a fresh run

    def record() -> Result:
        for store in tmp_path.glob(".flortrain*"):
            shutil.rmtree(store)
        return flortrain(tmp_path, "record", "train.py")

    rec = _worker_crash(record)
    assert rec.out == truth.out


def test_epsilon_is_settable_and_c_is_refined_from_the_last_replay(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FROZEN.replace("    #PROBE\n", ""))
    bad = flortrain(tmp_path, "record", "--epsilon", "0", "train.py")
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1, bad.err
    first = flortrain(tmp_path, "record", "--epsilon", "0.5", "train.py")
    assert first.code == 0 and "restore/materialize ratio" not in first.err, first.err
    script.write_text(
        FROZEN.replace("    #PROBE\n", '    print(f"PROBE {head.weight.sum().item():.6f}")\n')
    )
    assert flortrain(tmp_path, "replay", "train.py").code == 0
    store = Store(tmp_path / ".flortrain")
    measured = store.restore_ratio(str(script))
    assert measured is not None and measured[0] > 0 and measured[1] == 2
    script.write_text(FROZEN.replace("    #PROBE\n", ""))
    again = flortrain(tmp_path, "record", "train.py")
    assert (
        f"restore/materialize ratio c = {measured[0]:.2f} (measured by replay run 2)" in again.err
    ), again.err
    # the replay plan prices its restores with the same c, and says so before its estimate
    script.write_text(
        FROZEN.replace("    #PROBE\n", '    print(f"PROBE {head.weight.sum().item():.6f}")\n')
    )
    replay = flortrain(tmp_path, "replay", "train.py")
    assert replay.code == 0, replay.err
    plan = [
        line
        for line in replay.err.splitlines()
        if line.startswith("flortrain: ") and "replay plan" not in line
    ]
    estimate = next(i for i, line in enumerate(plan) if "estimated block time" in line)
    assert (
        plan[estimate - 1]
        == f"flortrain: restore/materialize ratio c = {measured[0]:.2f} (measured by replay run 2)"
    ), plan


def test_objects_of_an_item_are_hashed_and_written_once_each(tmp_path: Path) -> None:
    """The writer's threads: every view gets its name (XXH3-128) and its file; a view whose bytes repeat
    within the item or exist already is not written again; no temporary file is left."""
    from flortrain.checkpoint.writer import Objects
    from flortrain.store.checkpoints import object_path

    blobs = tmp_path / "blobs"
    a, b = os.urandom(3 << 20), os.urandom(1 << 20)
    objects = Objects(blobs, threads=2)
    try:
        first = objects.store(
            [(memoryview(a), False), (memoryview(b), False), (memoryview(a), False)]
        )
        again = objects.store([(memoryview(b), False)])
    finally:
        objects.close()
    sa, sb = xxhash.xxh3_128_hexdigest(a), xxhash.xxh3_128_hexdigest(b)
    assert [s for s, _ in first] == [sa, sb, sa]
    assert sorted(n for _, n in first) == [0, len(b), len(a)]  # the repeat of a: written once
    assert again == [(sb, 0)]
    assert object_path(blobs, sa).read_bytes() == a and object_path(blobs, sb).read_bytes() == b
    assert sorted(p.name for p in blobs.rglob("*") if p.is_file()) == sorted([sa, sb])


def test_writer_speed_is_timed_on_scratch_objects_it_removes(tmp_path: Path) -> None:
    from flortrain.checkpoint.speed import writer_speed

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    speed = writer_speed(blobs)
    assert 1e-11 < speed.per_byte < 1e-6 and 0 < speed.per_item < 1.0
    assert speed.seconds(1 << 20) == pytest.approx(speed.per_item + speed.per_byte * (1 << 20))
    assert list(blobs.iterdir()) == []


def test_writer_speed_keeps_the_fastest_of_its_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slow try (here the first hash, held up 50 ms: 25 ns a byte of its 2 MB) is the
    machine's moment, not what a byte costs: the fastest try is kept, so that one outlier does
    not price checkpoints too high and halve them."""
    from flortrain.checkpoint.speed import SPEED_TRIES, writer_speed
    from flortrain.store import content

    real = content.name
    calls: list[int] = []

    def first_slow(data: memoryview) -> str:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.05)
        return real(data)

    monkeypatch.setattr(content, "name", first_slow)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    speed = writer_speed(blobs)
    assert len(calls) >= SPEED_TRIES >= 3
    assert speed.hash_per_byte < 1e-8, speed


def test_a_boundary_is_priced_before_it_is_staged(tmp_path: Path) -> None:
    """A boundary whose estimated cost does not fit the run's budget is not staged at all (the
    first boundary of a fine-tuning run holds a frozen table no block writes); once training
    has earned the budget, the same boundary is taken."""
    from flortrain.checkpoint.period import AdaptivePeriod
    from flortrain.runtime.recording import RecordSession

    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    s = RecordSession(store, run)
    s.adaptive = AdaptivePeriod(epsilon=1 / 15, every=False)
    # 32 MB: tens of milliseconds to stage and write, so that only a stall of the test process
    # of about half a second between two statements could earn the budget for it
    state = {"table": torch.randn(1 << 23)}
    getters = {"table": lambda: state["table"]}
    try:
        s.main_enter("M1")
        assert s.main_iteration("M1", getters, getters) is None  # iteration 0: never a boundary
        # iteration 1: Eq. 4 takes a block's first instance unseen, but the budget so far is ε of
        # microseconds of training; the capture that priced it is spent all the same
        s._iteration_begins("M1")  # the iteration's training starts now, not at the assert above
        assert s.main_iteration("M1", getters, getters) is None
        costs = s.adaptive.costs["M1"]
        assert costs.k == 0 and costs.priced > 0 and s.adaptive.spent > 0
        assert costs.declined == pytest.approx(s.adaptive.spent + costs.priced)
        # not captured again while the budget could not take it
        spent, declined = s.adaptive.spent, costs.declined
        assert s.main_iteration("M1", getters, getters) is None
        assert s.adaptive.spent == spent and costs.declined == declined
        # as if 100 s of training had gone by in this loop's iterations (no block inside: Eq. 4
        # weighs the boundary against all of it, the uncovered compute since the latest boundary)
        s.adaptive.training += 100.0
        s.adaptive.costs["M1"].compute += 100.0
        s.adaptive.costs["M1"].uncovered += 100.0
        assert s.main_iteration("M1", getters, getters) is not None
        s.main_exit("M1")
    finally:
        s.flush()
    assert [CheckpointKey.parse(k) for k in store.checkpoints(run)] == [
        CheckpointKey.boundary("M1", 0, 3)
    ]
    assert (
        s.adaptive.costs["M1"].k == 1
        and s.adaptive.costs["M1"].materialize > 0
        and s.adaptive.spent > spent
    )


def test_flortrains_hooks_defer_garbage_collection_and_are_timed(tmp_path: Path) -> None:
    """A full collection due while a hook runs would be charged to the checkpoint it falls in;
    it is deferred to the script's next allocation, and the hook's own time is counted."""
    import gc

    from flortrain.runtime.recording import RecordSession

    store = Store(tmp_path / "s")
    s = RecordSession(store, store.begin_run("record", "x.py", [], "", None, None, {}))
    assert gc.isenabled()
    with s.holding():
        assert not gc.isenabled()
        with s.holding():  # nested: the outer one re-enables
            pass
        assert not gc.isenabled()
        time.sleep(0.01)
    assert gc.isenabled() and s.held >= 0.01
    gc.disable()
    try:
        with s.holding():
            pass
        assert not gc.isenabled()  # a script that turned collection off keeps it off
    finally:
        gc.enable()


def test_an_iterations_training_time_is_net_of_what_flortrain_held_in_it(tmp_path: Path) -> None:
    """Time a hook held the training thread is reported (``held``) and is not the script's
    compute: counted as compute, it would inflate Eq. 4's C for the boundary and the training
    time the budget is a fraction of."""
    from flortrain.runtime.recording import RecordSession

    store = Store(tmp_path / "s")
    s = RecordSession(store, store.begin_run("record", "x.py", [], "", None, None, {}))
    try:
        with s.holding():
            s.main_iteration("M1")
        with s.holding():
            time.sleep(0.5)  # a hook inside the iteration: a block's end, say
        time.sleep(0.01)  # the script's own compute
        assert s.iteration_elapsed() < 0.3
        with s.holding():
            s.main_iteration("M1")
            time.sleep(0.5)  # the boundary hook's own time, after the iteration was timed
        with s.holding():
            s.main_iteration("M1")
    finally:
        s.flush()
    costs = s.adaptive.costs["M1"]
    assert costs.n == 2 and costs.compute < 0.3 and s.adaptive.training < 0.3, costs
    assert (
        s.held >= 1.0 and s.adaptive.spent == 0.0
    )  # held, reported; no checkpoint: nothing charged


_HELD = re.compile(
    r"held training up ([0-9.]+)s( \(([0-9.]+)%\))?(, ([0-9.]+)s of it at exit for the checkpoint writer)?"
    r"(; then ([0-9.]+)s for the checkpoint writer after training exited)?$"
)


#: FROZEN without its probe
UNPROBED = FROZEN.replace("    #PROBE\n", "")
#: UNPROBED with each epoch ending in a 0.2 s pause: a run of more than a second
PAUSED = (
    UNPROBED.replace("import torch\n", "import time\nimport torch\n", 1) + "    time.sleep(0.2)\n"
)


def _held_line(
    tmp_path: Path, env: dict[str, str] | None = None, text: str = UNPROBED
) -> tuple[float, re.Match[str]]:
    """(held, the match) of the last line of a record of ``text``, checked as every such line is."""
    script = tmp_path / "train.py"
    script.write_text(text)
    rec = flortrain(tmp_path, "record", "train.py", env=env)
    assert rec.code == 0, rec.err
    last = rec.err.strip().splitlines()[-1]
    assert "complete" in last and "flortrain held training up " in last, last
    m = _HELD.search(last)
    assert m is not None, last
    held, elapsed = float(m.group(1)), float(last.split(" in ")[1].split("s:")[0])
    assert 0 < held < elapsed, last
    # a share is given for a run of a second or more, and none for one shorter (it says nothing);
    # the line rounds both figures to 0.01 s, so within that of the second only the unrounded
    # figures (not printed) decide: 3.23 - 2.23 printed once for a run just under it
    if abs(elapsed - held - 1.0) > 0.011:
        assert (m.group(3) is not None) == (elapsed - held >= 1.0), last
    return held, m


def test_record_reports_how_long_it_held_training_up(tmp_path: Path) -> None:
    held, m = _held_line(tmp_path, text=PAUSED)
    assert m.group(3) is not None, m.group(0)  # the share of a run of more than a second
    if m.group(5) is not None:  # the writer may be a little behind at exit, never more than held
        assert 0.01 <= float(m.group(5)) <= held, m.group(0)


def test_record_says_how_much_it_held_at_exit_for_a_writer_behind(tmp_path: Path) -> None:
    """A writer that fell behind (each item delayed 0.2 s, as on a slow disk: 11 checkpoints
    taken in well under a second) is waited for at exit by a record without a launcher, and the
    summary says that most of what flortrain held training up was that wait, not staging. With
    the launcher (the default) the training process hands the backlog over instead: it is not
    held up at exit, and every checkpoint is still committed."""
    inject = {"FLORTRAIN_PERIOD": "every", "FLORTRAIN_INJECT": "writer-delay=0.2"}
    held, m = _held_line(tmp_path, {**inject, "FLORTRAIN_LAUNCHER": "off"})
    assert m.group(5) is not None, m.group(0)
    wait = float(m.group(5))
    assert 1.0 <= wait <= held and held - wait < 0.5, m.group(0)
    handed, m = _held_line(tmp_path, inject)
    assert float(m.group(5) or 0) < 0.1 and handed < held - 1.0, m.group(
        0
    )  # the handoff: unmapping
    assert m.group(7) is not None, m.group(
        0
    )  # the launcher says how long it waited once training had exited
    counted = re.search(r"([0-9]+) of ([0-9]+) block instances checkpointed", m.string)
    assert counted is not None and counted.group(1) == counted.group(2) != "0", m.string


def test_the_writer_competes_for_the_cpu_once_its_backlog_reaches_the_threshold() -> None:
    """``Pace``: idle CPU only while the backlog is small; at the threshold, busy until nothing
    is left (hysteresis: the staging buffer then drains and its pages are reused); busy when
    training is over, whatever it holds."""
    from flortrain.checkpoint.pace import Pace

    pace = Pace(threshold=100)
    assert not pace.update(60, stopping=False)
    assert pace.update(100, stopping=False)
    assert pace.update(40, stopping=False), "a busy writer stays busy until its backlog is written"
    assert not pace.update(0, stopping=False)
    assert not pace.update(40, stopping=False)
    assert pace.update(1, stopping=True)


def test_the_idle_lane_runs_under_sched_idle_and_the_busy_and_drain_lanes_do_not(
    tmp_path: Path,
) -> None:
    from flortrain.checkpoint.writer import BUSY, DRAIN, Objects

    objects = Objects(tmp_path / "blobs", threads=2)
    try:
        idle_objects = objects.pool().submit(os.sched_getscheduler, 0).result()
        objects.lane = BUSY
        busy_objects = objects.pool().submit(os.sched_getscheduler, 0).result()
        objects.lane = DRAIN
        drain = objects.pool()
        drain_objects = drain.submit(os.sched_getscheduler, 0).result()
    finally:
        objects.close()
    assert idle_objects == os.SCHED_IDLE
    assert busy_objects == drain_objects == os.sched_getscheduler(0) != os.SCHED_IDLE
    assert drain._max_workers == 4, (
        "training has ended: twice the threads overlap the disk's time per object"
    )


# A checkpoint of about 2 MB (a 512x512 layer's weights and gradients): under the writer's
# SMALL_ITEM, so it starts however busy the cores are (a larger one waits for an idle core, and
# on cores kept busy by other work the lane would never be seen).
PACED = """\
import os, sys, torch
torch.manual_seed(0)
model = torch.nn.Linear(512, 512)
x = torch.randn(32, 512)
if os.environ.get("PACE_WAIT"):
    sys.stdin.readline()   # the test counts the writer's wake-ups before any checkpoint here
for epoch in range(4):
    for step in range(3):
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
    if epoch == 1 and os.environ.get("PACE_WAIT"):
        sys.stdin.readline()   # the test looks at the writer's threads here
"""


def _writer_threads(pid: int, deadline: float) -> tuple[int, dict[str, tuple[int, int]]]:
    """The recording process's writer (it has the comm ``flortrain-ckpt``): its own thread's
    scheduling policy, and (policy, voluntary context switches) of each of its other threads, by
    thread id, once two looks a moment apart agree (its threads have started and wait)."""

    def policy(task: Path) -> int:  # field 41 of stat, counted after the ")" ending the comm
        return int((task / "stat").read_text().rsplit(")", 1)[1].split()[38])

    def woken(task: Path) -> int:
        line = next(
            x for x in (task / "status").read_text().splitlines() if x.startswith("voluntary_ctxt")
        )
        return int(line.split()[1])

    c = writer_below(pid, deadline - time.monotonic())
    seen: dict[str, tuple[int, int]] = {}
    while time.monotonic() < deadline:
        tasks = [t for t in Path(f"/proc/{c}/task").iterdir() if t.name != str(c)]
        now = {t.name: (policy(t), woken(t)) for t in tasks}
        if now and now == seen:
            return policy(Path(f"/proc/{c}/task/{c}")), now
        seen = now
        time.sleep(0.3)
    raise AssertionError(f"the writer's threads never settled: {seen}")


@pytest.mark.parametrize("backlog_mb, busy", [("0", True), ("1024", False)])
def test_a_recorded_run_writes_on_the_lane_its_backlog_calls_for(
    tmp_path: Path, backlog_mb: str, busy: bool
) -> None:
    """Real record: the writer's own thread, which wakes for every message, runs at SCHED_IDLE
    however large the backlog; with a threshold of 0 every checkpoint is written by its busy
    thread (normal policy, niced), which a large threshold never wakes. Either way the replay is
    exact."""
    script = tmp_path / "train.py"
    script.write_text(PACED)
    env = {"FLORTRAIN_PERIOD": "every", "FLORTRAIN_WRITER_BACKLOG_MB": backlog_mb}
    p = subprocess.Popen(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp_path,
        env={**os.environ, **env, "PACE_WAIT": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        _, before = _writer_threads(p.pid, time.monotonic() + 60)  # the script waits at its start
        p.stdin.write("\n")
        p.stdin.flush()
        printed = p.stdout.readline()
        printed += p.stdout.readline()  # epoch 1 printed: its checkpoints staged, the script waits
        time.sleep(0.5)
        own, after = _writer_threads(p.pid, time.monotonic() + 30)
    finally:
        out, err = p.communicate("\n", timeout=300)
    assert p.returncode == 0, err
    assert printed + out == plain(script).out  # PACE_WAIT only pauses it
    assert own == os.SCHED_IDLE
    # an item written is at least one wake-up of the thread that writes it. Counted from the
    # script's start, where the writer's threads have started and wait for work (how often they
    # woke starting depends on the machine's load), to epoch 1, by which, with a checkpoint at
    # every boundary and block instance, eight items have been sent
    woken = {
        tid: n - before.get(tid, (policy, 0))[1]
        for tid, (policy, n) in after.items()
        if policy == os.SCHED_OTHER
    }
    assert woken, after  # the busy thread, whatever the pace
    if busy:
        assert max(woken.values()) >= 4, (before, after)
    else:
        assert set(woken.values()) == {0}, (before, after)
    # the record whose writer was watched replays exactly (it paused where the replay does not)
    replay_of_the_record_matches_plain(
        tmp_path, PACED, 'print(f"PROBE {model.weight.sum().item():.6f}")', env
    )


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_a_region_that_fills_the_ring_up_to_its_head_leaves_no_room() -> None:
    """Placed at the start and ending exactly at the oldest region, a region leaves the ring's
    tail equal to its head: full. Read as empty, the next region went on top of the oldest,
    whose bytes the writer had not read yet (a replay then restored a later epoch's state)."""
    from collections import deque

    from flortrain.checkpoint.staging import Flight, ring_fit

    flights = deque([Flight("a", 100, 1000, 0)])
    assert ring_fit(flights, 1000, 100) == 0
    flights.append(Flight("b", 0, 100, 0))
    assert ring_fit(flights, 1000, 64) is None


def test_regions_the_ring_hands_out_never_overlap_one_in_flight() -> None:
    """Random sizes, and the writer finishing the oldest regions at random moments: every
    region placed lies inside the ring and clear of every region still in flight."""
    import random
    from collections import deque

    from flortrain.checkpoint.staging import Flight, ring_fit

    rng = random.Random(0)
    size = 4096
    for _ in range(200):
        flights: deque[Flight] = deque()
        placed = 0
        for step in range(200):
            if flights and rng.random() < 0.4:
                flights.popleft()  # the writer finished the oldest
            n = rng.choice(
                [64, 128, rng.randrange(64, size, 64), size - flights[0].start if flights else size]
            )
            start = ring_fit(flights, size, n)
            if start is None:
                continue
            assert start >= 0 and start + n <= size
            assert not any(_overlaps((start, start + n), (f.start, f.end)) for f in flights), (
                step,
                start,
                n,
                flights,
            )
            flights.append(Flight(f"k{step}", start, start + n, 0))
            placed += 1
        assert placed > 50


SMALL_RING = """\
import torch
torch.manual_seed(0)
w = torch.zeros(50 * 1024)          # 200 KB: five fit a 1 MB staging buffer
for epoch in range(10):
    for step in range(3):
        w.add_(1.0 + epoch)
    #PROBE
    print(f"epoch {epoch} {w[0].item():.1f}", flush=True)
"""


def test_a_small_staging_buffer_and_a_slow_writer_keep_every_checkpoint_its_own(
    tmp_path: Path,
) -> None:
    """The ring wraps and fills while the writer lags 0.3 s per checkpoint: each checkpoint
    still holds its own epoch's state (epoch 1 must not restore epoch 6's)."""
    env = {
        "FLORTRAIN_PERIOD": "every",
        "FLORTRAIN_BUFFER_MB": "1",
        "FLORTRAIN_INJECT": "writer-delay=0.3",
    }
    rep = replay_matches_plain(
        tmp_path, SMALL_RING, 'print(f"PROBE {epoch} {w.sum().item():.1f}")', env
    )
    assert "10 block instances skipped, 0 executed" in rep.err, rep.err


def test_an_object_left_truncated_by_a_crash_is_written_again(tmp_path: Path) -> None:
    """A crash after an object's rename and before its bytes reached the disk leaves its name
    with no bytes (objects are not fsynced). The next record writes it again instead of taking
    the name for the object, and its checkpoints restore."""
    env = {"FLORTRAIN_PERIOD": "every"}
    script = tmp_path / "train.py"
    script.write_text(SMALL_RING.replace("    #PROBE\n", ""))
    assert flortrain(tmp_path, "record", "train.py", env=env).code == 0
    damaged = _objects(tmp_path / ".flortrain")
    assert damaged
    for p in damaged:
        p.write_bytes(b"")
    rep = replay_matches_plain(
        tmp_path, SMALL_RING, 'print(f"PROBE {epoch} {w.sum().item():.1f}")', env
    )
    assert "10 block instances skipped, 0 executed" in rep.err and "corrupt" not in rep.err, rep.err
    for p in damaged:
        assert xxhash.xxh3_128_hexdigest(p.read_bytes()) == p.name


def test_an_item_whose_object_fails_ends_only_after_its_other_objects_are_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One object fails at once (a full disk), another is still being written: the failure is
    raised only when that write has ended. Raised at once, the item was reported lost, its
    region reused, and the write still running stored the next checkpoint's bytes under the
    first one's name."""
    import errno

    from flortrain.checkpoint.writer import BUSY, Objects
    from flortrain.store import direct

    real = direct.write_object
    finished: list[int] = []

    def write(root: Path, rel: str, data: memoryview, aligned: bool) -> None:
        if len(data) == 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device", rel)
        time.sleep(0.5)
        real(root, rel, data, aligned)
        finished.append(len(data))

    monkeypatch.setattr(direct, "write_object", write)
    objects = Objects(tmp_path / "blobs", threads=2)
    objects.lane = BUSY  # a lane without SCHED_IDLE: this test's process is not a writer
    try:
        with pytest.raises(OSError, match="No space left"):
            objects.store(
                [(memoryview(os.urandom(1 << 20)), False), (memoryview(os.urandom(2 << 20)), False)]
            )
        assert finished == [2 << 20]
    finally:
        objects.close()
