"""Patterns from real training code that once gave silent wrong answers or memoized nothing.

Each test runs the correctness protocol (plain ``python`` is the ground truth) on a small script
with the shape found in the wild, and asserts what memoization must do with it: a replay that is
right but skips nothing is asserted as such, never the other way round.

Scripts train by hand unless the optimizer is the subject (torch.optim's first call imports
torch._dynamo, about a CPU-second per process); a shape whose state is plain Python or numpy
values is a script without torch.
"""

from __future__ import annotations

from pathlib import Path

from tests.protocol import (
    block_states,
    flortrain,
    latest_run,
    record_and_replay_match_plain,
    replay_matches_plain,
)

EVERY = {"FLORTRAIN_PERIOD": "every"}

#: the toy script's model and batches (``toy_prelude`` without its optimizer); each shape below
#: adds its own loop, and steps the parameters by hand as SGD would: through
#: ``model.parameters()`` inside a batch loop, the two tensors by name in an epoch's body (where a
#: loop over the parameters would be a memoized loop of its own)
PRELUDE = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
train = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
val = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(2)]
"""


def _states(tmp: Path, which: str = "replay") -> dict[str, int]:
    run = latest_run(tmp) if which == "replay" else {"id": 1}
    return block_states(tmp / ".flortrain", int(run["id"]))  # type: ignore[call-overload]


# -- a probe that calls the script's own function holding a memoized loop ----------------------------
EVALUATE = (
    PRELUDE
    + """
def evaluate(data):
    total = 0.0
    with torch.no_grad():
        for x, y in data:
            total += ((model(x) - y) ** 2).mean().item()
    return total / len(data)


for epoch in range(3):
    for x, y in train:
        model.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(0.05 * param.grad)
    #PROBE
    print(epoch, f"{evaluate(val):.6f}")
"""
)


def test_probe_calling_a_memoized_function_does_not_take_its_checkpoints(tmp_path: Path) -> None:
    rep = replay_matches_plain(
        tmp_path, EVALUATE, 'print("PROBE", f"{evaluate(train):.6f}")', env=EVERY
    )
    # the script's own evaluate() calls and the training loop are all restored; the probe's
    # evaluate() loops ran inside the probe and took no block instance of the record
    assert _states(tmp_path) == {"skipped": 6}
    assert "evaluate()" in rep.err and "inside the probe" in rep.err


# -- tensors carrying an autograd graph out of a loop -------------------------------------------------
REINFORCE = (
    PRELUDE
    + """
for episode in range(4):
    log_probs = []
    for x, y in train:
        log_probs.append(((model(x) - y) ** 2).mean())
    loss = torch.stack(log_probs).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        model.weight.sub_(0.05 * model.weight.grad)
        model.bias.sub_(0.05 * model.bias.grad)
    #PROBE
    print(episode, f"{loss.item():.6f}")
"""
)

ACCUMULATE = (
    PRELUDE
    + """
for epoch in range(4):
    total = 0
    for x, y in train:
        total = total + ((model(x) - y) ** 2).mean()
    model.zero_grad()
    total.backward()
    with torch.no_grad():
        model.weight.sub_(0.05 * model.weight.grad)
        model.bias.sub_(0.05 * model.bias.grad)
    #PROBE
    print(epoch, f"{total.item():.6f}")
"""
)

WEIGHT_PROBE = 'print("PROBE", f"{model.weight.sum().item():.8f}", f"{model.bias.item():.8f}")'


def test_graph_carrying_list_is_not_restored_detached(tmp_path: Path) -> None:
    rep = replay_matches_plain(tmp_path, REINFORCE, WEIGHT_PROBE, env=EVERY)
    assert "autograd graph" in rep.err
    assert _states(tmp_path) == {"executed": 4}


def test_graph_carrying_name_used_by_backward_is_not_restored_detached(tmp_path: Path) -> None:
    rep = replay_matches_plain(tmp_path, ACCUMULATE, WEIGHT_PROBE, env=EVERY)
    assert "autograd graph" in rep.err
    assert _states(tmp_path) == {"executed": 4}


MICRO_STEPS = (
    PRELUDE
    + """
for it in range(4):
    for micro in range(4):
        x, y = train[micro]
        with torch.enable_grad():
            loss = ((model(x) - y) ** 2).mean()
            loss = loss / 4
        loss.backward()
    with torch.no_grad():
        model.weight.sub_(0.05 * model.weight.grad)
        model.bias.sub_(0.05 * model.bias.grad)
    model.zero_grad()
    lossf = loss.item() * 4
    #PROBE
    print(it, f"{lossf:.6f}")
"""
)


def test_graph_carrying_name_read_only_as_a_value_is_memoized(tmp_path: Path) -> None:
    """nanoGPT's micro-step loop: ``loss`` leaves the loop with its graph but is only read through
    ``.item()`` afterwards, and is assigned before any read in the loop, so the detached value is
    all anything can observe."""
    replay_matches_plain(tmp_path, MICRO_STEPS, WEIGHT_PROBE, env=EVERY)
    assert _states(tmp_path) == {"skipped": 4}


# -- names bound only in a branch the run never takes ------------------------------------------------
UNTAKEN = (
    PRELUDE
    + """
ddp = False
use_other = False
for it in range(4):
    for micro in range(4):
        if ddp:
            model.require_backward_grad_sync = micro == 3
        if use_other:
            other = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = train[micro]
        ((model(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        model.weight.sub_(0.05 * model.weight.grad)
        model.bias.sub_(0.05 * model.bias.grad)
    model.zero_grad()
    #PROBE
    print(it, "other" in globals(), hasattr(model, "require_backward_grad_sync"))
if use_other:
    print(other)
"""
)


def test_names_bound_only_in_untaken_branches_are_restored_absent(tmp_path: Path) -> None:
    rep = replay_matches_plain(tmp_path, UNTAKEN, WEIGHT_PROBE, env=EVERY)
    assert _states(tmp_path, "record") == {"checkpointed": 4}
    assert _states(tmp_path) == {"skipped": 4}, rep.err


# -- numpy scalars and dtypes are immutable values ---------------------------------------------------
NUMPY_VALUES = """\
import numpy as np

np.random.seed(0)
w = np.zeros(4)
train = [(np.random.randn(8, 4), np.random.randn(8)) for _ in range(4)]
stats = {"count": np.int64(0), "dtype": np.dtype("float32"), "history": []}
for epoch in range(3):
    for x, y in train:
        err = x @ w - y
        loss = (err**2).mean()
        w -= 0.05 * 2 * x.T @ err / len(y)
        stats["count"] += np.int64(1)
        stats["history"].append(np.float32(loss))
    #PROBE
    print(epoch, stats["count"], repr(stats["history"][-1]), stats["dtype"])
"""


def test_numpy_scalars_and_dtypes_are_captured_as_values(tmp_path: Path) -> None:
    replay_matches_plain(tmp_path, NUMPY_VALUES, 'print("PROBE", w.round(8).tolist())', env=EVERY)
    assert _states(tmp_path) == {"skipped": 3}


def test_probe_printing_a_detached_checkpointed_tensor_executes_its_loop(tmp_path: Path) -> None:
    """``print(loss)`` shows ``grad_fn=``: the checkpoint's detached ``loss`` cannot print that,
    so the planner runs the loop for such a probe."""
    rep = replay_matches_plain(tmp_path, MICRO_STEPS, 'print("PROBE", loss)', env=EVERY)
    assert "as a tensor" in rep.err
    assert _states(tmp_path) == {"executed": 4}


# -- the main loop is the loop that trains ------------------------------------------------------------
FORWARD_FORWARD = """\
import torch

torch.manual_seed(0)


class Layer(torch.nn.Linear):
    def train_layer(self, x_pos, x_neg):
        for i in range(4):
            g_pos = torch.relu(self(x_pos)).pow(2).mean(1)
            g_neg = torch.relu(self(x_neg)).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([2.0 - g_pos, g_neg - 2.0]))).mean()
            self.zero_grad()
            loss.backward()
            with torch.no_grad():
                self.weight.sub_(0.03 * self.weight.grad)
                self.bias.sub_(0.03 * self.bias.grad)
            #PROBE
        return torch.relu(self(x_pos)).detach(), torch.relu(self(x_neg)).detach()


class Net:
    def __init__(self, dims):
        self.layers = [Layer(dims[d], dims[d + 1]) for d in range(len(dims) - 1)]

    def predict(self, x):
        scores = []
        for label in range(3):
            h = x + label
            for layer in self.layers:
                h = torch.relu(layer(h))
            scores.append(h.pow(2).mean(1, keepdim=True))
        return torch.cat(scores, 1).argmax(1)

    def train(self, x_pos, x_neg):
        for layer in self.layers:
            x_pos, x_neg = layer.train_layer(x_pos, x_neg)


net = Net([6, 8, 8])
x = torch.randn(16, 6)
net.train(x, x.flip(0))
print(net.predict(x).tolist())
"""


def test_the_training_loop_not_the_inference_nest_is_the_main_loop(tmp_path: Path) -> None:
    replay_matches_plain(
        tmp_path, FORWARD_FORWARD, 'print("PROBE", i, f"{loss.item():.8f}")', env=EVERY
    )
    explain = flortrain(tmp_path, "instrument", "--explain", "train.py")
    first = explain.out.splitlines()[0]
    assert first.startswith(
        "train.py:8:9 main loop M8 (for) in Layer.train_layer: its body is the training step"
    )
    assert (
        "train.py:27:9 loop in Net.predict not memoized: not a main loop: it does not train"
        in explain.out
    )


ALIASING_LIST = (
    PRELUDE
    + """\
snaps = []
for epoch in range(4):
    for i, (x, y) in enumerate(train):
        loss = ((model(x) - y) ** 2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(0.05 * param.grad)
        if i == 0:
            snaps.append(model.weight.detach())   # no clone: follows the live parameter
    #PROBE
    print(f"epoch {epoch} {loss.item():.6f} {snaps[0].sum().item():.6f}")
print("same storage", all(s.data_ptr() == model.weight.data_ptr() for s in snaps))
"""
)


def test_a_container_of_views_of_a_parameter_is_not_restored_as_copies(tmp_path: Path) -> None:
    """``snaps.append(model.weight.detach())`` inside the loop. A checkpoint holding ``snaps``
    by value would leave, in a skipped instance, copies that no longer follow training (the last
    line would read False). Such an instance is not memoized, and record says why."""
    rec, rep = record_and_replay_match_plain(
        tmp_path, ALIASING_LIST, 'print(f"PROBE {epoch} {snaps[-1].sum().item():.6f}")', EVERY
    )
    assert "same storage True" in rep.out, rep.out
    assert "`snaps[0]` shares memory with a model parameter" in rec.err, rec.err


PERSISTENT_WORKERS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2, persistent_workers=PERSISTENT)
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(0.05 * param.grad)
    print(f"epoch {epoch} {loss.item():.6f}")
"""


def test_a_loader_whose_workers_outlive_an_epoch_is_named_at_record(tmp_path: Path) -> None:
    """Persistent workers carry their random streams across epochs, where no checkpoint
    reaches; a replay that runs an epoch after restoring one draws different data (``diff``
    catches it). Record says so, once, and only for such a loader."""
    (tmp_path / "train.py").write_text(PERSISTENT_WORKERS.replace("PERSISTENT", "True"))
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.code == 0, rec.err
    assert (
        rec.err.count("with persistent_workers=True: its workers' random streams carry over") == 1
    ), rec.err
    (tmp_path / "train.py").write_text(PERSISTENT_WORKERS.replace("PERSISTENT", "False"))
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.code == 0 and "persistent_workers" not in rec.err, rec.err


RESTORE_PRELUDE = """\
import collections
import numpy as np
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
x = torch.randn(64, 4)
y = torch.randint(0, 2, (64,))
"""

#: a classifier's epoch of 8 steps, SGD by hand
STEPS = """\
    for step in range(8):
        xb, yb = x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8]
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(0.1 * param.grad)
"""

#: the same epoch stepped by ``torch.optim.SGD``, for a shape about the optimizer
OPT_PRELUDE = RESTORE_PRELUDE + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
OPT_STEPS = """\
    for step in range(8):
        xb, yb = x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
"""

#: a linear fit in plain Python (``w`` a list, ``loss`` a float, ``yb`` a list of 0s and 1s),
#: for a shape whose state is Python values
PY_PRELUDE = """\
import collections
import random

random.seed(0)
w = [0.0] * 4
x = [[random.gauss(0, 1) for _ in range(4)] for _ in range(64)]
y = [random.randrange(2) for _ in range(64)]
"""
PY_STEPS = """\
    for step in range(8):
        xb, yb = x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8]
        err = [sum(wi * xi for wi, xi in zip(w, row)) - t for row, t in zip(xb, yb)]
        loss = sum(e * e for e in err) / len(err)
        w = [wi - 0.1 * sum(e * row[i] for e, row in zip(err, xb)) / len(err) for i, wi in enumerate(w)]
"""

#: a step loop's set-up, its epoch of steps, and how the epoch's printout reads ``loss``
HAND = (RESTORE_PRELUDE, STEPS, "loss.item()")
OPTIMIZER = (OPT_PRELUDE, OPT_STEPS, "loss.item()")
PLAIN = (PY_PRELUDE, PY_STEPS, "loss")

#: A probe every fourth epoch, at its start: a replay jumps over the main loop's iterations
#: between probes, and skips the probed epochs' inner loops.
JUMP_GUARD = """\
    if epoch % 4 == 3:
        #PROBE
        pass
"""


def _restore_case(
    setup: str,
    body: str,
    *,
    epochs: int = 4,
    jump: bool = False,
    after: str = "",
    frame: tuple[str, str, str] = HAND,
) -> str:
    """A script with ``frame``'s SGD loop over ``epochs`` epochs of 8 steps, ``body`` at the end of
    each step (8 spaces) or epoch (4 spaces): probed at every epoch's end, or, with ``jump``, at
    the start of every fourth (:data:`JUMP_GUARD`); ``after`` follows the loop."""
    prelude, steps, loss = frame
    head = f"for epoch in range({epochs}):\n" + (JUMP_GUARD if jump else "")
    tail = "" if jump else '    #PROBE\n    print(f"epoch {epoch} {' + loss + ':.6f}")\n'
    return prelude + setup + head + steps + body + "\n" + tail + after


def test_a_slot_that_held_none_before_the_loop_is_restored_with_the_loops_dict(
    tmp_path: Path,
) -> None:
    """Restoring a dict into a slot that held None must not crash the replay with a TypeError
    in the user's line."""
    text = _restore_case(
        'log = {"best": None, "n": 0}\n',
        '        log["n"] += 1\n'
        '        if log["best"] is None or loss < log["best"]["loss"]:\n'
        '            log["best"] = {"step": step, "loss": round(loss, 6)}',
        frame=PLAIN,
    )
    rep = replay_matches_plain(tmp_path, text, 'print("PROBE", epoch, log)', EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_dicts_key_order_and_an_arrays_dtype_are_restored_as_recorded(tmp_path: Path) -> None:
    """The restore must not keep the live key order (losing ``move_to_end`` inside the loop)
    nor cast a float result into the int array the slot held before."""
    text = _restore_case(
        "import numpy as np\n"
        'recent = collections.OrderedDict((k, 0.0) for k in range(3))\narrs = {"m": np.zeros(3, dtype=np.int64)}\n',
        "        k = sum(yb) % 3\n"
        "        recent[k] = round(loss, 4)\n"
        "        recent.move_to_end(k)\n"
        '        arrs["m"] = arrs["m"] + 0.5',
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, list(recent), arrs["m"].tolist(), arrs["m"].dtype)'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_namedtuples_and_counters_come_back_with_their_types(tmp_path: Path) -> None:
    """Restored from a list the loop appends to, a namedtuple comes back a namedtuple, not a
    plain tuple, and a ``Counter`` rebound in the loop a ``Counter``, not a dict."""
    text = _restore_case(
        'Rec = collections.namedtuple("Rec", "epoch loss")\nhist = []\ncounts = collections.Counter()\n',
        "        hist.append(Rec(epoch, round(loss, 6)))\n"
        "        counts = counts + collections.Counter(yb)",
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, type(hist[-1]).__name__, hist[-1].loss, type(counts).__name__, counts.most_common(1))'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


# -- identity: objects the loop replaced, and objects held in two places ---------------------------
def test_an_object_the_loop_replaced_is_made_anew_and_its_other_names_keep_the_old_one(
    tmp_path: Path,
) -> None:
    """``tracker["best"] = Best(..)`` puts a new object in the dict; ``initial`` still names the
    old one. Writing the new state into the old object would change ``initial`` on replay, with
    ``diff`` passing. Likewise a list slot holding a view of ``base``: writing into it would
    change ``base``."""
    text = _restore_case(
        "import dataclasses\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class Best:\n"
        "    step: int\n"
        "    loss: float\n"
        'tracker = {"best": Best(-1, 99.0)}\n'
        'initial = tracker["best"]\n'
        "base = torch.zeros(6)\n"
        "bufs = [base[:3], base[3:]]\n"
        "first = bufs[0]\n",
        '        if loss.item() < tracker["best"].loss:\n'
        '            tracker["best"] = Best(step, round(loss.item(), 6))\n'
        "        bufs[0] = model.weight.detach()[0, :3] * 1.0",
    )
    probe = 'print("PROBE", epoch, initial, tracker["best"], initial is tracker["best"], base.tolist(), first.tolist(), bufs[0].tolist())'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_one_object_in_two_containers_and_a_name_is_one_object_after_a_restore(
    tmp_path: Path,
) -> None:
    """``rows.append(row); by_step[k] = row; last = row``: the restore must rebuild ``by_step``
    (not fail with "cannot rebuild a ref") and give ``last`` the same row, not a copy, so that
    ``last["end"] = True`` after the loop reaches ``rows[-1]``."""
    text = _restore_case(
        "rows = []\nby_step = {}\nlast = None\n",
        '        row = {"step": step, "loss": round(loss, 6)}\n'
        "        rows.append(row)\n"
        "        by_step[(epoch, step)] = row\n"
        "        last = row\n"
        '    last["end"] = True',
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, len(rows), last is rows[-1], rows[-1] is by_step[(epoch, 7)], sum("end" in r for r in rows))'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_rebound_trained_leaf_still_requires_grad_after_a_restore(tmp_path: Path) -> None:
    """``w = (w - lr * w.grad).detach().requires_grad_()`` comes back a tensor that requires
    grad, and a rebound ``nn.Parameter`` a Parameter, not a plain tensor."""
    text = _restore_case(
        "w = torch.zeros(4, 2, requires_grad=True)\np = torch.nn.Parameter(torch.zeros(2))\n",
        "        l2 = torch.nn.functional.cross_entropy(xb @ w + p, yb)\n"
        "        l2.backward()\n"
        "        w = (w - 0.5 * w.grad).detach().requires_grad_()\n"
        "        p = torch.nn.Parameter(p.detach() - 0.5 * p.grad)",
    )
    probe = 'print("PROBE", epoch, w.requires_grad, w.is_leaf, type(p).__name__, p.requires_grad, round(w.sum().item(), 6))'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_jump_over_iterations_makes_anew_what_they_replaced(tmp_path: Path) -> None:
    """A replay that jumps from iteration 0 to a later boundary must not restore the replaced
    ``tracker["best"]`` into the object ``initial`` names."""
    text = _restore_case(
        "class Box:\n"
        "    def __init__(self, v):\n"
        "        self.v = v\n"
        'tracker = {"best": Box(99.0)}\n'
        'initial = tracker["best"]\n',
        '    if loss < tracker["best"].v:\n        tracker["best"] = Box(round(loss, 6))',
        epochs=10,
        jump=True,
        after='print("w", round(sum(w), 6))\n',
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, initial.v, tracker["best"].v, initial is tracker["best"])'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "main-loop iterations jumped over" in rep.err, rep.err


def test_rebound_views_of_one_tensor_stay_views_and_keep_their_strides(tmp_path: Path) -> None:
    """``flat = torch.cat(..)`` and ``head = flat[:3]`` rebound in the loop come back views of
    one tensor, not separate copies, so ``flat.mul_(2)`` after the loop reaches ``head``;
    ``wt = (..).t()`` keeps its strides."""
    text = _restore_case(
        "flat = torch.zeros(10)\nhead = flat[:3]\nwt = torch.zeros(4, 8).t()\n",
        "        flat = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "        head = flat[:3]\n"
        "        wt = (xb * 2).t()\n"
        "    flat.mul_(2)\n"
        "    keep = [head, wt]",
    )
    probe = 'print("PROBE", epoch, [round(v, 6) for v in head.tolist()], wt.is_contiguous(), wt.stride())'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_file_read_line_by_line_in_the_loop_continues_where_the_record_left_it(
    tmp_path: Path,
) -> None:
    """``f.readline()`` inside the loop: a skipped instance that left the file at the prologue's
    position would make the next executed instance read the first lines again. The checkpoint
    holds the position of a file open for reading."""
    (tmp_path / "data.csv").write_text(
        "".join(f"{i % 7 * 0.1:.1f},{i % 3 * 0.5:.1f},1.0,2.0\n" for i in range(64))
    )
    text = _restore_case(
        'f = open("data.csv")\n',
        "        vals = [float(v) for v in f.readline().split(',')]",
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, f.tell())'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_name_for_an_optimizer_group_still_drives_the_optimizer_after_a_restore(
    tmp_path: Path,
) -> None:
    """``group = opt.param_groups[0]`` before the loop, ``group["lr"] *= 0.5`` after each epoch:
    ``load_state_dict`` makes new group dicts, so after a plain restore the decay would change a
    dict the optimizer no longer reads."""
    text = _restore_case(
        "group = opt.param_groups[0]\ngroups = opt.param_groups\n",
        '    group["lr"] *= 0.5',
        frame=OPTIMIZER,
    )
    probe = (
        'print("PROBE", epoch, opt.param_groups[0]["lr"], group["lr"], groups is opt.param_groups)'
    )
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_name_updated_in_place_still_shares_its_object_after_a_restore_or_a_jump(
    tmp_path: Path,
) -> None:
    """``gsum = buffers["gsum"]`` before the loop, ``gsum += g`` in it: ``+=`` on an array or a
    list keeps the object, which ``buffers`` shares. Stored by value and rebound, the name would
    leave ``buffers["gsum"]`` behind after a restore. Probed every fourth
    epoch, the replay both jumps over iterations and skips the probed epochs' inner loops."""
    text = _restore_case(
        'buffers = {"gsum": np.zeros(4), "log": [], "t": torch.zeros(2)}\n'
        'gsum, log, t = buffers["gsum"], buffers["log"], buffers["t"]\n',
        "        gsum += model.weight.grad.numpy()[0]\n"
        "        log += [round(loss.item(), 6)]\n"
        "        t += model.bias.detach()",
        epochs=10,
        jump=True,
        after='print("w", round(model.weight.sum().item(), 6))\n',
    )
    probe = (
        'print("PROBE", epoch, buffers["gsum"].round(5).tolist(), len(buffers["log"]), gsum is buffers["gsum"],'
        ' log is buffers["log"], buffers["t"].tolist(), t is buffers["t"])'
    )
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "3 block instances skipped, 0 executed, 7 main-loop iterations jumped over" in rep.err, (
        rep.err
    )


def test_a_rebound_name_holding_rows_the_state_holds_gives_back_those_rows(tmp_path: Path) -> None:
    """``top = sorted(top + [row])[:3]`` and ``last = (epoch, row)`` over rows ``history`` holds:
    stored by value, the names would come back holding copies, and ``r["in_top"] += 1`` after
    the loop would not reach ``history``. Jumps and skipped instances both."""
    text = _restore_case(
        "history = []\ntop = []\nlast = None\n",
        '        row = {"e": epoch, "s": step, "loss": round(loss, 4)}\n'
        "        history.append(row)\n"
        '        top = sorted(top + [row], key=lambda r: r["loss"])[:3]\n'
        "        last = (epoch, row)\n"
        "    for r in top:\n"
        '        r["in_top"] = r.get("in_top", 0) + 1\n'
        '    last[1]["last"] = True',
        epochs=8,
        jump=True,
        after='print("top", [(h["e"], h["s"], h.get("in_top"), h.get("last")) for h in history if len(h) > 3])\n',
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, [(h["e"], h["s"], h.get("in_top"), h.get("last")) for h in history if len(h) > 3])'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "main-loop iterations jumped over" in rep.err and "0 executed" in rep.err, rep.err


def test_a_view_the_loop_replaces_is_not_written_into_when_its_address_is_reused(
    tmp_path: Path,
) -> None:
    """``bufs = [table[epoch], ...]`` each epoch, replaced out of place in the loop: CPython can
    put the new tensor at the freed view's address, and a slot judged by address would read as
    kept, so the restore would write into the view, and so into ``table``. Whether an address is
    reused depends on every allocation of the step: this one steps with ``torch.optim.SGD``."""
    text = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "X, Y = torch.randn(64, 4), torch.randn(64, 2)\n"
        "table = torch.zeros(8, 2)\n"
        "for epoch in range(6):\n"
        "    bufs = [table[epoch], table[epoch + 1]]\n"
        "    for i in range(8):\n"
        "        xb, yb = X[i * 8:(i + 1) * 8], Y[i * 8:(i + 1) * 8]\n"
        "        loss = ((model(xb) - yb) ** 2).mean()\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        bufs[0] = bufs[0] * 0.9 + model.bias.detach()\n"
        "        bufs[1] = bufs[1] * 0.5 + model.bias.detach()\n"
        "    #PROBE\n"
        'print("bufs", [round(v, 4) for v in bufs[0].tolist()])\n'
    )
    probe = 'print("PROBE", epoch, round(float(table.abs().sum()), 4))'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "6 block instances skipped, 0 executed" in rep.err, rep.err


EMA = (
    "ema = [p.detach().clone() for p in model.parameters()]\n",
    "        with torch.no_grad():\n"
    "            for e, p in zip(ema, model.parameters()):\n"
    "                e.mul_(0.9).add_(p, alpha=0.1)",
)
EMA_PROBE = 'print("PROBE", epoch, round(sum(e.sum().item() for e in ema), 6), p is model.bias, round(p.sum().item(), 6))'


def test_a_loop_variable_left_on_a_model_parameter_is_memoized_as_that_parameter(
    tmp_path: Path,
) -> None:
    """``for e, p in zip(ema, model.parameters())`` leaves ``p`` on the model's last parameter:
    refusing the loop ("`p` shares memory with a model parameter") would refuse every loop
    keeping an EMA this way. A rebound name holding a live module's own tensor is restored as
    that tensor, after the module's restore. (The script reads ``p`` after the loop: a name
    nothing reads there is not in the changeset, and a probe reading it executes the loop.)"""
    text = _restore_case(*EMA, after='print("last", p is model.bias, p.requires_grad)\n')
    rep = replay_matches_plain(tmp_path, text, EMA_PROBE, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_loop_variable_left_on_a_model_parameter_survives_a_jump(tmp_path: Path) -> None:
    text = _restore_case(
        *EMA, epochs=10, jump=True, after='print("last", p is model.bias, p.requires_grad)\n'
    )
    rep = replay_matches_plain(tmp_path, text, EMA_PROBE, EVERY)
    assert "3 block instances skipped, 0 executed, 7 main-loop iterations jumped over" in rep.err, (
        rep.err
    )


def test_modules_imported_inside_the_loop_keep_its_checkpoints(tmp_path: Path) -> None:
    """``import sys as _s`` in the epoch body and ``import math`` in the step loop rebind names to
    modules: stored by value they cannot be pickled, and walking ``sys`` reaches
    ``ctypes.cdll``, whose ``hasattr`` raises ``OSError``; either way every boundary would fail.
    A module is bound again by name on restore."""
    text = _restore_case(
        "",
        "        import math\n"
        "        loss = loss * math.sqrt(1.0)\n"
        "    import sys as _s\n"
        '    _s.stdout.write("tick\\n")',
        epochs=10,
        jump=True,
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, round(sum(w), 6), _s.__name__)'
    rec, rep = record_and_replay_match_plain(tmp_path, text, probe, EVERY)
    assert "7 main-loop iterations jumped over" in rep.err, rep.err
    assert "not checkpointed" not in rec.err, rec.err


def test_a_module_inside_a_container_the_loop_rebinds_is_kept_by_name(tmp_path: Path) -> None:
    """``cfg = {"lib": math, ...}`` rebound in the step loop, and ``log`` (changed in place)
    holding ``math`` too: a dict with a module in it cannot be pickled, and a capture walking the
    module would leave no instance checkpointed. A library module is stored by name; the replay
    gives back the very module."""
    text = _restore_case(
        'import math\nimport numpy as np\ncfg = {"lib": math, "scale": 1.0}\nlog = []\n',
        '        loss = loss * cfg["lib"].sqrt(cfg["scale"])\n'
        '        cfg = {"lib": math, "scale": cfg["scale"] + 1.0, "all": [math, np]}\n'
        "        log.append((step, math))",
        after='print("same", cfg["lib"] is math, cfg["all"][1] is np, log[-1][1] is math)\n',
        frame=PLAIN,
    )
    probe = 'print("PROBE", epoch, cfg["scale"], cfg["lib"] is math, cfg["all"][1] is np, len(log), log[-1][1] is math)'
    rep = replay_matches_plain(tmp_path, text, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


# -- a method called on a builtin type: `int.from_bytes(..)`, `dict.fromkeys(..)` -------------------
BUILTIN_METHODS = """\
import random
random.seed(0)
w = 0.0
for epoch in range(3):
    for i in range(4):
        w += random.random()
        tag = int.from_bytes(bytes([i]), "big") + len(dict.fromkeys("ab"))
    #PROBE
    print(epoch, round(w, 9), tag)
"""


def test_a_builtin_types_method_leaves_the_loop_memoized(tmp_path: Path) -> None:
    """Python refuses to set an attribute of a builtin type, so a call through one changes
    nothing: the loop's changeset holds what it binds, not ``int`` or ``dict``, whose capture
    would fail every checkpoint. Every instance is checkpointed and the replay skips them all."""
    rec, _ = record_and_replay_match_plain(
        tmp_path, BUILTIN_METHODS, 'print("PROBE", epoch, w, tag)', EVERY
    )
    assert "3 of 3 block instances checkpointed" in rec.err, rec.err
    assert _states(tmp_path) == {"skipped": 3}


# -- classmethods and staticmethods, through the class and through an instance ---------------------
CLASS_METHODS = """\
import random
random.seed(0)
class Tally:
    count = 0
    seen = []
    @classmethod
    def bump(cls, v):
        cls.count += 1
        cls.seen.append(v)
        return v
    @classmethod
    def scaled(cls, v):
        return 2 * v
    @staticmethod
    def keep(acc, v):
        acc.append(v)
tally = Tally()
acc = []
w = 0.0
for epoch in range(3):
    for i in range(4):
        w += Tally.scaled(random.random())
        Tally.bump(i)
        tally.bump(-i)
        tally.keep(acc, i)
    #PROBE
    print(epoch, round(w, 9), Tally.count, len(acc))
"""


def test_classmethods_and_staticmethods_are_mapped_onto_what_they_change(tmp_path: Path) -> None:
    """A classmethod's ``cls`` is its class, called through the class or an instance; a
    staticmethod's parameters are its arguments. So the loop's changeset holds ``Tally.count``,
    ``Tally.seen`` and ``acc`` (not the class object, which cannot be captured, nor ``tally``),
    every instance is checkpointed, and the replay that skips them all restores the class's
    attributes."""
    rec, _ = record_and_replay_match_plain(
        tmp_path,
        CLASS_METHODS,
        'print("PROBE", epoch, w, Tally.count, Tally.seen[-3:], acc[-3:])',
        EVERY,
    )
    assert "3 of 3 block instances checkpointed" in rec.err, rec.err
    assert "changes `" not in rec.err, rec.err  # no change the changeset missed
    assert _states(tmp_path) == {"skipped": 3}


# -- changes made through a comprehension's variable, or through a builtin type's method -----------
COMPREHENSION_VIEWS = """\
import random
random.seed(0)
class Meter:
    def __init__(self):
        self.total = 0.0
    def update(self, v):
        self.total += v
meters = [Meter(), Meter()]
acc = []
for epoch in range(3):
    for i in range(4):
        v = random.random()
        [m.update(v * k) for k, m in enumerate(meters)]
        list.append(acc, round(v, 6))
    #PROBE
    print(epoch, [round(m.total, 9) for m in meters], len(acc))
"""


def test_changes_through_a_comprehension_variable_are_charged_to_what_it_iterates(
    tmp_path: Path,
) -> None:
    """``[m.update(v) for m in meters]`` changes ``meters`` (its elements), and ``list.append(acc,
    v)`` changes ``acc``: the changeset holds both, so no change is found only at run time (which
    would stop the loop's checkpoints), every instance is checkpointed, and the replay that
    skips them all prints what a plain run prints."""
    rec, _ = record_and_replay_match_plain(
        tmp_path,
        COMPREHENSION_VIEWS,
        'print("PROBE", epoch, [m.total for m in meters], acc[-2:])',
        EVERY,
    )
    assert "3 of 3 block instances checkpointed" in rec.err, rec.err
    assert "changes `" not in rec.err, rec.err
    assert _states(tmp_path) == {"skipped": 3}
