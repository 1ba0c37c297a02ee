"""Parallel replay (``--jobs N``): segments, resume kinds, merged output, failures.

Ground truth is a plain ``python`` run of the probed script, as everywhere: the workers'
merged stdout must be exactly what it prints (probe lines and all), and ``diff`` must pass. The
protocol on every fixture with two workers is in test_protocol.py and test_realcode.py; this
file covers what those cannot show: which resume a worker used and why, the carried state a
direct resume needs, a failing worker, the code after the loop, and the planner.

Scripts are pure Python where torch is not the subject (dividing, resuming, merging): a worker
that imports torch and calls a torch.optim optimizer costs about two CPU-seconds, one that
does not a fraction of one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from flortrain.replay import costs, sharing
from flortrain.replay.costs import LoopCosts
from flortrain.replay.preload import needs_torch
from flortrain.replay.segments import divide, even
from flortrain.store.blobs import BlobReader, object_rel
from flortrain.store.db import open_store
from flortrain.store.records import BlockRow, BlockState
from tests.protocol import Result, copy_fixture, flortrain, plain, record

EVERY = {"FLORTRAIN_PERIOD": "every", "FLORTRAIN_SEGMENTS": "even"}

#: A ``while`` main loop whose iterations carry plain state (the learning rate divided in place,
#: the best loss, a step counter, an early-stopping counter, an index list shuffled in place):
#: a worker resuming at a later epoch must get all of it back, or its probe lines differ.
#: Its optimizer is carried too (its momentum, its groups' learning rate); the direct-resume test
#: replays it.
CARRIED = textwrap.dedent(
    """\
    import random

    import torch

    random.seed(0)
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(64)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    lr = 0.05
    best_val_loss = float("inf")
    global_step = 0
    bad = 0
    order = list(range(64))
    epoch = 0
    while epoch < 6 and bad < 10:
        random.shuffle(order)
        for i in range(0, 64, 16):
            idx = order[i : i + 16]
            loss = ((model(x[idx]).squeeze(1) - y[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            global_step += 1
            #PROBE inner
        val = ((model(x).squeeze(1) - y) ** 2).mean().item()
        if val < best_val_loss:
            best_val_loss, bad = val, 0
        else:
            bad += 1
        if epoch % 2 == 1:
            lr /= 4.0
            for g in opt.param_groups:
                g["lr"] = lr
        print(f"epoch {epoch} val {val:.10f} lr {lr}")
        epoch += 1
    print(f"best {best_val_loss:.10f} steps {global_step}")
    with open("after.log", "a") as f:
        f.write("after the loop\\n")
    """
)

INNER = 'print(f"PROBE {epoch} {global_step} {lr} {bad} {order[:3]} {loss.item():.10f} {best_val_loss:.10f}")'

#: :data:`CARRIED` in pure Python: a linear model as a list of weights, fitted by SGD with
#: momentum by hand, the same plain state carried from epoch to epoch. Two probe markers, in the
#: batch loop and after it, so that every test of it replays one record.
CARRIED_PY = textwrap.dedent(
    """\
    import random


    def dot(u, v):
        return sum(a * b for a, b in zip(u, v))


    random.seed(0)
    x = [[random.gauss(0, 1) for _ in range(4)] for _ in range(64)]
    y = [a - 2.0 * b + 0.5 * c + 3.0 * d + 0.1 * random.gauss(0, 1) for a, b, c, d in x]
    w = [0.0] * 4
    velocity = [0.0] * 4
    lr = 0.05
    best_val_loss = float("inf")
    global_step = 0
    bad = 0
    order = list(range(64))
    epoch = 0
    while epoch < 6 and bad < 10:
        random.shuffle(order)
        for i in range(0, 64, 16):
            idx = order[i : i + 16]
            errors = [dot(w, x[j]) - y[j] for j in idx]
            loss = dot(errors, errors) / 16
            grad = [2 * dot(errors, [x[j][k] for j in idx]) / 16 for k in range(4)]
            velocity = [0.9 * v + g for v, g in zip(velocity, grad)]
            w = [wk - lr * v for wk, v in zip(w, velocity)]
            global_step += 1
            #PROBE inner
        val = sum([(dot(w, xj) - yj) ** 2 for xj, yj in zip(x, y)]) / 64
        if val < best_val_loss:
            best_val_loss, bad = val, 0
        else:
            bad += 1
        if epoch % 2 == 1:
            lr /= 4.0
        #PROBE outer
        print(f"epoch {epoch} val {val:.10f} lr {lr}")
        epoch += 1
    print(f"best {best_val_loss:.10f} steps {global_step}")
    """
)

INNER_PY = (
    'print(f"PROBE {epoch} {global_step} {lr} {bad} {order[:3]} {loss:.10f} {best_val_loss:.10f}")'
)


def _setup(
    tmp_path: Path, text: str, probe: str, env: dict[str, str], at: str = "#PROBE inner"
) -> tuple[Path, str]:
    """Record ``text``, whose probe markers are comments (checking it prints what python
    prints), then put the probe in at the marker ``at``; returns the script and what python
    prints with the probe."""
    script = tmp_path / "train.py"
    script.write_text(text)
    truth = plain(script)
    (tmp_path / "after.log").unlink(missing_ok=True)  # the record starts without the plain run's
    rec = record(tmp_path, "train.py", env=env)
    assert rec.code == truth.code and rec.out == truth.out, rec.err
    assert text.count(at) == 1
    script.write_text(text.replace(at, probe))
    return script, plain(script).out


def _meta(tmp_path: Path) -> dict[str, object]:
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    try:
        (meta,) = db.execute(
            "SELECT meta FROM runs WHERE kind='replay' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        return dict(json.loads(meta))
    finally:
        db.close()


def test_direct_resume_restores_the_carried_state_and_the_code_after_the_loop_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trained with two intra-op threads (the suite's default is one, tests/conftest.py): each
    # worker must pin the record's thread count to print its bits
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    _, want = _setup(tmp_path, CARRIED, INNER, EVERY)
    (tmp_path / "after.log").unlink()
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=EVERY)
    assert par.code == 0, par.err
    assert par.out == want
    assert "worker 2/2 done" in par.err and "direct resume at iteration 3" in par.err, par.err
    # the plan, before running: its segments, how each resumes, and an estimate
    assert (
        "segment 2: iterations 3..the end and the code after the loop (direct resume at boundary 3)"
        in par.err
    )
    assert "estimated" in par.err
    assert (tmp_path / "after.log").read_text() == "after the loop\n"  # the last worker only
    assert _meta(tmp_path)["jobs"] == 2
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out + d.err


def test_outer_probe_with_two_workers_restores_every_block(tmp_path: Path) -> None:
    outer = 'print(f"PROBE {epoch} {lr} {best_val_loss:.10f} {sum(abs(v) for v in w):.10f}")'
    _, want = _setup(tmp_path, CARRIED_PY, outer, EVERY, at="#PROBE outer")
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=EVERY)
    assert par.code == 0, par.err
    assert [ln for ln in par.out.splitlines() if ln.startswith("PROBE")] == [
        ln for ln in want.splitlines() if ln.startswith("PROBE")
    ]
    assert "worker 2/2 done" in par.err and "0 executed" in par.err, par.err
    assert flortrain(tmp_path, "diff").code == 0


def test_three_workers(tmp_path: Path) -> None:
    _, want = _setup(tmp_path, CARRIED_PY, INNER_PY, EVERY)
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "3", env=EVERY)
    assert par.code == 0, par.err
    assert par.out == want
    assert "worker 3/3 done" in par.err
    assert flortrain(tmp_path, "diff").code == 0


def _pseudoresumed_replay_matches(
    tmp_path: Path, text: str, probe: str, at: str = "#PROBE inner"
) -> None:
    """Record ``text``, replay it probed at ``at`` on two workers, the second pseudoresuming from
    the loop's start: the output is the plain probed run's, and ``diff`` passes."""
    _, want = _setup(tmp_path, text, probe, EVERY, at)
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=EVERY)
    assert par.code == 0, par.err
    assert par.out == want
    assert "worker 2/2 done" in par.err and "pseudoresume from the loop's start" in par.err, par.err
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out + d.err


def test_pseudoresume_when_the_boundary_does_not_hold_what_the_probe_reads(tmp_path: Path) -> None:
    # `val` is bound by every iteration after the batch loop and read by the probe before that:
    # the boundary checkpoints do not hold it, so no worker may resume at one. The second worker
    # runs the first segment's iterations again, its blocks restored, and prints from its own.
    probe = 'print(f"PROBE {epoch} {global_step} {val if epoch else 0.0:.10f}")'
    _pseudoresumed_replay_matches(tmp_path, CARRIED_PY, probe)


#: A linear model fitted sample by sample, in pure Python, by a batch loop that alone binds
#: ``x``: nothing after it reads ``x``, so its checkpoints do not hold it (a generator expression
#: reading ``x`` in the loop, which might outlive it, would make them hold it: the script's ``dot``
#: keeps its own). Probe markers before the batch loop and after it.
ONLY_THE_BLOCK_BINDS = textwrap.dedent(
    """\
    import random


    def dot(u, v):
        return sum(a * b for a, b in zip(u, v))


    random.seed(0)
    w = [0.0] * 4
    train = [([random.gauss(0, 1) for _ in range(4)], random.gauss(0, 1)) for _ in range(8)]
    for epoch in range(4):
        #PROBE before
        for x, y in train:
            err = dot(w, x) - y
            w = [wk - 0.1 * err * xk for wk, xk in zip(w, x)]
        #PROBE after
        print(epoch, f"{sum(w):.6f}")
    """
)


def test_a_pseudoresumed_iteration_runs_no_probe(tmp_path: Path) -> None:
    # The probe makes the batch loop execute in the segment, where it binds `x`. Before its
    # segment the second worker restores the loop's instances from checkpoints that do not hold
    # `x`; a probe run there (its output dropped) would find no `x`.
    probe = 'print(f"PROBE {epoch} {sum(x):.8f}")'
    _pseudoresumed_replay_matches(tmp_path, ONLY_THE_BLOCK_BINDS, probe, at="#PROBE after")


def test_a_probe_reading_what_a_block_bound_in_the_last_pseudoresumed_iteration(
    tmp_path: Path,
) -> None:
    # The probe, before the batch loop, reads the `x` the previous iteration's loop bound: in
    # the second worker's first iteration that is the last pseudoresumed one, whose instance of
    # the loop must execute, since no checkpoint holds `x`.
    probe = 'print(f"PROBE {epoch} {sum(x) if epoch else 0.0:.8f}")'
    _pseudoresumed_replay_matches(tmp_path, ONLY_THE_BLOCK_BINDS, probe, at="#PROBE before")


def test_pseudoresume_from_an_earlier_boundary(tmp_path: Path) -> None:
    # Boundary checkpoints exist at every iteration, but the planner is told about only the
    # first: a worker resumes there and runs on to its segment's start with blocks restored.
    # FLORTRAIN_SEGMENTS=even splits 6 iterations at 3; the record's boundaries at 2..5 are
    # removed from its store, so the latest before 3 is 1.
    _, want = _setup(tmp_path, CARRIED_PY, INNER_PY, EVERY)
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    with db:
        db.execute(
            "DELETE FROM checkpoints WHERE key LIKE 'M%@M%' AND CAST(substr(key, instr(key, '.0.') + 3, 1) AS INT) >= 2"
        )
    db.close()
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=EVERY)
    assert par.code == 0, par.err
    assert par.out == want
    assert "pseudoresume from the boundary at iteration 1" in par.err, par.err
    assert flortrain(tmp_path, "diff").code == 0


def test_a_failing_worker_fails_the_replay_with_its_traceback(tmp_path: Path) -> None:
    # The probe divides by zero in epoch 1, inside the first worker's segment: python stops
    # there, and so must the replay, with the same stdout and the worker's traceback.
    probe = 'print(f"PROBE {epoch} {1 / (1 - epoch):.3f}")'
    script, _ = _setup(tmp_path, CARRIED_PY, probe, EVERY)
    truth = plain(script)
    assert truth.code == 1
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=EVERY)
    assert par.code == 1, par.err
    assert par.out == truth.out
    assert "worker 1/2 failed (exit 1)" in par.err
    assert "ZeroDivisionError: division by zero" in par.err
    assert 'File "' in par.err and "train.py" in par.err  # the user's traceback, as python shows it


def test_jobs_1_is_a_serial_replay(tmp_path: Path) -> None:
    _, want = _setup(tmp_path, CARRIED_PY, INNER_PY, EVERY)
    rep = flortrain(tmp_path, "replay", "train.py", "--jobs", "1", env=EVERY)
    assert rep.code == 0 and rep.out == want
    assert "worker" not in rep.err and "parallel" not in rep.err


def test_a_division_that_cannot_pay_starts_no_worker(tmp_path: Path) -> None:
    """By the record's own costs, two workers that each start and set up cannot beat one for a
    loop this small: the replay (dividing by estimated costs, the default) says so before
    planning, runs serially and exactly, and never starts a worker (started ahead and dismissed,
    they would take the cores from it)."""
    _, want = _setup(tmp_path, CARRIED_PY, INNER_PY, EVERY)
    mark = f"warm-{uuid.uuid4()}"
    env = {"FLORTRAIN_SEGMENTS": "estimated", "FLORTRAIN_TEST_MARK": mark}
    rep, workers = _replay_watching(tmp_path, ["--jobs", "2"], env, mark)
    assert rep.code == 0 and rep.out == want, rep.err
    assert "replaying serially: dividing main loop" in rep.err and "cannot pay" in rep.err
    assert workers == {}
    assert _processes_marked(mark) == []


def test_workers_sharing_the_cores_are_priced_as_queueing(tmp_path: Path) -> None:
    """A record's main loop that kept every core busy leaves nothing for a second worker: two
    of them run each at half speed; a loop that kept one core busy on two fits."""
    _setup(tmp_path, CARRIED_PY, INNER_PY, EVERY)
    store = open_store(str(tmp_path / ".flortrain"), create=False)
    try:
        record = store.run(1)
        main_id = next(iter(record.meta["load"]))  # every record measures its main loops' load
        busy = dataclasses.replace(record, meta={**record.meta, "load": {main_id: 2.0}})
        idle = dataclasses.replace(record, meta={**record.meta, "load": {main_id: 0.4}})
        assert sharing.slowdown(busy, main_id, 2, cores=2) == 2.0
        assert sharing.slowdown(idle, main_id, 2, cores=2) == 1.0
        assert sharing.concurrency(busy, main_id, 4, cores=8) == 4.0
        assert (
            sharing.cannot_pay(store, busy, 2, cores=2) is not None
        )  # one worker's worth of cores
    finally:
        store.close()


def _replay_watching(
    tmp_path: Path, args: list[str], env: dict[str, str], mark: str
) -> tuple[Result, dict[int, tuple[str, ...]]]:
    """``flortrain replay train.py ARGS``, and the replay workers (processes marked ``mark``
    running ``flortrain.replay.worker``) seen while it ran, polled every 10 ms, each pid with
    its arguments after the module's name: a worker lives for its import of torch at least,
    about a second."""
    cmd = [sys.executable, "-m", "flortrain", "replay", "train.py", *args]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers: dict[int, tuple[str, ...]] = {}
    while proc.poll() is None:
        for pid in _processes_marked(mark):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "flortrain.replay.worker" in argv:
                tail = argv[argv.index("flortrain.replay.worker") + 1 :]
                workers[pid] = tuple(a for a in tail if a)
        time.sleep(0.01)
    out, err = proc.communicate()
    return Result(proc.returncode, out, err), workers


def _processes_marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``FLORTRAIN_TEST_MARK=mark``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if f"FLORTRAIN_TEST_MARK={mark}".encode() in env.split(b"\0"):
                found.append(int(d.name))
    return found


def test_workers_start_before_the_plan_and_run_their_segments(tmp_path: Path) -> None:
    """Prestarted workers (the default) and workers started once the plan is made
    (``FLORTRAIN_PRESTART=off``) replay the same segments to python's output, and leave no
    process behind."""
    _, want = _setup(tmp_path, CARRIED_PY, INNER_PY, EVERY)
    outs = []
    for prestart in ("on", "off"):
        mark = f"warm-{uuid.uuid4()}"
        env = {**EVERY, "FLORTRAIN_PRESTART": prestart, "FLORTRAIN_TEST_MARK": mark}
        rep = flortrain(tmp_path, "replay", "train.py", "--jobs", "3", env=env)
        assert rep.code == 0 and rep.out == want, rep.err
        assert "3 segments" in rep.err
        assert _processes_marked(mark) == []
        outs.append(rep.out)
    assert outs[0] == outs[1]


#: minGPT's layout: the script leaves its model and its training step to a project package
#: (``mingpt/trainer.py``), or (``plain``) trains without torch at all, torch then being named only
#: by a ``--probe``. Either way the replay uses torch, and its prestarted workers must preload it.
#: The torch trainer steps its model by hand: the optimizer is not the subject.
MINGPT_TRAINER = {
    "torch": textwrap.dedent(
        """\
        import torch


        def make(seed):
            torch.manual_seed(seed)
            model = torch.nn.Linear(4, 1)
            x = torch.randn(32, 4)
            return model, None, x, x.sum(1, keepdim=True)


        def step(model, opt, x, y):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
            model.zero_grad()
            return loss.item()
        """
    ),
    "plain": textwrap.dedent(
        """\
        import random


        def make(seed):
            rng = random.Random(seed)
            return [rng.uniform(-1, 1) for _ in range(4)], None, None, None


        def step(w, opt, x, y):
            for i in range(len(w)):
                w[i] -= 0.1 * (w[i] - 0.5)
            return sum(v * v for v in w)
        """
    ),
}
MINGPT_TRAIN = textwrap.dedent(
    """\
    from mingpt import trainer

    model, opt, x, y = trainer.make(0)
    losses = []
    for epoch in range(4):
        for _ in range(3):
            losses.append(trainer.step(model, opt, x, y))
        last = losses[-1]
        print(f"epoch {epoch} loss {last:.10f}")
    """
)


@pytest.mark.parametrize("trainer", ["torch", "plain"])
def test_prestarted_workers_preload_torch_when_the_replay_uses_it(
    tmp_path: Path, trainer: str
) -> None:
    """The decision of what a prestarted worker imports is the replay's own: torch named in a
    project module under a package directory, or in a ``--probe`` only, makes every worker
    started ahead of the plan preload it (``flortrain.replay.worker --wait torch``)."""
    (tmp_path / "mingpt").mkdir()
    (tmp_path / "mingpt" / "__init__.py").write_text("")
    (tmp_path / "mingpt" / "trainer.py").write_text(MINGPT_TRAINER[trainer])
    script = tmp_path / "train.py"
    script.write_text(MINGPT_TRAIN)
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.code == 0 and rec.out == plain(script).out, rec.err
    expr = "__import__('torch').tensor(losses).sum().item()"
    probed = MINGPT_TRAIN.replace(
        "    last = losses[-1]\n", f"    last = losses[-1]\n    print({expr!r} + ' =', ({expr}))\n"
    )
    script.write_text(probed)
    want = plain(script).out
    assert want.count(" = ") == 4
    script.write_text(MINGPT_TRAIN)
    mark = f"warm-{uuid.uuid4()}"
    env = {**EVERY, "FLORTRAIN_PRESTART": "on", "FLORTRAIN_TEST_MARK": mark}
    rep, workers = _replay_watching(tmp_path, ["--jobs", "2", "--probe", f"8:{expr}"], env, mark)
    assert rep.code == 0 and rep.out == want, rep.err
    assert "2 segments" in rep.err, rep.err
    commands = set(workers.values())
    assert commands == {("--wait", "torch")}, commands
    assert _processes_marked(mark) == []


def test_one_decision_of_whether_a_replay_needs_torch(tmp_path: Path) -> None:
    """The script, a project module it imports from a package directory, or a ``--probe`` naming
    torch: each makes the replay need it; none of them, not."""
    (tmp_path / "mingpt").mkdir()
    (tmp_path / "mingpt" / "__init__.py").write_text("")
    (tmp_path / "mingpt" / "trainer.py").write_text(MINGPT_TRAINER["torch"])
    (tmp_path / "mingpt" / "data.py").write_text(MINGPT_TRAINER["plain"])
    script = str(tmp_path / "train.py")
    assert needs_torch(script, MINGPT_TRAIN, [])
    plain_text = MINGPT_TRAIN.replace("trainer", "data")
    assert not needs_torch(script, plain_text, [])
    assert needs_torch(script, plain_text, ["8:__import__('torch').get_num_threads()"])
    assert not needs_torch(script, plain_text, ["8:losses[-1]"])
    assert needs_torch(script, "import torch\n", [])


# -- the planner --------------------------------------------------------------------------------


def _loop(n: int, pre: float = 2.0, run: float = 1.0, pseudo: float = 0.1) -> LoopCosts:
    return LoopCosts("M1", 0, pre, [run] * n, [pseudo] * n, dict.fromkeys(range(n), 0.05))


def test_divide_balances_the_slowest_worker() -> None:
    plan = divide(_loop(10), list(range(10)), 2)
    starts = [w.segment.start for w in plan.workers]
    assert starts == [0, 5]
    assert [w.resume for w in plan.workers] == ["start", "direct"]
    assert plan.workers[-1].segment.end is None and plan.workers[0].segment.end == 5
    assert plan.parallel == pytest.approx(7.05)  # setup 2 + restore 0.05 + 5 iterations
    assert plan.serial == pytest.approx(12.0)


def test_divide_prefers_boundaries_when_pseudoresume_is_dear() -> None:
    # Re-running an iteration before the segment costs as much as running it: a worker should
    # start exactly at a boundary checkpoint.
    plan = divide(_loop(12, pseudo=1.0), [4, 8], 3)
    assert [w.segment.start for w in plan.workers] == [0, 4, 8]
    assert [w.resume for w in plan.workers] == ["start", "direct", "direct"]


def test_divide_without_boundaries_pseudoresumes_and_may_not_divide() -> None:
    cheap = divide(_loop(10, pseudo=0.1), [], 2)
    assert (
        len(cheap.workers) == 2
        and cheap.workers[1].resume == "pseudo"
        and cheap.workers[1].resume_from == -1
    )
    dear = divide(_loop(10, pseudo=1.0), [], 2)  # resuming costs what it saves
    assert len(dear.workers) == 1


def test_divide_charges_worker_start_up_against_a_serial_replay() -> None:
    # Restoring checkpoints is cheap, so the loop costs 1.2 s to replay: halving it saves 0.6 s,
    # and each worker process's own start-up (serial replay pays none) eats that.
    loop = LoopCosts(
        "M1", 0, 2.0, [0.1] * 12, [0.05] * 12, dict.fromkeys(range(12), 0.01), startup=0.5
    )
    plan = divide(loop, list(range(12)), 2)
    assert plan.serial == pytest.approx(3.2)
    assert len(plan.workers) == 1 or plan.parallel > 0.9 * plan.serial


def test_divide_even_splits_by_iteration_counts() -> None:
    loop = LoopCosts("M1", 0, 0.0, [5.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.1] * 6, {})
    assert [w.segment.start for w in divide(loop, [], 2).workers] == [0, 1]
    assert [w.segment.start for w in divide(loop, [], 2, shape=even(loop)).workers] == [0, 3]


def _row(block: str, state: str, it: int, compute: float, materialize: float) -> BlockRow:
    return BlockRow(f"{block}.{it}", block, "M1", 0, it, 0, BlockState(state), compute, materialize)


def test_one_restore_price_serves_the_plan_estimate_and_the_division() -> None:
    """A checkpoint restored costs c times its materialization, in the plan's block estimate
    and in the iterations a worker pays before its segment alike."""
    rows = [
        _row("L5", "checkpointed", 0, 2.0, 0.5),
        _row("L5", "checkpointed", 1, 2.0, 0.5),
        _row("L5", "recorded", 2, 2.0, 0.0),
        _row("M1", "boundary", 1, 0.0, 0.25),
    ]
    blocks = costs.block_costs(rows, ratio=2.0)
    assert blocks == {"L5": costs.BlockCost(3, 2, 6.0, 2.0)}  # the boundary is no instance
    assert blocks["L5"].replayed(executes=True) == 6.0
    assert blocks["L5"].replayed(executes=False) == pytest.approx(
        2.0 + 2.0
    )  # one has no checkpoint
    times = {("M1", 0): [(0, 1.0), (1, 4.0), (2, 7.0)]}
    checkpoints = {"L5.0", "L5.1", "M1.1"}
    (loop,) = costs.loop_costs(times, rows, checkpoints, set(), 2.0, end=10.0)
    assert loop.pre == 1.0 and loop.restore == {1: 0.5}
    assert loop.pseudo == pytest.approx([2.0, 2.0, 3.0])  # 3 s less 2 s compute plus 1 s restore
    assert loop.run == loop.pseudo  # the block does not execute inside a segment either
    (probed,) = costs.loop_costs(times, rows, checkpoints, {"L5"}, 2.0, end=10.0)
    assert probed.run == [3.0, 3.0, 3.0] and probed.pseudo == loop.pseudo
    assert costs.iteration_seconds([1.0, 4.0, 7.0], None) == [3.0, 3.0, 3.0]  # killed: the median


# -- the blob store a remote worker reads ----------------------------------------------------------


@pytest.mark.parametrize("as_url", [False, True])
def test_blob_reader_verifies_what_it_reads(tmp_path: Path, as_url: bool) -> None:
    """A blob is verified against the sha256 of its key and bytes, an object against its name
    (XXH3-128)."""
    import xxhash

    from flortrain.store.blobs import digest
    from flortrain.store.records import Checkpoint

    data = b"checkpoint bytes"
    sha = digest("k", data)
    name = xxhash.xxh3_128_hexdigest(data)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "k.ft").write_bytes(data)
    for n in (name, xxhash.xxh3_128_hexdigest(b"other bytes")):
        obj = tmp_path / object_rel(n)
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(data)
    reader = BlobReader(f"file://{tmp_path}" if as_url else tmp_path)
    ck = Checkpoint("k", "1/k.ft", sha, len(data))
    assert reader.read_blob(ck) == data
    assert reader.read_blob(Checkpoint("j", "1/k.ft", sha, len(data))) is None  # another key's
    assert reader.read_object(name) == data
    assert (
        reader.read_object(xxhash.xxh3_128_hexdigest(b"other bytes")) is None
    )  # bytes not its name's
    assert reader.read_object(sha) is None  # no such object
    assert reader.read_blob(Checkpoint("k", "1/missing.ft", sha, len(data))) is None
    (tmp_path / "1" / "k.ft").write_bytes(b"checkpoint bytez")  # a flipped byte
    assert reader.read_blob(ck) is None


def test_a_stream_a_worker_first_captures_at_its_resumed_boundary_is_compared(
    tmp_path: Path,
) -> None:
    """numpy's stream is imported after the worker's session began and first captured at the
    boundary the worker resumes at, restored: its own state before the restore is its initial
    one, not the record's (which would read as "untouched" and differ from the record's)."""
    script = copy_fixture("numpy_augment", tmp_path)
    assert record(tmp_path, script.name, env=EVERY).code == 0
    marker = "        # flortrain-probe outer: "
    text = script.read_text()
    assert marker in text
    probed = text.replace(marker, "        print('PROBE', epoch)  # ", 1)
    script.write_text(probed)
    par = flortrain(tmp_path, "replay", script.name, "--jobs", "2", env=EVERY)
    assert par.code == 0, par.err
    assert "worker 2/2 done" in par.err, par.err
    want = [ln for ln in plain(script).out.splitlines() if ln.startswith("PROBE")]
    assert [ln for ln in par.out.splitlines() if ln.startswith("PROBE")] == want
    assert len(want) == 4
    assert flortrain(tmp_path, "diff").code == 0


SHARED_BETAS = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
groups = [{"params": [model.weight], "weight_decay": 0.1}, {"params": [model.bias]}]
optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95))
x = torch.randn(16, 8)
for it in range(6):
    lr = 1e-3 * (it + 1) / 6
    for group in optimizer.param_groups:
        group["lr"] = lr
        #PROBE
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(it, f"{loss.item():.6f}")
"""


def test_a_restored_optimizer_keeps_the_values_its_groups_shared(tmp_path: Path) -> None:
    """nanoGPT's shape: AdamW's groups share the one ``betas`` tuple, and each iteration sets
    every group's learning rate. ``load_state_dict`` gives each group a copy of it, so a worker
    that resumed from a boundary and executed the learning-rate loop digested groups that no
    longer shared it, and the replay called itself unfaithful (exit 1) though every number was
    the record's. Restored, the groups keep the live values that are equal, shared as before."""
    script = tmp_path / "train.py"
    script.write_text(SHARED_BETAS)
    assert flortrain(tmp_path, "record", "train.py", env=EVERY).code == 0
    script.write_text(SHARED_BETAS.replace("#PROBE", 'print("PROBE", it, group["lr"])'))
    par = flortrain(tmp_path, "replay", "train.py", "--jobs", "2", env=EVERY)
    assert par.code == 0, par.err
    assert "worker 2/2 done" in par.err, par.err
    want = [ln for ln in plain(script).out.splitlines() if ln.startswith("PROBE")]
    assert [ln for ln in par.out.splitlines() if ln.startswith("PROBE")] == want
    assert len(want) == 12
    assert flortrain(tmp_path, "diff").code == 0
