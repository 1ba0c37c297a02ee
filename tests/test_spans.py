"""Iteration spans: a replay jumps over main-loop iterations in which no probe fires.

Ground truth is always a plain ``python`` run of the probed script (tests/protocol.py). The jump
counts are exact: with ``FLORTRAIN_PERIOD=every`` every iteration boundary is checkpointed, so a
replay lands on each iteration a probe fires in, and on the last one. Scripts about guards and
jump counts train a list of weights in plain Python (a torch process costs about two CPU-seconds);
those about tensors, modules and optimizers train with torch.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flortrain.static.analysis import analyse
from flortrain.static.source import parse
from tests.protocol import (
    FIXTURES,
    PY_TOY_PRELUDE,
    PY_TOY_STEP,
    flortrain,
    plain,
    probe_lines,
    record,
    replay_matches_plain,
)

REALCODE = FIXTURES / "realcode"

EVERY = {"FLORTRAIN_PERIOD": "every"}

STEPS = (
    PY_TOY_PRELUDE
    + textwrap.dedent("""\
    iter_num = 0
    max_iters = 29
    log_every = 5
    while True:
        idx = [random.randrange(64) for _ in range(8)]
        for micro in range(2):
            batch = idx[micro * 4 : (micro + 1) * 4]
""")
    + PY_TOY_STEP
    + textwrap.dedent("""\
        #PROBE
        if iter_num % 10 == 0:
            print(f"iter {iter_num} loss {loss:.6f}")
        iter_num += 1
        if iter_num > max_iters:
            break
    print("final", f"{sum(weight):.10f}")
""")
)

EPOCHS = (
    PY_TOY_PRELUDE
    + textwrap.dedent("""\
    for epoch in range(12):
        perm = random.sample(range(64), 64)
        for b in range(4):
            batch = perm[b * 16 : (b + 1) * 16]
""")
    + PY_TOY_STEP
    + textwrap.dedent("""\
        #PROBE
        print(f"epoch {epoch} loss {loss:.6f}")
    print("final", f"{sum(weight):.10f}")
""")
)

#: A ``Linear`` model and its data. Scripts train it by hand (``loss.backward()``, then each
#: parameter updated under ``torch.no_grad()``) unless the optimizer is (part of) the subject:
#: a torch.optim optimizer imports torch._dynamo, about a CPU-second a process.
HEADER = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    data = torch.randn(64, 4)
    target = data.sum(1, keepdim=True)
""")

OPTIMIZER = "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"


def _jumped(stderr: str) -> int:
    for line in stderr.splitlines():
        if "main-loop iterations jumped over" in line:
            return int(line.rsplit(", ", 1)[1].split()[0])
    return 0


def test_guarded_probe_in_a_while_true_step_loop_jumps_to_each_firing(tmp_path: Path) -> None:
    probe = 'if iter_num % log_every == 0: print("PROBE", iter_num, weight)'
    rep = replay_matches_plain(tmp_path, STEPS, probe, env=EVERY)
    # fires at 0, 5, .., 25: from 1 to 5, .., from 21 to 25 (4 each), then 26..28 to the last
    assert _jumped(rep.err) == 5 * 4 + 3, rep.err
    assert "(`(iter_num % log_every == 0)`)" in rep.err


def test_guarded_probe_in_an_epoch_loop_skips_the_iterator_too(tmp_path: Path) -> None:
    probe = 'if epoch % 4 == 3: print("PROBE", epoch, weight)'
    rep = replay_matches_plain(tmp_path, EPOCHS, probe, env=EVERY)
    assert _jumped(rep.err) == 9, rep.err  # 0-2, 4-6, 8-10


def test_an_enclosing_if_and_an_else_branch_are_guards(tmp_path: Path) -> None:
    text = STEPS.replace(
        "    #PROBE\n",
        "    if iter_num % 7 == 0:\n        pass\n    else:\n        pass\n        #PROBE\n",
    )
    probe = 'if iter_num > 20: print("PROBE", iter_num, weight)'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    # fires at 22..27 and 29 (not 21, 28: multiples of 7): 0..21 jump to 22, 28 to 29
    assert _jumped(rep.err) == 22 + 1, rep.err


def test_a_probe_after_the_main_loop_jumps_to_its_last_iteration(tmp_path: Path) -> None:
    text = STEPS.replace("    #PROBE\n", "").replace('print("final"', '#PROBE\nprint("final"')
    rep = replay_matches_plain(tmp_path, text, 'print("PROBE", weight)', env=EVERY)
    assert _jumped(rep.err) == 29, rep.err


def test_an_unguarded_probe_runs_every_iteration_and_says_why(tmp_path: Path) -> None:
    rep = replay_matches_plain(
        tmp_path, STEPS, 'print("PROBE", iter_num, f"{loss:.10f}")', env=EVERY
    )
    assert _jumped(rep.err) == 0
    assert (
        "every iteration runs: the probe at line 19 cannot be told off a run: nothing guards it"
        in rep.err
    )


def test_a_guard_on_a_name_the_iteration_rebinds_first_is_not_trusted(tmp_path: Path) -> None:
    text = STEPS.replace("    #PROBE\n", "    step_loss = loss\n    #PROBE\n")
    probe = 'if step_loss > 0: print("PROBE", iter_num, f"{step_loss:.10f}")'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert _jumped(rep.err) == 0
    assert "its guard reads `step_loss`, which the iteration rebinds before it" in rep.err


def test_a_guard_that_calls_a_function_is_not_trusted(tmp_path: Path) -> None:
    probe = 'if abs(iter_num) % 5 == 0: print("PROBE", iter_num)'
    rep = replay_matches_plain(tmp_path, STEPS, probe, env=EVERY)
    assert _jumped(rep.err) == 0
    assert "calls a function" in rep.err


def test_a_missing_boundary_checkpoint_means_running_on_not_a_wrong_answer(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(STEPS)
    assert record(tmp_path, "train.py", env=EVERY).code == 0
    blobs = sorted((tmp_path / ".flortrain").rglob("M9_M9.0.5_0.*"))
    assert blobs, sorted(p.name for p in (tmp_path / ".flortrain").rglob("*.pt"))[:5]
    for b in blobs:
        b.write_bytes(b"damaged")
    probe = '    if iter_num % log_every == 0: print("PROBE", iter_num, weight)'
    script.write_text(STEPS.replace("    #PROBE", probe))
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want
    assert "boundary checkpoint M9@M9.0.5#0 is missing or corrupt; running on" in rep.err
    assert _jumped(rep.err) == 4 * 4 + 3  # 1..4 run; the rest as before
    assert flortrain(tmp_path, "diff").code == 0


def test_nanogpt_shape_with_a_guarded_outer_probe(tmp_path: Path) -> None:
    """nanoGPT's `while True` with micro-steps, `loss` carried into the log line (stored
    detached: read only through `.item()`), ddp-guarded attribute absent, at the adaptive period.
    ε is 0.3, not the default: this run lasts 3 seconds, and at a smaller ε how many boundaries
    its budget affords swings widely with the machine's speed and load; the test is about
    jumping at the adaptive period, not about that. The replay jumps over exactly the iterations
    the committed boundaries and the probe's guard on the recorded scalars say it can."""
    src = (REALCODE / "nanogpt.py").read_text()
    marker = next(ln for ln in src.splitlines() if "# flortrain-probe outer:" in ln)
    text = src.replace(marker, "    #PROBE")
    probe = (
        'if iter_num % 15 == 0: print("PROBE", iter_num,'
        ' f"{sum(p.detach().abs().sum().item() for p in raw_model.parameters()):.10f}")'
    )
    rep = replay_matches_plain(tmp_path, text, probe, env={"FLORTRAIN_EPSILON": "0.3"})
    want = _jumps_over(tmp_path, lambda it: it["iter_num"] % 15 == 0)
    assert want > 0 and _jumped(rep.err) == want, rep.err


def _jumps_over(tmp: Path, fires: Callable[[dict[str, Any]], bool]) -> int:
    """How many iterations of record run 1's main loop a replay jumps over, derived from the
    store (``runtime/jumps.py``): at iteration ``i`` where the probe does not fire (``fires``, on
    the iteration's recorded scalars; none recorded counts as firing), the replay continues at
    the latest boundary ``j`` with ``i < j <= f``, ``f`` the next iteration that fires (or the
    last recorded one), and runs iteration ``j``."""
    db = sqlite3.connect(tmp / ".flortrain" / "flortrain.db")
    try:
        scalars = {
            it: None if raw is None else json.loads(raw)
            for it, raw in db.execute(
                "SELECT iteration, scalars FROM iterations WHERE run_id=1 AND main_inst=0"
            )
        }
        marks = sorted(
            it
            for (it,) in db.execute(
                "SELECT b.iteration FROM blocks b JOIN checkpoints c ON c.run_id = b.run_id"
                " AND c.key = b.key WHERE b.run_id=1 AND b.main_inst=0 AND b.state='boundary'"
            )
        )
    finally:
        db.close()
    last = max(scalars)
    firing = {it for it, sc in scalars.items() if sc is None or _fires(fires, sc)}
    jumped, i = 0, 0
    while i <= last:
        if i not in firing:
            f = next((it for it in range(i + 1, last + 1) if it in firing), last)
            j = max((b for b in marks if i < b <= f), default=i)
            jumped, i = jumped + j - i, j
        i += 1
    return jumped


def _fires(fires: Callable[[dict[str, Any]], bool], scalars: dict[str, Any]) -> bool:
    try:
        return fires(scalars)
    except KeyError:  # a value the guard reads was not recorded: the iteration runs
        return True


def _boundary(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    plan = analyse(parse("train.py", textwrap.dedent(text)))
    b = plan.main_loops[0].boundary
    assert b is not None, plan.main_loops[0].no_boundary
    return {c.expr: c.restore.value for c in b.changes}, b.values


def test_boundary_state_holds_what_the_next_iteration_reads_before_binding() -> None:
    changes, values = _boundary("""
        prev = None
        for step in range(10):
            for b in loader:
                loss = model(b)
                loss.backward()
                opt.step()
            if step % 2:
                delta = loss.item() - last
            last = loss.item()
            scratch = 3
            print(scratch)
    """)
    # `loss` reaches the next iteration's `if` only as a number; `last` is read before it is
    # bound; `scratch` and `delta` never carry over; `prev` is never rebound; the loop target
    # `step` is restored by a jump rather than taken from the iterator
    assert changes == {"opt": "in_place", "step": "rebound", "loss": "rebound", "last": "rebound"}
    assert values == ("loss",)  # `last` feeds `delta` through arithmetic: not proved a value read


def test_a_carried_tensor_used_for_autograd_is_not_stored_detached() -> None:
    changes, values = _boundary("""
        total = 0
        for step in range(10):
            for b in loader:
                total = total + model(b)
            total.backward()
            opt.step()
    """)
    assert changes["total"] == "rebound"
    assert values == ()


def test_a_class_field_named_like_the_loss_is_not_a_read_of_the_loss() -> None:
    """``loss: float`` in a dataclass binds a class attribute: counted as a use of the module's
    ``loss`` after the loop, it would put the graph-carrying ``loss`` into the boundary state,
    and every boundary would be refused."""
    changes, values = _boundary("""
        @dataclass
        class Best:
            step: int
            loss: float
            note = "best"
        best = Best(0, 9.0)
        for epoch in range(10):
            for b in loader:
                loss = model(b)
                loss.backward()
                opt.step()
                best.step += 1
            best.loss = round(best.loss, 4)
    """)
    # nothing after the inner loop reads `loss`: it does not cross a boundary
    assert "loss" not in changes and "note" not in changes, changes
    assert "best.loss" in changes and values == ()


def test_explain_names_the_boundary_state() -> None:
    plan = analyse(parse("train.py", (REALCODE / "nanogpt.py").read_text()))
    text = plan.explain()
    prefix = "  iteration boundary state (iteration spans): "
    (line,) = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    held = set(line[len(prefix) :].split(", "))
    assert {"best_val_loss", "model.require_backward_grad_sync", "X", "Y", "iter_num"} <= held, line


def test_a_data_loader_built_every_epoch_does_not_block_jumps(tmp_path: Path) -> None:
    """Jumped iterations create loaders the replay never has: their registry ids are reserved,
    and the loaders themselves (not carried) are left out of the restore."""
    text = HEADER.replace(
        "import torch\n", "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
    ) + textwrap.dedent("""\
        for epoch in range(12):
            loader = DataLoader(TensorDataset(data, target), batch_size=16, shuffle=True)
            for x, y in loader:
                loss = ((model(x) - y) ** 2).mean()
                model.zero_grad()
                loss.backward()
                with torch.no_grad():
                    model.weight -= 0.05 * model.weight.grad
                    model.bias -= 0.05 * model.bias.grad
            #PROBE
            print(f"epoch {epoch} loss {loss.item():.6f}")
        print("final", model.weight.sum().item())
    """)
    probe = 'if epoch % 4 == 3: print("PROBE", epoch, f"{model.weight.norm().item():.10f}")'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert _jumped(rep.err) == 9, rep.err


def test_a_guard_may_read_an_argparse_namespace(tmp_path: Path) -> None:
    text = STEPS.replace(
        "log_every = 5\n", "import argparse\nargs = argparse.Namespace(log_every=5)\n"
    )
    probe = 'if iter_num % args.log_every == 0: print("PROBE", iter_num, weight)'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert _jumped(rep.err) == 5 * 4 + 3, rep.err


# -- shapes that would replay wrongly (silently) if checkpointed naively ---------------------------


def test_a_probe_reading_a_name_bound_only_in_some_iterations_stops_jumps(tmp_path: Path) -> None:
    """`val` is bound every third epoch; the boundary does not hold it (the recorded script
    never reads it across iterations), so a jump would leave a stale `val` for the probe."""
    text = (
        PY_TOY_PRELUDE
        + textwrap.dedent("""\
        for epoch in range(20):
            perm = random.sample(range(64), 64)
            for b in range(4):
                batch = perm[b * 16 : (b + 1) * 16]
    """)
        + PY_TOY_STEP
        + textwrap.dedent("""\
            if epoch % 3 == 0:
                val = sum((sum(w * x for w, x in zip(weight, xs)) - t) ** 2 for xs, t in zip(data, target))
                print("val", epoch, f"{val:.6f}")
            #PROBE
        print("final", f"{sum(weight):.10f}")
    """)
    )
    rep = replay_matches_plain(
        tmp_path, text, 'if epoch % 6 == 4: print("PROBE", epoch, f"{val:.10f}")', env=EVERY
    )
    assert _jumped(rep.err) == 0
    assert (
        "reads `val`, which an iteration binds and the boundary checkpoints do not hold" in rep.err
    )


def test_a_probe_printing_a_carried_tensor_stops_jumps(tmp_path: Path) -> None:
    text = HEADER + textwrap.dedent("""\
        prev = 0.0
        for step in range(30):
            if step > 0:
                prev = loss.item()
            #PROBE
            idx = torch.randint(0, 64, (8,))
            for micro in range(2):
                loss = ((model(data[idx]) - target[idx]) ** 2).mean() / 2
                loss.backward()
            with torch.no_grad():
                model.weight -= 0.05 * model.weight.grad
                model.bias -= 0.05 * model.bias.grad
            model.zero_grad()
        print("final", model.weight.sum().item(), prev)
    """)
    rep = replay_matches_plain(
        tmp_path, text, 'if step % 10 == 5: print("PROBE", step, loss)', env=EVERY
    )
    assert _jumped(rep.err) == 0
    assert "reads `loss` as a tensor" in rep.err


def test_a_jump_restores_the_loop_target_instead_of_trusting_the_iterator(tmp_path: Path) -> None:
    """The generator draws from the global RNG, interleaved with dropout: items taken while
    skipping are not the record's, so the item a jump lands on comes from the boundary."""
    text = textwrap.dedent("""\
        import torch
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        def batches():
            while True:
                x = torch.randn(8, 4)
                yield x, x.sum(1, keepdim=True)
        for step, (x, y) in enumerate(batches()):
            if step >= 30:
                break
            for micro in range(2):
                loss = ((model(x) - y) ** 2).mean() / 2
                loss.backward()
            with torch.no_grad():
                model[0].weight -= 0.05 * model[0].weight.grad
                model[0].bias -= 0.05 * model[0].bias.grad
                model[2].weight -= 0.05 * model[2].weight.grad
                model[2].bias -= 0.05 * model[2].bias.grad
            model.zero_grad()
            #PROBE
        print("final", model[0].weight.sum().item())
    """)
    probe = 'if step % 10 == 7: print("PROBE", step, f"{x.sum().item():.10f}", f"{model[0].weight.sum().item():.10f}")'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert _jumped(rep.err) == 7 + 9 + 9 + 2, rep.err


def test_a_guard_on_a_match_capture_is_not_taken_from_the_iteration_start(tmp_path: Path) -> None:
    text = (
        PY_TOY_PRELUDE
        + textwrap.dedent("""\
        for step in range(24):
            for b in range(2):
                batch = range(b * 8, (b + 1) * 8)
    """)
        + PY_TOY_STEP
        + textwrap.dedent("""\
            match step % 4:
                case r:
                    mult = r + 1
            #PROBE
        print("final", f"{sum(weight):.10f}")
    """)
    )
    rep = replay_matches_plain(
        tmp_path, text, 'if r == 2: print("PROBE", step, r, weight)', env=EVERY
    )
    assert _jumped(rep.err) == 0
    assert "its guard reads `r`, which the iteration rebinds before it" in rep.err


def test_a_guard_on_an_attribute_of_a_model_is_not_trusted_at_run_time(tmp_path: Path) -> None:
    """`forward` counts its calls: nothing the static pass sees changes `model.calls` (an
    optimizer steps the model; updated by hand, its parameters would name `model` changed)."""
    text = textwrap.dedent("""\
        import torch
        torch.manual_seed(0)
        torch.set_num_threads(1)
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 1)
                self.calls = 0
            def forward(self, x):
                self.calls += 1
                return self.fc(x)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.randn(64, 4)
        target = data.sum(1, keepdim=True)
        for epoch in range(20):
            for b in range(3):
                loss = ((model(data[b * 8:(b + 1) * 8]) - target[b * 8:(b + 1) * 8]) ** 2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
            #PROBE
        print("final", model.fc.weight.sum().item(), model.calls)
    """)
    probe = 'if model.calls % 15 == 0: print("PROBE", epoch, model.calls, f"{model.fc.weight.sum().item():.10f}")'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert _jumped(rep.err) == 0
    assert "`model` is not a plain value or an argparse namespace" in rep.err


def test_a_rebound_name_holding_the_model_gets_the_live_model_back(tmp_path: Path) -> None:
    """`model = model.eval()` rebinds `model` every epoch: after a jump it must be the module
    the optimizer updates, not a copy."""
    text = (HEADER + OPTIMIZER).replace(
        "model = torch.nn.Linear(4, 1)",
        "model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))",
    ) + textwrap.dedent("""\
        for epoch in range(20):
            model = model.train()
            perm = torch.randperm(64)
            for b in range(4):
                i = perm[b * 16:(b + 1) * 16]
                loss = ((model(data[i]) - target[i]) ** 2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
            model = model.eval()
            #PROBE
        print("final", f"{model[0].weight.sum().item():.8f}")
    """)
    probe = 'if epoch % 5 == 4: print("PROBE", epoch, f"{model[0].weight.sum().item():.8f}", opt.param_groups[0]["params"][0] is model[0].weight)'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert _jumped(rep.err) > 0, rep.err


def test_a_rebound_view_of_a_parameter_is_not_restored_as_a_copy(tmp_path: Path) -> None:
    text = HEADER + textwrap.dedent("""\
        for step in range(40):
            idx = torch.randint(0, 64, (8,))
            for micro in range(2):
                loss = ((model(data[idx]) - target[idx]) ** 2).mean() / 2
                loss.backward()
            with torch.no_grad():
                model.weight -= 0.05 * model.weight.grad
                model.bias -= 0.05 * model.bias.grad
            model.zero_grad()
            #PROBE
            if step % 10 == 0:
                snap = model.weight.detach()
        print("final", snap.sum().item())
    """)
    probe = 'if step % 10 == 7: print("PROBE", step, f"{snap.sum().item():.8f}", f"{model.weight.sum().item():.8f}")'
    rep = replay_matches_plain(tmp_path, text, probe, env=EVERY)
    assert "`snap` shares memory with a model parameter" in rep.err or _jumped(rep.err) == 0, (
        rep.err
    )


def test_a_scheduler_created_in_the_loop_is_not_restored_as_a_copy(tmp_path: Path) -> None:
    text = (
        HEADER
        + OPTIMIZER
        + textwrap.dedent("""\
        sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
        for epoch in range(20):
            if epoch == 8:
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
                sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
            perm = torch.randperm(64)
            for b in range(2):
                i = perm[b * 8:(b + 1) * 8]
                loss = ((model(data[i]) - target[i]) ** 2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
            sched.step()
            #PROBE
        print("final", model.weight.sum().item(), opt.param_groups[0]["lr"])
    """)
    )
    probe = 'if epoch % 4 == 1: print("PROBE", epoch, opt.param_groups[0]["lr"], f"{model.weight.sum().item():.8f}")'
    replay_matches_plain(tmp_path, text, probe, env=EVERY)
