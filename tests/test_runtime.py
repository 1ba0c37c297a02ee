"""Runtime guarantees on real PyTorch training, each against a plain run as ground truth:
probe isolation, alias detection through the registry, crash safety, corrupt checkpoints,
the adaptive period, and pinned intra-op threads.

Scripts train by hand unless the optimizer is the subject: torch.optim's first call imports
torch._dynamo, about a CPU-second per process."""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flortrain import knobs
from flortrain.runtime.skipblock import FUTILE_NOTE
from tests.protocol import (
    block_states,
    flortrain,
    latest_run,
    plain,
    probe_lines,
    record,
    record_and_replay_match_plain,
    replay_matches_plain,
)

EVERY = {"FLORTRAIN_PERIOD": "every"}

BASE = textwrap.dedent(
    """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    X = torch.randn(64, 8)
    Y = (X.sum(1, keepdim=True) > 0).float()
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 1))
    for epoch in range(4):
        perm = torch.randperm(64)
        for i in range(0, 64, 16):
            idx = perm[i:i + 16]
            loss = nn.functional.binary_cross_entropy_with_logits(model(X[idx]), Y[idx])
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
            model.zero_grad()
        print(f"epoch {epoch} loss {loss.item():.10f}")
        #PROBE
    """
)


def _write(tmp: Path, text: str) -> Path:
    p = tmp / "train.py"
    p.write_text(text)
    return p


def test_probe_is_isolated_from_rng_and_module_mode(tmp_path: Path) -> None:
    script = _write(tmp_path, BASE)
    truth = plain(script).out
    assert record(tmp_path, "train.py", env=EVERY).out == truth
    # A careless probe: switches the model to eval mode, draws random numbers. In a plain run it
    # would change training; under replay it must not.
    _write(
        tmp_path,
        BASE.replace(
            "    #PROBE",
            "    print('PROBE', model.eval() is model, torch.rand(1).item() < 2, float(model(X[:2]).sum()) == float(model(X[:2]).sum()))",
        ),
    )
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == ["PROBE True True True"] * 4
    # the training lines the replay printed equal the record's exactly
    assert [ln for ln in rep.out.splitlines() if not ln.startswith("PROBE")] == truth.splitlines()
    assert flortrain(tmp_path, "diff").code == 0


HIDDEN = textwrap.dedent(
    """\
    import torch
    from torch import nn
    from helper import sgd_step

    torch.manual_seed(0)
    X = torch.randn(32, 4)
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = nn.Linear(4, 1)
    params = list(model.parameters())
    for epoch in range(4):
        total = 0.0
        for i in range(0, 32, 8):
            loss = ((model(X[i:i + 8]) - Y[i:i + 8]) ** 2).mean()
            loss.backward()
            sgd_step(params, 0.05)
            total += loss.item()
        print(f"epoch {epoch} total {total:.10f}")
        #PROBE
    """
)

HELPER = textwrap.dedent(
    """\
    import torch

    def sgd_step(params, lr):
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
                p.grad = None
    """
)


def test_state_changed_through_an_unseen_alias_is_not_missed(tmp_path: Path) -> None:
    # `sgd_step` lives in another module: the changeset rules cannot see that it updates the
    # model (the loop never names it). The registry's watch must catch it.
    (tmp_path / "helper.py").write_text(HELPER)
    script = _write(tmp_path, HIDDEN)
    truth = plain(script).out
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.out == truth
    assert "changed a Linear" in rec.err
    probed = HIDDEN.replace(
        "    #PROBE", "    print('PROBE', repr(model.weight.sum().item()), repr(model.bias.item()))"
    )
    _write(tmp_path, probed)
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want
    assert (
        block_states(tmp_path / ".flortrain", int(latest_run(tmp_path)["id"])).get("skipped") == 4
    )  # type: ignore[arg-type]
    assert flortrain(tmp_path, "diff").code == 0


ACCUMULATE = textwrap.dedent(
    """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    X = torch.randn(64, 4)
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = nn.Linear(4, 1)
    scale = torch.ones(1, requires_grad=True)  # a parameter of no module
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_scale = torch.optim.SGD([scale], lr=0.01, momentum=0.9)

    for it in range(6):  # nanoGPT's shape: the step loop, and gradient accumulation in it
        opt.zero_grad()
        opt_scale.zero_grad()
        for micro in range(4):
            i = (it * 16 + micro * 4) % 64
            x, y = X[i:i + 4], Y[i:i + 4]
            loss = ((model(x) * scale - y) ** 2).mean()
            loss.backward()
        opt.step()
        opt_scale.step()
        print(f"it {it} weight {model.weight.sum().item():.10f} scale {scale.item():.10f}")
        #PROBE
    """
)


def test_a_loop_that_only_accumulates_gradients_does_not_carry_the_optimizer(
    tmp_path: Path,
) -> None:
    # The micro-step loop changes gradients through `loss.backward()`, which no changeset rule
    # can follow to the tensors it writes: the alias watch learns what changed. The optimizer
    # that will step the model's gradients is not changed by the loop: its momentum is
    # untouched, and its parameters are the model's, watched as the model. So the loop's
    # checkpoints do not carry it. A parameter of no module (`scale`) is seen only through its
    # optimizer: that optimizer is learned, and a replay restores its gradient.
    script = _write(tmp_path, ACCUMULATE)
    truth = plain(script).out
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.code == 0, rec.err
    assert rec.out == truth
    learned = {
        ln.split(" changed a ", 1)[1].split(")", 1)[0] + ")"
        for ln in rec.err.splitlines()
        if " changed a " in ln
    }
    assert "SGD (registry #2)" in learned and "SGD (registry #1)" not in learned, rec.err
    probed = ACCUMULATE.replace(
        "    #PROBE",
        "    print('PROBE', repr(model.weight.grad.sum().item()), repr(scale.grad.item()),"
        " [repr(v['momentum_buffer'].sum().item()) for o in (opt, opt_scale) for v in o.state.values()])",
    )
    _write(tmp_path, probed)
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want
    assert (
        block_states(tmp_path / ".flortrain", int(latest_run(tmp_path)["id"])).get("skipped", 0) > 0
    )  # type: ignore[arg-type]
    assert flortrain(tmp_path, "diff").code == 0


KILLED = BASE.replace(
    '    print(f"epoch {epoch} loss {loss.item():.10f}")\n',
    '    print(f"epoch {epoch} loss {loss.item():.10f}", flush=True)\n'
    "    if epoch == 2:\n"
    "        import os, signal\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n",
)
assert KILLED != BASE


def test_killed_record_stays_readable_and_replayable(tmp_path: Path) -> None:
    script = _write(tmp_path, KILLED)
    truth = plain(script)
    # with the commit interval at 0, every iteration boundary commits what was printed before it;
    # the synchronous materializer commits each checkpoint before training goes on, so which ones
    # exist at the kill does not depend on how far the background writer got (the killed writer
    # and lost checkpoints are tests/test_materializer.py's)
    env = {**EVERY, "FLORTRAIN_COMMIT_INTERVAL": "0", "FLORTRAIN_MATERIALIZER": "sync"}
    rec = flortrain(tmp_path, "record", "train.py", env=env)
    assert rec.code == -9 and truth.code == -9
    assert rec.out == truth.out
    run = latest_run(tmp_path)
    assert run["status"] == "incomplete" and run["duration"] is None
    states = block_states(tmp_path / ".flortrain", int(run["id"]))  # type: ignore[arg-type]
    assert states.get("checkpointed", 0) >= 2, states
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    logged = [
        t for (t,) in db.execute("SELECT text FROM logs WHERE run_id=? ORDER BY seq", (run["id"],))
    ]
    db.close()
    # everything printed before the last iteration boundary was committed
    assert logged == truth.out.splitlines()[:2]
    _write(
        tmp_path,
        KILLED.replace("    #PROBE", "    print('PROBE', repr(model[0].weight.sum().item()))"),
    )
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert "incomplete" in rep.err
    assert (
        probe_lines(rep.out) == want and len(want) == 2
    )  # the kill comes before the probe in epoch 2


def test_corrupt_checkpoint_is_reexecuted_not_trusted(tmp_path: Path) -> None:
    script = _write(tmp_path, BASE)
    record(tmp_path, "train.py", env=EVERY)
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    [(rel,)] = db.execute("SELECT path FROM checkpoints WHERE key LIKE 'L%.1#0'").fetchall()
    db.close()
    blob = tmp_path / ".flortrain" / "blobs" / rel
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    _write(
        tmp_path,
        BASE.replace("    #PROBE", "    print('PROBE', repr(model[2].weight.sum().item()))"),
    )
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert "missing or corrupt" in rep.err
    assert probe_lines(rep.out) == want
    states = block_states(tmp_path / ".flortrain", int(latest_run(tmp_path)["id"]))  # type: ignore[arg-type]
    assert states == {"skipped": 3, "executed": 1}
    assert flortrain(tmp_path, "diff").code == 0


def test_adaptive_period_checkpoints_fewer_and_replays_exactly(tmp_path: Path) -> None:
    # A tolerance so tight that Eq. 4 admits no checkpoint after the forced first one, whatever
    # the machine's timings (test_adaptive.py checks the rule itself with injected costs). Replay
    # then restores instance 0 and re-executes every later instance, and is still exact.
    tight = {"FLORTRAIN_EPSILON": "1e-12"}
    text = BASE.replace("range(4)", "range(6)")
    script = _write(tmp_path, text)
    truth = plain(script).out
    assert flortrain(tmp_path, "record", "train.py", env=tight).out == truth
    states = block_states(tmp_path / ".flortrain", int(latest_run(tmp_path)["id"]))  # type: ignore[arg-type]
    assert states == {"checkpointed": 1, "recorded": 5}, states
    _write(
        tmp_path,
        text.replace("    #PROBE", "    print('PROBE', repr(model[2].weight.sum().item()))"),
    )
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py")
    assert probe_lines(rep.out) == want
    states = block_states(tmp_path / ".flortrain", int(latest_run(tmp_path)["id"]))  # type: ignore[arg-type]
    assert states == {"skipped": 1, "executed": 5}, states
    assert flortrain(tmp_path, "diff").code == 0


FUTILE = textwrap.dedent(
    """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    X = torch.randn(256, 64)
    Y = X @ torch.randn(64, 1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(12):
        for group in opt.param_groups:
            group["lr"] = 1e-3 * 0.9 ** epoch
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32])
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.10f}")
        #PROBE
    """
)


def test_a_loop_cheaper_than_its_restore_is_checkpointed_once_and_replays_exactly(
    tmp_path: Path,
) -> None:
    """The learning-rate loop takes microseconds and its changeset reaches the model and the
    optimizer: a restore would cost more than running it, so after its first (forced) checkpoint
    and the alias watch's instances its instances are futile (``AdaptivePeriod.futile``): not
    checkpointed and not prepared for one. An outer probe's replay restores its first instance
    and runs the rest, on the adaptive period, exactly. (Eq. 4 alone would not checkpoint it again
    in 12 instances either: the in-process test below shows what the rule changes.)"""
    rec, rep = record_and_replay_match_plain(
        tmp_path,
        FUTILE,
        "print('PROBE', epoch, repr(opt.param_groups[0]['lr']), repr(model[0].weight.sum().item()))",
        {"FLORTRAIN_EPSILON": "0.5"},
    )
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    rows = db.execute(
        "SELECT run_id, block_id, state, COUNT(*) FROM blocks WHERE state != 'boundary' GROUP BY run_id, block_id, state"
    ).fetchall()
    # the instances after the alias watch's are futile, and say so
    futile = db.execute(
        "SELECT iteration FROM blocks WHERE run_id = 1 AND block_id = 'L10' AND note = ?",
        (FUTILE_NOTE,),
    )
    futile_iterations = sorted(i for (i,) in futile.fetchall())
    db.close()
    lr_loop = {(run, state): n for run, block, state, n in rows if block == "L10"}
    assert lr_loop == {
        (1, "checkpointed"): 1,
        (1, "recorded"): 11,
        (2, "skipped"): 1,
        (2, "executed"): 11,
    }, rows
    # every instance after the alias watch's, but for one or two a garbage collection may have
    # made dear (C is the larger of the mean and the latest instance)
    watched = knobs.ALIAS_WATCH_INSTANCES
    assert (
        set(futile_iterations) <= set(range(watched, 12))
        and len(futile_iterations) >= 12 - watched - 2
    ), futile_iterations
    assert "L10 (<module>): skip 1 of 12 instance(s)" in rep.err, rep.err
    assert f"the others execute: not checkpointed at record: {FUTILE_NOTE}" in rep.err, rep.err
    assert rec.code == 0 and rep.code == 0


def test_a_futile_instance_is_neither_walked_nor_watched_nor_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, with the block's costs given: a futile instance (``AdaptivePeriod.futile``)
    opens without the walk below its changeset or the light alias watch, and closes as recorded
    without Eq. 4 being asked; a block that is not futile, at the same point, is prepared."""
    import torch

    from flortrain.checkpoint.period import BlockCosts
    from flortrain.runtime import identity
    from flortrain.runtime.recording import RecordSession
    from flortrain.runtime.skipblock import SkipBlock
    from flortrain.store.db import Store

    store = Store(tmp_path / "store")
    s = RecordSession(store, store.begin_run("record", "x.py", [], "", None, None, {}))
    s.registry.install()
    try:
        net = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        s.adaptive.every = False
        s.main_iteration("M0")  # inside the loop's first iteration, as the hook opens it
        objects = {"opt.param_groups": lambda: opt.param_groups}
        # both blocks checkpointed once (held 1 ms) and past the alias watch's instances
        s.adaptive.costs["cheap"] = BlockCosts(
            n=2, k=1, compute=4e-6, last=2e-6, materialize=1e-3, least=1e-3, outer=False
        )
        s.adaptive.costs["dear"] = BlockCosts(
            n=2, k=1, compute=0.02, last=0.01, materialize=1e-3, least=1e-3, outer=False
        )
        walked: list[object] = []
        asked: list[str] = []
        entry = identity.entry
        monkeypatch.setattr(identity, "entry", lambda *a: walked.append(a) or entry(*a))
        monkeypatch.setattr(
            s.adaptive, "should_materialize", lambda b, *a: asked.append(b) or False
        )

        def opened(block_id: str) -> SkipBlock:
            return SkipBlock(s, block_id, (0, 0), (), objects, {}, (), sys._getframe())

        cheap = opened("cheap")
        assert cheap.futile and cheap.entry is None and cheap.light is None and cheap.watch is None
        assert walked == []
        cheap.end(objects, {})
        assert asked == [] and s.counts == {"recorded": 1}
        dear = opened("dear")
        assert (
            not dear.futile
            and dear.entry is not None
            and dear.light is not None
            and len(walked) == 1
        )
        dear.end(objects, {})
        assert asked == ["dear"] and s.counts == {"recorded": 2}
    finally:
        s.registry.uninstall()


def _recording(tmp_path: Path) -> Any:
    """A record's session in this process, inside its main loop's first iteration."""
    from flortrain.runtime.recording import RecordSession
    from flortrain.store.db import Store

    store = Store(tmp_path / "store")
    s = RecordSession(store, store.begin_run("record", "x.py", [], "", None, None, {}))
    s.main_iteration("M0")
    return s


def test_an_instance_is_closed_once_the_frame_of_its_loop_runs_a_line_past_it(
    tmp_path: Path,
) -> None:
    """The block is given the frame running its loop and the loop's lines; while that frame
    runs a line inside them the instance stays open, once it runs a line after them (an
    ``except`` after the loop) the instance is closed as left by an exception, uncheckpointed."""
    from flortrain.runtime.host import State
    from flortrain.runtime.skipblock import SkipBlock

    s = _recording(tmp_path)
    frame = sys._getframe()
    first = frame.f_lineno + 1
    block = SkipBlock(s, "L1", (first, first + 1), (), {}, {}, (), frame)
    s.close_left_frames()
    assert block.state is State.RECORD and not block.aborted and s.frames == [block]
    s.close_left_frames()
    assert block.aborted and s.frames == [] and s.counts == {"recorded": 1}
    assert not block.end({}, {})  # the instrumented `end()` that never ran: nothing more
    assert s.counts == {"recorded": 1}
    s.flush()


def test_a_loop_a_probe_runs_is_plain_code_and_takes_no_key(tmp_path: Path) -> None:
    """A block opened inside a probe, nested in another block, or outside the main loop runs as
    plain code; the script's own instance after a probe's still gets the iteration's first key."""
    from flortrain.runtime.host import State
    from flortrain.runtime.probe import isolated
    from flortrain.runtime.skipblock import SkipBlock

    s = _recording(tmp_path)
    frame = None  # no side-effect audit: the test's own locals hold the blocks and the session
    with isolated(s):
        probed = SkipBlock(s, "L1", (0, 0), (), {}, {}, (), frame)
    assert probed.state is State.PASSTHROUGH and probed.key == ""
    probed.end({}, {})
    own = SkipBlock(s, "L1", (0, 0), (), {}, {}, (), frame)
    nested = SkipBlock(s, "L2", (0, 0), (), {}, {}, (), frame)
    assert (own.state, own.key) == (State.RECORD, "L1@M0.0.0#0")
    assert (nested.state, nested.key) == (State.PASSTHROUGH, "")
    nested.end({}, {})
    own.end({}, {})
    s.main_exit("M0")
    outside = SkipBlock(s, "L1", (0, 0), (), {}, {}, (), frame)
    assert outside.state is State.PASSTHROUGH
    s.flush()  # the script's own instance, a block's first, is checkpointed (Eq. 4)
    assert {k: n for k, n in s.counts.items() if n} == {"checkpointed": 1}
    assert list(s.store.checkpoints(s.run_id)) == ["L1@M0.0.0#0"]


def test_intra_op_threads_are_pinned_on_replay(tmp_path: Path) -> None:
    _write(tmp_path, BASE)
    record(tmp_path, "train.py", env={**EVERY, "OMP_NUM_THREADS": "1"})
    run = latest_run(tmp_path)
    db = sqlite3.connect(tmp_path / ".flortrain" / "flortrain.db")
    [(threads,)] = db.execute("SELECT threads FROM runs WHERE id=?", (run["id"],)).fetchall()
    db.close()
    assert threads == 1
    _write(tmp_path, BASE.replace("    #PROBE", "    print('PROBE', torch.get_num_threads())"))
    rep = flortrain(tmp_path, "replay", "train.py", env={**EVERY, "OMP_NUM_THREADS": "2"})
    assert probe_lines(rep.out) == ["PROBE 1"] * 4
    assert json.loads(flortrain(tmp_path, "runs", "--json").out)[-1]["kind"] == "replay"


def test_a_module_flortrain_cannot_capture_never_stops_training(tmp_path: Path) -> None:
    # A module whose state_dict raises: the alias watch and the checkpoint both fail. That is a
    # flortrain limitation, so training must go on unchanged (warned once, nothing memoized) and
    # the replay re-executes every instance, still exact.
    text = BASE.replace(
        "model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 1))\n",
        "class Opaque(nn.Sequential):\n"
        "    def state_dict(self, *args, **kwargs):\n"
        "        raise RuntimeError('no state_dict for you')\n"
        "model = Opaque(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 1))\n",
    )
    rep = replay_matches_plain(
        tmp_path, text, "print('PROBE', repr(model[2].weight.sum().item()))", EVERY
    )
    record = flortrain(tmp_path, "runs", "--json")
    assert [r["status"] for r in json.loads(record.out)] == ["complete", "complete"]
    states = block_states(tmp_path / ".flortrain", 1)
    assert states == {"recorded": 4}, states
    assert "0 block instances skipped, 4 executed" in rep.err, rep.err


def test_a_probe_iterating_a_seeded_loader_does_not_shift_training(tmp_path: Path) -> None:
    # The inner probe peeks at a batch of the loader being trained on: that draws from the
    # loader's own generator. Isolation puts the generator back, so the executed epochs train on
    # the recorded shuffle order and diff finds nothing (a plain run of the probed script would
    # train on another order: probes observe the recorded run, docs/limitations.md).
    text = textwrap.dedent(
        """\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        torch.manual_seed(0)
        X, Y = torch.randn(32, 4), torch.randn(32, 1)
        loader = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
        model = nn.Linear(4, 1)
        for epoch in range(3):
            for x, y in loader:
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.05 * p.grad
                model.zero_grad()
                #PROBE
            print("epoch", epoch, f"{loss.item():.10f}")
        """
    )
    script = _write(tmp_path, text)
    truth = plain(script).out
    assert flortrain(tmp_path, "record", "train.py", env=EVERY).out == truth
    _write(
        tmp_path,
        text.replace(
            "        #PROBE", "        print('PROBE', next(iter(loader))[0].sum().item())"
        ),
    )
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert len(probe_lines(rep.out)) == 12
    assert [ln for ln in rep.out.splitlines() if not ln.startswith("PROBE")] == truth.splitlines()
    assert flortrain(tmp_path, "diff").code == 0


FINALIZED_AT_EXIT = textwrap.dedent(
    """\
    import gc
    import torch

    class Node:
        # in a reference cycle: only the collector frees it, here at interpreter exit
        def __init__(self, name):
            self.name, self.me = name, self

        def __del__(self):
            print("finalized", self.name, flush=True)

    keep = Node("module global")
    for epoch in range(3):
        w = torch.ones(2) * epoch
        print("epoch", epoch, w.sum().item())
        #PROBE
    tracked = {id(o) for o in gc.get_objects()}
    print("torch's objects collected as in a plain run:", id(vars(torch)) in tracked and id(vars(torch.nn)) in tracked)
    """
)


def test_the_scripts_objects_are_collected_and_finalized_as_in_a_plain_run(tmp_path: Path) -> None:
    """flortrain sets its own start-up objects aside from the collector (``gc.freeze``) before
    torch and the script are imported (``launch.set_aside_static_objects``): a recorded
    script's exit then costs what a plain run's does. What the script and torch make must still
    be collected as in a plain run: a cycle with a finalizer, freed by the collections at
    interpreter exit, prints the same line under record and replay."""
    rep = replay_matches_plain(
        tmp_path, FINALIZED_AT_EXIT, 'print("PROBE", epoch, w.tolist())', EVERY
    )
    assert rep.out.splitlines()[-1] == "finalized module global", rep.out
    assert "torch's objects collected as in a plain run: True" in rep.out, rep.out
    script = tmp_path / "set_aside.py"
    script.write_text("import gc\nprint(gc.get_freeze_count() > 0)\n")
    for cmd in (["record", script.name], ["replay", script.name]):
        r = flortrain(tmp_path, *cmd)
        assert r.code == 0 and r.out == "True\n", (cmd, r.out, r.err)
    assert plain(script).out == "False\n"


def test_the_registry_knows_copies_and_unpickled_objects() -> None:
    """deepcopy, ``copy.copy``, pickle and ``torch.load`` make a module, an optimizer or a data
    loader without ``__init__``: the registry learns each through ``__setstate__``. A norm
    module's copy is watched once (its running statistics), and the watch's hook is not part
    of what pickles: ``torch.save(model, f)`` under record wrote a local function and failed."""
    import copy
    import io
    import pickle

    import torch

    from flortrain.checkpoint import versions
    from flortrain.runtime.registry import Registry

    reg = Registry()
    reg.install()
    try:
        net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2))
        loader = torch.utils.data.DataLoader(dataset, batch_size=2)
        buf = io.BytesIO()
        torch.save(net, buf)
        buf.seek(0)
        copies = [
            copy.deepcopy(net),
            copy.copy(net),
            pickle.loads(pickle.dumps(net)),
            torch.load(buf, weights_only=False),
            copy.deepcopy(opt),
            copy.deepcopy(loader),
        ]
        assert all(reg.id_of(c) is not None for c in copies)
        assert all(reg.id_of(m) is not None for c in copies[:4] for m in c.modules())
        deep = copies[0]
        assert list(deep[1]._forward_hooks.values()) == [versions._after_norm_forward]
        assert versions._after_norm_forward not in net.__getstate__()["_forward_hooks"].values()
        deep.train()(torch.randn(4, 2))
        assert versions.untrusted(deep[1].running_mean)
        reg.paused += 1
        assert reg.id_of(copy.deepcopy(net)) is None  # a probe's copy takes no id
        reg.paused -= 1
    finally:
        reg.uninstall()
    assert "__setstate__" not in vars(torch.utils.data.DataLoader)
    assert torch.nn.Module.__setstate__.__module__ == "torch.nn.modules.module"
