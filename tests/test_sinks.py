"""Output channels: where a script writes (a logger, an open log file, a csv writer, a tracker
holding a file) are not training state. A loop that writes to them stays memoized; a capture
that fails names the object and its type.

The scripts train by hand, or in plain Python where no torch state is involved: a torch.optim
optimizer imports torch._dynamo, about a CPU-second a process."""

from __future__ import annotations

import csv
import io
import logging
import pickle
import sys
import threading
from pathlib import Path

import pytest

from flortrain.checkpoint import capture, kinds, restore
from flortrain.runtime.checkpointable import Logger, _rebound_channel
from flortrain.static.plan import Restore
from tests.protocol import (
    block_states,
    flortrain,
    latest_run,
    plain,
    record_and_replay_match_plain,
)
from tests.test_changeset import check

P = Restore.IN_PLACE
R = Restore.REBOUND

EVERY = {"FLORTRAIN_PERIOD": "every"}

#: the toy script's model and batches, trained by hand, and the channels a training script
#: writes to
SINKS = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
train = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]

import csv
import logging
import sys

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(message)s")
log = logging.getLogger("train")
log.addHandler(logging.FileHandler("train.log", mode="w"))


class Tracker:
    def __init__(self, path):
        self.out = open(path, "w")
        self.seen = 0

    def batch(self, loss):
        self.seen += 1
        self.out.write(f"{self.seen} {loss:.6f}\\n")


f = open("log.txt", "w")
rows = csv.writer(open("metrics.csv", "w", newline=""))
tracker = Tracker("batches.txt")
for epoch in range(3):
    total = 0.0
    for i, (x, y) in enumerate(train):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
        model.zero_grad()
        total += loss.item()
        f.write(f"{epoch} {i} {loss.item():.6f}\\n")
        print(epoch, i, file=f)
        rows.writerow([epoch, i, f"{loss.item():.6f}"])
        tracker.batch(loss.item())
        log.info("batch %d %.6f", i, loss.item())
    log.info("epoch %d loss %.6f", epoch, total)
    #PROBE
    print(epoch, f"{total:.6f}", tracker.seen)
f.close()
"""


def test_a_loop_writing_to_loggers_files_and_csv_stays_memoized(tmp_path: Path) -> None:
    probe = (
        'print("PROBE", epoch, f"{model.weight.sum().item():.8f}", tracker.seen, f"{total:.6f}")'
    )
    rec, rep = record_and_replay_match_plain(tmp_path, SINKS, probe, EVERY)
    assert "cannot capture" not in rec.err and "not checkpointed" not in rec.err, rec.err
    assert "in place through code" not in rec.err, rec.err
    store = tmp_path / ".flortrain"
    assert block_states(store, 1) == {"checkpointed": 3}, rec.err
    assert block_states(store, int(latest_run(tmp_path)["id"])) == {"skipped": 3}, rep.err  # type: ignore[call-overload]
    # a skipped instance writes to its channels what it writes to stdout: nothing; the plan says so
    assert "train batch" in rec.out and "train batch" not in rep.out, rep.out
    channels = "`f` (file), `rows` (csv), `tracker.out` (file), `log` (logger)"
    assert f"a skipped instance writes nothing to {channels}, as it prints nothing" in rep.err, (
        rep.err
    )


class Holder:
    def __init__(self) -> None:
        self.n = 0
        self.guard = {"lock": threading.Lock()}


def test_a_capture_that_fails_names_the_object_and_its_type() -> None:
    with pytest.raises(kinds.Unrestorable) as e:
        capture.capture_named("stats", Holder(), {})
    assert str(e.value) == (
        f"cannot capture `stats` ({Holder.__module__}.Holder): holds a _thread.lock at `stats.guard['lock']`"
    )
    with pytest.raises(kinds.Unrestorable) as e:
        capture.capture_named("lock", threading.Lock(), {})
    assert str(e.value).startswith("cannot capture `lock` (_thread.lock): "), e.value


def test_a_state_pickle_refuses_is_named_by_what_holds_it() -> None:
    roots = {"cfg": {"a": [1, threading.Lock()]}, "n": 3}
    with pytest.raises(TypeError) as e:
        pickle.dumps(roots)
    assert capture.unpicklable(e.value, roots) == (
        "cannot capture `cfg` (dict): holds a _thread.lock at `cfg['a'][1]`, which cannot be pickled"
    )


#: a loop that binds a lock, in plain Python: what cannot be pickled is the lock, whatever trains
LOCK = """\
import threading

total = 0
for epoch in range(3):
    for i in range(4):
        total += epoch * i
        guard = threading.Lock()
    print(epoch, total, guard.locked())
"""


def test_a_record_names_the_object_it_cannot_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOCK)
    rec = flortrain(tmp_path, "record", "train.py", env=EVERY)
    assert rec.code == 0 and rec.out == plain(tmp_path / "train.py").out, rec.err
    assert (
        "not checkpointed: cannot capture `guard` (_thread.lock): it cannot be pickled" in rec.err
    ), rec.err


def test_channels_are_neither_captured_nor_replaced(tmp_path: Path) -> None:
    """A logger (whose manager holds every logger torch makes), a handler, a file open for
    writing, a csv writer: each is captured as a channel, and restoring leaves the live one, at
    the level it had (a loop may set it)."""
    log = logging.getLogger("tests.sinks")
    log.setLevel(logging.INFO)
    with open(tmp_path / "log.txt", "w") as out:
        sinks = {
            "log": log,
            "handler": logging.StreamHandler(sys.stdout),
            "file": out,
            "rows": csv.writer(io.StringIO()),
            "dict_rows": csv.DictWriter(io.StringIO(), ["a"]),
        }
        captured = capture.capture_named("sinks", sinks, {})
        kinds = {k: s["kind"] for k, s in captured["items"].items()}
        assert kinds == dict.fromkeys(sinks, "channel")
        before = dict(sinks)
        log.setLevel(logging.DEBUG)
        restore.restore_into(sinks, captured)
        assert all(sinks[k] is before[k] for k in sinks)
        assert log.level == logging.INFO


def test_a_library_module_held_by_an_object_is_named_not_walked() -> None:
    """``torch.ops`` (whose ``__file__`` is not a path) is torch's, like ``torch.nn``."""
    import torch

    captured = capture.capture_named("cfg", {"ops": torch.ops, "nn": torch.nn}, {})
    assert captured["items"]["ops"] == {"kind": "value", "value": torch.ops}


# -- statically: calls that only write to a channel change nothing ---------------------------------
OUTPUTS = [
    pytest.param(
        """
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter("runs")
        for epoch in range(3):
            for step, b in enumerate(loader):
                opt.step()
                writer.add_scalar("loss", b, step)
                writer.add_histogram("w", b, step)
            writer.flush()
        """,
        {("opt", P)},
        id="tensorboard",
    ),
    pytest.param(
        """
        from tqdm.auto import tqdm
        import wandb, mlflow
        run = wandb.init(project="p")
        pbar = tqdm(total=30)
        for epoch in range(3):
            for b in loader:
                opt.step()
                pbar.update(1)
                pbar.set_postfix(loss=b)
                run.log({"loss": b})
                wandb.log({"loss": b})
                mlflow.log_metric("loss", b)
        """,
        {("opt", P)},
        id="tqdm-wandb-mlflow",
    ),
    pytest.param(
        """
        import csv, logging
        log = logging.getLogger(__name__)

        def train(loader, opt):
            with open("log.txt", "a") as f:
                rows = csv.DictWriter(f, fieldnames=["loss"])
                rows.writeheader()
                for epoch in range(3):
                    for b in loader:
                        opt.step()
                        f.write(f"{b}\\n")
                        print(b, file=f)
                        rows.writerow({"loss": b})
                        log.info("loss %s", b)
        """,
        {("opt", P)},
        id="logging-file-csv-in-a-function",
    ),
    pytest.param(
        """
        from torch.utils.tensorboard import SummaryWriter

        class Trainer:
            def __init__(self):
                self.writer = SummaryWriter()

            def fit(self, loader, opt):
                for epoch in range(3):
                    for b in loader:
                        opt.step()
                        self.writer.add_scalar("loss", b)
        """,
        {("opt", P)},
        id="a-writer-held-by-self",
    ),
    pytest.param(
        """
        def main(loader, opt):
            import logging as lg
            from tqdm import trange
            log = lg.getLogger("train")
            bar = trange(30)
            for epoch in range(3):
                for b in loader:
                    opt.step()
                    bar.set_description(f"{b}")
                    log.warning("loss %s", b)
        """,
        {("opt", P)},
        id="imported-inside-the-function",
    ),
    # what is not certainly a channel stays with the rules
    pytest.param(
        """
        import logging
        from tqdm import tqdm
        class SummaryWriter:
            def add_scalar(self, *a):
                self.n = 1
        writer = SummaryWriter()
        log = make_logger()
        pbar = tqdm(total=3)
        f = open("state.txt", "r+")
        for epoch in range(3):
            pbar = other_bar()
            for b in loader:
                writer.add_scalar("loss", b)
                log.info("loss")
                pbar.update(1)
                f.write("x")
        """,
        {("writer.n", R), ("log", P), ("pbar", P), ("f", P)},
        id="not-channels",
    ),
]


@pytest.mark.parametrize(("src", "expected"), OUTPUTS)
def test_calls_that_only_write_to_a_channel_leave_the_changeset(
    src: str, expected: set[tuple[str, Restore]]
) -> None:
    check(src, expected)


def test_a_rebound_channel_is_named_and_a_logger_restored_by_name(tmp_path: Path) -> None:
    log = logging.getLogger("train")
    held = _rebound_channel("log", log)
    assert isinstance(held, Logger) and logging.getLogger(held.name) is log
    with open(tmp_path / "out.txt", "w") as f, pytest.raises(kinds.Unrestorable) as e:
        _rebound_channel("f", f)
    assert str(e.value).startswith(
        "cannot capture `f` (_io.TextIOWrapper): an output channel the loop binds"
    ), e.value
