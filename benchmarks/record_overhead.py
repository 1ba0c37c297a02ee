"""Record overhead on workloads of different shapes, adaptivity on and off (Flor Figure 6), and
the outer-probe replay it buys.

Workloads (generated, no downloads):
- ``cnn``: a small CNN with Adam, ~75 MB of checkpointed state, ~1 s epochs;
- ``finetune``: a 100 MB frozen embedding table, a tiny trained head, ~0.1 s epochs (60 of them):
  the shape is set by its epoch time, and its batches per epoch are calibrated to it in each
  run (:func:`calibrate`), since this VM's speed varies: the same 160 batches have taken from
  28 to 100 ms;
- ``rnn``: an LSTM language model on synthetic tokens.

For each, R repetitions interleave ``python S``, ``flortrain record S`` (adaptive period, the
default) and ``flortrain record S`` with ``FLORTRAIN_PERIOD=every`` (adaptivity off: a checkpoint
at every block instance and iteration boundary). The figures of each run:

- **training**: from the first line of the training loop to process exit, so it includes the
  materializer's final flush (the script writes its loop's start time to a file); it leaves out
  what does not grow with training (interpreter and torch start-up, flortrain's static pass);
- **loop**: the training loop alone (first line to last), where the background materializer
  runs; the difference to **training** is the final flush;
- **end to end**: the whole command's wall time;
- **cpu**: the CPU time of the whole command and every process it started (the writer
  included), start-up and static pass included;
- **held**: what ``flortrain record`` itself reports, the time its code held the training thread
  (staging, boundaries, the wait for the writer at exit) over the rest of the run, measured on
  the training thread. Wall-clock figures on a shared VM vary by ±15% between identical runs,
  more than the effects measured; this one is not a difference of two runs, so it resolves them;
- **exit wait**: the part of held spent at exit waiting for the checkpoint writer (the seconds
  record reports), the work of a writer training left no CPU.

Overhead is the median over repetitions of each recorded/plain pair's ratio, with the spread.
Repetitions take the modes' orders in turn (every permutation, then again), so that a run
that leaves the machine slower for the next one does not always slow the same mode.
The benchmark is its runs' subreaper: a recorded run's writer, which frees the staging pages
after the training process has exited, is waited for before the next run starts, its CPU counts
in **cpu**, and **settle** is how long it outlived the command.
For the CNN, an outer probe's replay is timed against a plain run of the probed script.

``--against COMMIT`` adds a fourth mode to every repetition: ``flortrain record`` as of that
commit (checked out in a temporary git worktree, put first on ``PYTHONPATH``), against the same
plain runs. Two versions compared this way differ by less than the noise between repetitions
on a shared VM would hide in separate runs; the result file says which commit it was.

``--bar`` runs only the pair the overhead bar compares (plain and adaptive record), so that
many more repetitions fit in the same time, and writes ``record_overhead-bar.json``; with
``--against COMMIT`` too, that commit's adaptive record joins each repetition. Every run
reports a 90% bootstrap interval for each workload's median overhead to exit and for the
median over workloads: on this VM single pairs spread by ±15%, and the interval says whether
the repetitions pin a figure down.

``--control`` adds ``plain-control`` to every repetition: a second plain run, compared with the
first exactly as a record is (an A/A control). Its median and interval are the noise floor of
the same runs: two identical code paths have measured +3.4% and +5.6% apart in one run.
With it, each record is also compared with both plain runs of its repetition (their geometric
mean, ``record_both``): a baseline of two runs at two positions of the order is less noisy than
one. ``--reanalyze FILE`` adds that figure to a result file written before it existed.

``--steady-allocator`` runs every mode with glibc malloc settings that keep freed memory
(:data:`STEADY_ALLOCATOR`): a plain run's page-fault churn, which a recorded run sometimes
escapes by accident, is then out of the comparison (see the constant).

``--epochs-times K`` runs each workload K times as long: what a record pays once (the wait
for the writer at exit, the first checkpoints) then weighs K times less, and what it pays per
epoch as much.

    python benchmarks/record_overhead.py [--quick] [--reps N] [--only NAME...] [--against COMMIT] [--bar]
                                         [--epochs-times K] [--steady-allocator] [--control]

Writes benchmarks/results/record_overhead.json and .png (``record_overhead-bar`` with
``--bar``, ``-quick`` added with ``--quick``); the options of the run are in the file.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import math
import os
import platform
import random
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"

_T0 = """\
import os, time
if os.environ.get("BENCH_T0"):
    with open(os.environ["BENCH_T0"], "w") as f:
        f.write(repr(time.time()))
"""

CNN = """\
import os, time, torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 3072)
        self.fc2 = nn.Linear(3072, 10)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.randn(STEPS * 32, 1, 28, 28)
labels = torch.randint(0, 10, (STEPS * 32,))
T0
for epoch in range(EPOCHS):
    model.train()
    for i in range(0, len(data), 32):
        loss = F.cross_entropy(model(data[i:i + 32]), labels[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
"""

FINETUNE = """\
import os, time, torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)
table = nn.Embedding(200_000, 128)          # 102 MB, frozen
table.weight.requires_grad_(False)
head = nn.Linear(128, 10)
opt = torch.optim.SGD(head.parameters(), lr=0.05)
ids = torch.randint(0, 200_000, (STEPS, 512))
labels = torch.randint(0, 10, (STEPS, 512))
T0
for epoch in range(EPOCHS):
    for i in range(STEPS):
        loss = F.cross_entropy(head(table(ids[i])), labels[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
"""

RNN = """\
import os, time, torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2000, 128)
        self.rnn = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.out = nn.Linear(256, 2000)
    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)
model = LM()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 2000, (STEPS * 16, 33))
T0
for epoch in range(EPOCHS):
    for i in range(0, len(tokens), 16):
        batch = tokens[i:i + 16]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 2000), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
"""

#: name: (source, steps per epoch, epochs, outer probe); quick mode halves the epochs. The
#: fine-tuning shape's steps are calibrated to :data:`EPOCH_S` (:func:`calibrate`); 160 is the
#: calibration's starting point.
WORKLOADS: dict[str, tuple[str, int, int, str]] = {
    "cnn": (CNN, 48, 12, 'print("PROBE", model.fc1.weight.norm().item())'),
    "finetune": (FINETUNE, 160, 60, 'print("PROBE", head.weight.norm().item())'),
    "rnn": (RNN, 12, 10, 'print("PROBE", model.out.weight.norm().item())'),
}
MODES = ("plain", "record", "record-every")
#: workloads whose steps per epoch are set so that a plain epoch takes this long, in seconds
EPOCH_S = {"finetune": 0.1}
#: steps per epoch :func:`calibrate` chose in this run
_calibrated: dict[str, int] = {}

#: ``--steady-allocator``: glibc malloc serves large blocks from its heap and keeps what is
#: freed, instead of mapping each large tensor afresh and unmapping it when freed. By default
#: the CNN's plain run takes ~400k page faults per epoch (fresh zeroed pages for every step's
#: gradients and activations), and they cost a third of its epoch (2.0 s against 1.25 s with
#: these settings). A recorded run sometimes skips most of them for a few
#: epochs, by accident of where its staging buffers sit in the heap, and then runs faster than
#: plain: its overhead came out negative. With both runs' allocator steady the comparison
#: holds what flortrain itself costs.
STEADY_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
#: ``--bar``: only the pair the overhead bar compares, so that more repetitions fit in the time
BAR_MODES = ("plain", "record")


_T1 = """\
if os.environ.get("BENCH_T0"):
    with open(os.environ["BENCH_T0"] + ".end", "w") as f:
        f.write(repr(time.time()))
"""


def source(
    name: str,
    quick: bool,
    probe: bool = False,
    times: int = 1,
    steps: int | None = None,
    epochs: int | None = None,
) -> str:
    """The workload's script; ``times`` multiplies its epochs (a longer run of the same shape).
    ``steps`` and ``epochs``, where given, replace the workload's own (and :func:`calibrate`'s)."""
    text, own_steps, own_epochs, stmt = WORKLOADS[name]
    steps = steps if steps is not None else _calibrated.get(name, own_steps)
    epochs = (epochs if epochs is not None else own_epochs) * times
    if quick:
        epochs //= 2
    text = (
        text.replace("STEPS", str(steps)).replace("EPOCHS", str(epochs)).replace("T0\n", _T0) + _T1
    )
    return text.replace("    #PROBE\n", f"    {stmt}\n" if probe else "")


_HELD = re.compile(r"flortrain held training up [0-9.]+s \(([0-9.]+)%\)")
_EXIT_WAIT = re.compile(r", ([0-9.]+)s of it at exit for the checkpoint writer(;|$)", re.M)
#: the launcher's wait for the writer once the training process had exited (``flortrain/process/launcher.py``)
_LATE = re.compile(r"; then ([0-9.]+)s for the checkpoint writer after training exited$", re.M)


#: ``<linux/prctl.h>``
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make this process the one an orphaned descendant is re-parented to (Linux ``prctl``).

    A recorded run's writer outlives the training process: it frees the staging pages once the
    parent has gone. Orphaned, it would belong to init, its CPU would count nowhere, and its
    exit would overlap the next run timed. As a subreaper the benchmark can wait for it
    (:func:`settle`), and ``RUSAGE_CHILDREN`` then counts it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def settle() -> float:
    """Wait for every descendant still running (see :func:`become_subreaper`); when the last
    one ended. Call it only when no child is waited for elsewhere."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return time.time()


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str]
) -> tuple[float, float, float, float, float, float, float]:
    """(training seconds to exit, end-to-end seconds, seconds in the training loop, CPU seconds
    of the whole command and every process it started, the writer included, the fraction of
    the run flortrain reports it held training up: 0 for a plain run, and the seconds from the
    command's exit until the last process it started had ended, and the seconds the run waited
    for the writer at its end: those of held, and those the launcher waited once the training
    process had exited, which held does not count)."""
    t0file = cwd / "t0"
    t0file.unlink(missing_ok=True)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    p = subprocess.run(
        cmd,
        cwd=cwd,
        env={**os.environ, **env, "BENCH_T0": str(t0file)},
        capture_output=True,
        text=True,
        check=False,
    )
    end = time.time()
    settled = settle()  # the writer's exit is this run's, not the next one's
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    t0 = float(t0file.read_text())
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    held = _HELD.search(p.stderr)
    loop = float((cwd / "t0.end").read_text()) - t0
    wait, late = _EXIT_WAIT.search(p.stderr), _LATE.search(p.stderr)
    return (
        end - t0,
        end - start,
        loop,
        cpu,
        float(held.group(1)) / 100 if held else 0.0,
        settled - end,
        (float(wait.group(1)) if wait else 0.0) + (float(late.group(1)) if late else 0.0),
    )


def calibrate(name: str, base_env: dict[str, str] | None = None) -> int:
    """Steps per epoch for a plain epoch of :data:`EPOCH_S` seconds of this workload, from plain
    runs of 4 short epochs, rounded to tens. The fastest of three runs counts: a slow moment of
    the VM would otherwise make the workload smaller, its epochs shorter than :data:`EPOCH_S`
    once the VM is fast again. (The 4 epochs include the first, which pays the cold start, so
    the steps chosen lean a little low.)"""
    steps = WORKLOADS[name][1]
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "train.py").write_text(source(name, quick=False, steps=steps, epochs=4))
        loop = min(_run([sys.executable, "train.py"], work, base_env or {})[2] for _ in range(3))
    chosen = max(10, round(EPOCH_S[name] / (loop / (4 * steps)) / 10) * 10)
    _calibrated[name] = chosen
    print(
        f"{name}: {loop / 4 * 1e3:.0f} ms for an epoch of {steps} steps; {chosen} steps make {EPOCH_S[name]} s",
        file=sys.stderr,
    )
    return chosen


def _record_rows(store: Path) -> tuple[tuple[int, int], int]:
    """(block instances checkpointed, block instances) of the latest record, and its main-loop
    boundary checkpoints (what a replay jumps to): one query of the store's rows by state."""
    db = sqlite3.connect(store / "flortrain.db")
    try:
        (rid,) = db.execute("SELECT MAX(id) FROM runs WHERE kind='record'").fetchone()
        rows = dict(
            db.execute(
                "SELECT state, COUNT(*) FROM blocks WHERE run_id=? GROUP BY state", (rid,)
            ).fetchall()
        )
    finally:
        db.close()
    boundaries = rows.pop("boundary", 0)
    return (rows.get("checkpointed", 0), sum(rows.values())), boundaries


def bench(
    name: str,
    reps: int,
    quick: bool,
    against: Path | None = None,
    bar: bool = False,
    epochs_times: int = 1,
    base_env: dict[str, str] | None = None,
    control: bool = False,
) -> dict[str, Any]:
    py = sys.executable
    base = BAR_MODES if bar else MODES
    modes = (*base, "record-against") if against is not None else base
    modes = (*modes, "plain-control") if control else modes
    times: dict[str, list[tuple[float, ...]]] = {
        m: [] for m in (*modes, *(() if bar else ("plain-probed", "replay")))
    }
    orders: list[list[str]] = []
    orders_of = list(itertools.permutations(modes))
    checkpointed: dict[str, tuple[int, int]] = {}
    boundaries: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        script = work / "train.py"
        for rep in range(reps):
            # a run can leave the machine slower for the next one (page cache, the kernel freeing
            # pages): repetitions take the modes' orders in turn, so that over as many
            # repetitions as there are orders every mode runs in every position equally often
            order = list(orders_of[rep % len(orders_of)])
            orders.append(order)
            for mode in order:
                script.write_text(source(name, quick, times=epochs_times))
                env = {**(base_env or {}), "FLORTRAIN_STORE": str(work / mode)}
                if mode == "record-every":
                    env["FLORTRAIN_PERIOD"] = "every"
                if mode == "record-against":
                    env["PYTHONPATH"] = str(against)
                plain = mode in ("plain", "plain-control")
                cmd = [py, "train.py"] if plain else [py, "-m", "flortrain", "record", "train.py"]
                times[mode].append(_run(cmd, work, env))
                if not plain:
                    checkpointed[mode], taken = _record_rows(work / mode)
                    boundaries.setdefault(mode, []).append(taken)
            if not bar:
                # what the record buys: an outer probe replayed, against re-running the probed script
                script.write_text(source(name, quick, probe=True, times=epochs_times))
                times["plain-probed"].append(_run([py, "train.py"], work, {}))
                times["replay"].append(
                    _run(
                        [py, "-m", "flortrain", "replay", "train.py"],
                        work,
                        {"FLORTRAIN_STORE": str(work / "record")},
                    )
                )
            print(
                f"{name} rep {rep} ({' '.join(order)}): "
                + ", ".join(
                    f"{m} {v[-1][0]:.2f}/{v[-1][1]:.2f}s{f' +{v[-1][5]:.2f}s' if v[-1][5] >= 0.005 else ''}"
                    for m, v in times.items()
                ),
                file=sys.stderr,
            )

    def ratios(mode: str, base: str, i: int) -> list[float]:
        return [a[i] / b[i] for a, b in zip(times[mode], times[base], strict=True)]

    out: dict[str, Any] = {
        "times": times,
        "checkpointed": checkpointed,
        "boundaries": boundaries,
        "orders": orders,
        "steps_per_epoch": _calibrated.get(name, WORKLOADS[name][1]),
    }
    for mode in modes[1:]:
        for i, what in ((2, "loop"), (0, "training"), (1, "end_to_end"), (3, "cpu")):
            out[f"{mode}_{what}_overhead"], out[f"{mode}_{what}_spread"] = median_spread(
                ratios(mode, "plain", i), 1
            )
        out[f"{mode}_held_overhead"], out[f"{mode}_held_spread"] = median_spread(
            [t[4] for t in times[mode]]
        )
        out[f"{mode}_settle"], out[f"{mode}_settle_spread"] = median_spread(
            [t[5] for t in times[mode]]
        )
        out[f"{mode}_exit_wait"], out[f"{mode}_exit_wait_spread"] = median_spread(
            [t[6] for t in times[mode]]
        )
    out["record_training_interval"] = interval([_pairs(out)])
    if control:
        out["plain-control_training_interval"] = interval([_pairs(out, "plain-control")])
        _both_summary(out)
    if not bar:
        out["replay_fraction"], out["replay_spread"] = median_spread(
            ratios("replay", "plain-probed", 1)
        )
    return out


def interval(ratios: list[list[float]], rounds: int = 10_000, level: float = 0.9) -> list[float]:
    """A percentile-bootstrap interval (90%) for the median over workloads of each workload's
    median overhead, given each workload's recorded/plain ratios (one workload: the interval of
    its median).

    Why: on this VM single pairs spread by ±15%, so a median of a few pairs can land on either
    side of a 2% bar by chance. The interval says how far the data pin the figure down: a bar
    is shown met only where the interval's upper end is under it. Seeded, so a result file
    is reproducible from its times."""
    return stratified_interval([ratios], rounds, level)


def stratified_interval(
    runs: list[list[list[float]]], rounds: int = 10_000, level: float = 0.9
) -> list[float]:
    """:func:`interval` over several runs' pairs pooled (``runs[k][w]``: run k's ratios of
    workload w, the workloads in the same order in every run). Each round resamples each run's
    pairs within that run and pools them, so a run keeps its weight (``bar_pool.py``); with one
    run it is :func:`interval`, draw for draw."""
    rng = random.Random(0)
    draws = sorted(
        statistics.median(
            statistics.median([x for run in runs for x in rng.choices(run[w], k=len(run[w]))])
            for w in range(len(runs[0]))
        )
        - 1
        for _ in range(rounds)
    )
    tail = (1 - level) / 2
    return [draws[int(tail * rounds)], draws[int((1 - tail) * rounds) - 1]]


def median_spread(values: list[float], less: float = 0.0) -> tuple[float, list[float]]:
    """The median of ``values`` and their [min, max], each less ``less`` (1 turns ratios into
    overheads)."""
    return statistics.median(values) - less, [min(values) - less, max(values) - less]


def commit() -> str:
    """The commit the benchmark runs (``+dirty`` when the tree has changes), so that a result
    file names the code it measured."""

    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False)
        return p.stdout.strip() if p.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def merge_by_workload(stem: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the workloads of ``results/<stem>.json`` that this run did not measure, when
    that file's run had the same settings: a benchmark keeps one result file, its latest figures
    per workload, and a run of one workload does not discard the others. Each workload's result
    names the commit it measured."""
    for r in doc["results"].values():
        r.setdefault("commit", commit())
    path = OUT / f"{stem}.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return doc
    same = {k: v for k, v in old.items() if k not in ("results", "commit")} == {
        k: v for k, v in doc.items() if k not in ("results", "commit")
    }
    if not same or not isinstance(old.get("results"), dict):
        return doc
    return {
        **doc,
        "results": {
            **{k: v for k, v in old["results"].items() if k not in doc["results"]},
            **doc["results"],
        },
    }


def save(stem: str, doc: dict[str, Any], plot: Callable[[Path], None], stamp: bool = True) -> None:
    """Write a benchmark's result as ``results/<stem>.json`` and its plot as ``.png``; ``stamp``:
    name the commit measured in it (a result computed from other results names theirs)."""
    OUT.mkdir(parents=True, exist_ok=True)
    if stamp:
        doc.setdefault("commit", commit())
    (OUT / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    plot(OUT / f"{stem}.png")


def workload_args(
    description: str, reps: int, extra: tuple[str, ...] = ()
) -> argparse.ArgumentParser:
    """The options every benchmark of these workloads takes; ``extra``: workloads of its own it
    also offers (not run by default)."""
    ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="half the epochs, one repetition")
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--only", nargs="*", default=list(WORKLOADS), choices=[*WORKLOADS, *extra])
    return ap


def main() -> None:
    ap = workload_args(__doc__ or "", 3)
    ap.add_argument(
        "--against", metavar="COMMIT", help="also record with flortrain as of COMMIT, interleaved"
    )
    ap.add_argument(
        "--bar",
        action="store_true",
        help="only plain and adaptive record, for more repetitions of the pair the bar compares"
        " (writes record_overhead-bar.json)",
    )
    ap.add_argument(
        "--epochs-times",
        type=int,
        default=1,
        metavar="K",
        help="K times each workload's epochs: a longer run, where what a record pays once"
        " (its exit, its first checkpoints) weighs less",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help="a second plain run in every repetition, compared with the first as a record is:"
        " the noise floor of the same runs",
    )
    ap.add_argument(
        "--steady-allocator",
        action="store_true",
        help="run every mode with glibc malloc keeping freed memory (STEADY_ALLOCATOR):"
        " takes the page-fault churn of a plain run out of the comparison",
    )
    ap.add_argument(
        "--reanalyze",
        metavar="FILE",
        type=Path,
        help="run nothing: add the record-against-both-plain-runs figures to a --control"
        " result file written before they existed, and print its bar table",
    )
    args = ap.parse_args()
    if args.reanalyze is not None:
        reanalyze(args.reanalyze)
        return
    reps = 1 if args.quick else args.reps
    become_subreaper()
    with _worktree(args.against) as against:
        base_env = STEADY_ALLOCATOR if args.steady_allocator else None
        for name in args.only:
            if name in EPOCH_S:
                calibrate(name, base_env)
        results = {
            name: bench(
                name, reps, args.quick, against, args.bar, args.epochs_times, base_env, args.control
            )
            for name in args.only
        }
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "reps": reps,
        "quick": args.quick,
        "bar": args.bar,
        "epochs_times": args.epochs_times,
        "epsilon": 1 / 15,
        "against": args.against,
        "steady_allocator": args.steady_allocator,
        "control": args.control,
        "results": results,
    }
    if len(args.only) == len(WORKLOADS):
        for what in ("training", "loop", "cpu", "held"):
            doc[f"median_record_{what}_overhead"] = statistics.median(
                r[f"record_{what}_overhead"] for r in results.values()
            )
        doc["median_record_training_interval"] = interval([_pairs(r) for r in results.values()])
        if args.control:
            doc["median_plain-control_training_overhead"] = statistics.median(
                r["plain-control_training_overhead"] for r in results.values()
            )
            doc["median_plain-control_training_interval"] = interval(
                [_pairs(r, "plain-control") for r in results.values()]
            )
            _both_doc(doc, results)
    # one file per kind of run; the options it ran with are in the file
    stem = "record_overhead" + ("-bar" if args.bar else "") + ("-quick" if args.quick else "")
    save(stem, doc, lambda png: _plot(results, png, args.against))
    if args.bar:
        _print_bar(doc, results, args.against)
        return
    print(
        f"{'workload':10} {'loop':>8} {'record':>8} {'every':>8} {'e2e rec':>8} {'cpu rec':>8} {'held':>8} {'held ev':>8} {'exit wait':>9} {'ckpt (adaptive)':>16} {'ckpt (every)':>13} {'replay':>7}"
    )
    for n, r in results.items():
        ck = r["checkpointed"]
        adaptive, every = ("{}/{}".format(*ck[m]) for m in ("record", "record-every"))
        print(
            f"{n:10} {r['record_loop_overhead']:8.1%} {r['record_training_overhead']:8.1%} {r['record-every_training_overhead']:8.1%}"
            f" {r['record_end_to_end_overhead']:8.1%} {r['record_cpu_overhead']:8.1%}"
            f" {r['record_held_overhead']:8.1%} {r['record-every_held_overhead']:8.1%} {r['record_exit_wait']:8.2f}s"
            f" {adaptive:>16} {every:>13}"
            f" {r['replay_fraction']:7.2f}"
        )
    for n, r in results.items():
        if args.against:
            print(
                f"{n:10} as of {args.against}: to exit {r['record-against_training_overhead']:.1%}"
                f" (this tree {r['record_training_overhead']:.1%}), held {r['record-against_held_overhead']:.1%}"
                f" (this tree {r['record_held_overhead']:.1%}), checkpointed {'{}/{}'.format(*r['checkpointed']['record-against'])}"
            )
    if "median_record_training_overhead" in doc:
        print(
            f"median record overhead (training, to exit): {doc['median_record_training_overhead']:.1%};"
            f" loop only: {doc['median_record_loop_overhead']:.1%}; CPU: {doc['median_record_cpu_overhead']:.1%};"
            f" held (reported by record): {doc['median_record_held_overhead']:.1%}"
        )


def _pairs(result: dict[str, Any], mode: str = "record") -> list[float]:
    """A workload's ``mode``/plain ratios to exit (a record's by default), one per repetition."""
    return [
        a[0] / b[0] for a, b in zip(result["times"][mode], result["times"]["plain"], strict=True)
    ]


def _both_plains(result: dict[str, Any]) -> list[float]:
    """A ``--control`` run's record against both of its repetition's plain runs (their geometric
    mean), one ratio per repetition. The baseline is then the mean of two runs, at two positions
    of the repetition's order, so its own noise counts half as much as in :func:`_pairs`; what
    the A/A control shows is not removed from the record's ratio, only averaged over."""
    t = result["times"]
    return [
        r[0] / math.sqrt(a[0] * b[0])
        for r, a, b in zip(t["record"], t["plain"], t["plain-control"], strict=True)
    ]


def _both_summary(out: dict[str, Any]) -> None:
    """Add a workload's record-against-both-plain-runs median, spread and interval."""
    both = _both_plains(out)
    out["record_both_training_overhead"], out["record_both_training_spread"] = median_spread(
        both, 1
    )
    out["record_both_training_interval"] = interval([both])


def _both_doc(doc: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    """The median over workloads of :func:`_both_plains`, and its interval."""
    doc["median_record_both_training_overhead"] = statistics.median(
        r["record_both_training_overhead"] for r in results.values()
    )
    doc["median_record_both_training_interval"] = interval(
        [_both_plains(r) for r in results.values()]
    )


def reanalyze(path: Path) -> None:
    """Add :func:`_both_plains` figures to a ``--control`` result file, from its own times."""
    doc = json.loads(path.read_text())
    if not doc.get("control"):
        raise SystemExit(f"{path}: not a --control run (no second plain run to compare with)")
    results = doc["results"]
    for r in results.values():
        _both_summary(r)
    if len(results) == len(WORKLOADS):
        _both_doc(doc, results)
    path.write_text(json.dumps(doc, indent=2))
    if doc.get("bar"):
        _print_bar(doc, results, doc.get("against"))


def _boundaries_seen(result: dict[str, Any], mode: str) -> str:
    """A mode's boundary checkpoints per record, as their range over the repetitions ("" in
    files written before they were counted)."""
    seen = result.get("boundaries", {}).get(mode)
    return f"{min(seen)}..{max(seen)}" if seen else ""


def _print_bar(
    doc: dict[str, Any], results: dict[str, dict[str, Any]], against: str | None = None
) -> None:
    """The table of a ``--bar`` run: each workload's overhead to exit, its interval, held (and,
    with ``--against``, the same for that commit's record, measured against the same plain runs)."""
    print(
        f"{'workload':10} {'to exit':>8} {'90% interval':>18} {'loop':>8} {'held':>6} {'checkpointed':>13}"
        f" {'boundaries':>10}"
    )
    for n, r in results.items():
        lo, hi = r["record_training_interval"]
        print(
            f"{n:10} {r['record_training_overhead']:8.1%} {f'{lo:+.1%} .. {hi:+.1%}':>18}"
            f" {r['record_loop_overhead']:8.1%} {r['record_held_overhead']:6.1%}"
            f" {'{}/{}'.format(*r['checkpointed']['record']):>13} {_boundaries_seen(r, 'record'):>10}"
        )
    for n, r in results.items():
        if "plain-control_training_interval" in r:
            lo, hi = r["plain-control_training_interval"]
            print(
                f"{n:10} control (plain against plain): {r['plain-control_training_overhead']:+.1%}"
                f" ({lo:+.1%} .. {hi:+.1%})"
            )
        if "record_both_training_interval" in r:
            lo, hi = r["record_both_training_interval"]
            print(
                f"{n:10} record against both plain runs: {r['record_both_training_overhead']:+.1%}"
                f" ({lo:+.1%} .. {hi:+.1%})"
            )
    for n, r in results.items():
        if against is not None:
            print(
                f"{n:10} as of {against}: to exit {r['record-against_training_overhead']:8.1%}"
                f" held {r['record-against_held_overhead']:6.1%} exit wait {r['record-against_exit_wait']:.2f}s"
                f" (this tree {r['record_exit_wait']:.2f}s)"
                f" checkpointed {'{}/{}'.format(*r['checkpointed']['record-against'])}"
                f" boundaries {_boundaries_seen(r, 'record-against')}"
            )
    if "median_record_training_interval" in doc:
        lo, hi = doc["median_record_training_interval"]
        print(
            f"median over workloads, to exit: {doc['median_record_training_overhead']:.1%}"
            f" (90% interval {lo:+.1%} .. {hi:+.1%}); held {doc['median_record_held_overhead']:.1%}"
        )
    if "median_plain-control_training_interval" in doc:
        lo, hi = doc["median_plain-control_training_interval"]
        print(
            f"control, median over workloads: {doc['median_plain-control_training_overhead']:+.1%}"
            f" (90% interval {lo:+.1%} .. {hi:+.1%})"
        )
    if "median_record_both_training_interval" in doc:
        lo, hi = doc["median_record_both_training_interval"]
        print(
            f"record against both plain runs, median over workloads:"
            f" {doc['median_record_both_training_overhead']:+.1%} (90% interval {lo:+.1%} .. {hi:+.1%})"
        )


@contextlib.contextmanager
def _worktree(commit: str | None) -> Iterator[Path | None]:
    """A temporary git worktree of ``commit`` (None: no comparison), removed afterwards."""
    if commit is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as d:
        tree = Path(d) / "tree"
        try:
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(tree), commit],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"--against {commit}: {e.stderr.strip()}") from None
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)],
                cwd=ROOT,
                check=False,
                capture_output=True,
            )


def _plot(results: dict[str, dict[str, Any]], path: Path, against: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(len(names)))
    bars = [
        ("record", "training", "adaptive, to exit (wall vs plain)"),
        ("record", "held", "adaptive, held (reported)"),
        ("record-every", "training", "every instance, to exit (wall)"),
        ("record-every", "held", "every instance, held"),
    ]
    if against is not None:
        bars += [
            ("record-against", "training", f"as of {against}, to exit (wall)"),
            ("record-against", "held", f"as of {against}, held"),
        ]
    bars += [("plain-control", "training", "plain against plain (control)")]
    bars = [bar for bar in bars if f"{bar[0]}_{bar[1]}_overhead" in results[names[0]]]
    w = 0.8 / len(bars)
    for k, (mode, what, label) in enumerate(bars):
        ys = [100 * results[n][f"{mode}_{what}_overhead"] for n in names]
        # the 90% interval of the median, where there is one: how far the repetitions pin it down
        err = None
        if (mode, what) == ("record", "training") and "record_training_interval" in results[
            names[0]
        ]:
            err = [
                [
                    y - 100 * results[n]["record_training_interval"][0]
                    for y, n in zip(ys, names, strict=True)
                ],
                [
                    100 * results[n]["record_training_interval"][1] - y
                    for y, n in zip(ys, names, strict=True)
                ],
            ]
        a.bar(
            [x + (k - (len(bars) - 1) / 2) * w for x in xs], ys, w, label=label, yerr=err, capsize=3
        )
    a.axhline(100 / 15, color="red", linestyle="--", label="ε = 1/15")
    a.set_xticks(xs, names)
    a.set_ylabel("record overhead, % of training time")
    a.set_title("Record overhead (Flor Fig. 6)")
    a.legend(fontsize=7)
    if "replay_fraction" in results[names[0]]:
        b.bar(xs, [results[n]["replay_fraction"] for n in names])
        b.set_xticks(xs, names)
        b.set_ylabel("fraction of a plain run")
        b.set_title("Outer-probe replay time")
    else:  # --bar: each pair's overhead, the spread the medians summarize
        for x, n in zip(xs, names, strict=True):
            ys = [100 * (ratio - 1) for ratio in _pairs(results[n])]
            b.scatter([x] * len(ys), ys, alpha=0.6)
        b.axhline(2, color="green", linestyle=":", label="2% (median bar)")
        b.axhline(100 / 15, color="red", linestyle="--", label="ε = 1/15")
        b.axhline(0, color="black", linewidth=0.5)
        b.set_xticks(xs, names)
        b.set_ylabel("recorded vs plain, % (one pair each)")
        b.set_title("Pairs, to exit")
        b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
