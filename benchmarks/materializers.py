"""Materializer alternatives on a >= 100 MB training state (Flor thesis, Figures 5.3 and 5.4).

Each alternative runs in a fresh process, on the same model (two 4096x4096 linear layers and
SGD with momentum: 268 MB of parameters and momentum), alternating a checkpoint and K training
steps. Per checkpoint it reports:

- **blocked**: the median time the checkpoint call holds the training thread (thesis Figure 5.3);
- **cost**: what the checkpoint adds, on average, to the two rounds it starts (its own, checkpoint
  + K steps, and the plain round after it) over two rounds timed before any checkpoint: blocking,
  plus what the training thread pays afterwards (copy-on-write faults after a fork, CPU taken by
  a background writer on a 2-core machine, in whichever round it falls);
- **buffer**: the bytes the materializer copies and holds for the checkpoint (Figure 5.4);
- **drain**: the time to finish writing everything at the end.

Alternatives: ``torch.save`` and ``cloudpickle`` on the training thread; a writer thread fed by
copies; a fork per checkpoint with copy-on-write and no copy; Flor's batched copy-and-fork (a
child per batch of staged copies); and flortrain's materializer (a writer forked before the
model exists, fed through a shared staging arena).

    python benchmarks/materializers.py [--quick]

Writes benchmarks/results/materializers.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
ALTERNATIVES = (
    "torch.save",
    "cloudpickle",
    "writer-thread",
    "fork-cow",
    "batched-copy-fork",
    "flortrain",
)

CHILD = r'''
import io, json, os, statistics, sys, threading, time
import torch

kind, rounds, steps, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
session = None
if kind == "flortrain":  # started before the model exists, as `flortrain record` does
    from flortrain.checkpoint.materializer import BackgroundMaterializer, Callbacks
    from flortrain.store.db import Store
    store = Store(__import__("pathlib").Path(outdir) / "store")
    run = store.begin_run("record", "bench.py", [], "", None, None, {})
    committed = []
    mat = BackgroundMaterializer(store, run, Callbacks(lambda k, d: committed.append(k), lambda k, r: print("lost", k, r), print))
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096))
opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
x = torch.randn(32, 4096)

def step():
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()

def state():
    return {"model": model.state_dict(), "opt": opt.state_dict()}

def copy_state():
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "opt": {"state": {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in s.items()}
                              for k, s in opt.state_dict()["state"].items()},
                    "param_groups": opt.state_dict()["param_groups"]}}

def nbytes(s):
    return sum(t.numel() * t.element_size() for t in model.state_dict().values()) + sum(
        t.numel() * t.element_size() for st in opt.state_dict()["state"].values() for t in st.values() if torch.is_tensor(t))

n = [0]
def path():
    n[0] += 1
    return os.path.join(outdir, f"ck{n[0]}.pt")

children = []
threads = []
batch = []
BATCH = 4

def checkpoint():
    """Returns the bytes the materializer copied and holds."""
    if kind == "torch.save":
        torch.save(state(), path()); return 0
    if kind == "cloudpickle":
        import cloudpickle
        with open(path(), "wb") as f:
            f.write(cloudpickle.dumps(state()))
        return 0
    if kind == "writer-thread":
        s = copy_state()
        t = threading.Thread(target=torch.save, args=(s, path())); t.start(); threads.append(t)
        return nbytes(s)
    if kind == "fork-cow":
        p = path(); pid = os.fork()
        if pid == 0:
            torch.save(state(), p); os._exit(0)
        children.append(pid); return 0
    if kind == "batched-copy-fork":
        batch.append(copy_state())
        held = nbytes(None) * len(batch)
        if len(batch) == BATCH:
            p = path(); pid = os.fork()
            if pid == 0:
                torch.save(batch, p); os._exit(0)
            children.append(pid); batch.clear()
        return held
    if kind == "flortrain":
        mat.submit(f"k{n[0]}", "B", {"objects": {"model": model.state_dict(), "opt": opt.state_dict()}})
        n[0] += 1
        return nbytes(None)
    raise SystemExit(kind)

for _ in range(3):
    step()
clean = []  # rounds with nothing checkpointed yet: no writer, thread or child has work
for r in range(rounds):
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    clean.append(time.perf_counter() - t0)
base, blocked, cost, held = [], [], [], []
for r in range(rounds):  # alternate plain rounds and rounds with a checkpoint
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    base.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    h = checkpoint()
    t1 = time.perf_counter()
    for _ in range(steps):
        step()
    t2 = time.perf_counter()
    blocked.append(t1 - t0)
    cost.append(t2 - t0)
    held.append(h)
    for c in list(children):  # reap finished children without blocking, as a materializer would
        if os.waitpid(c, os.WNOHANG)[0]:
            children.remove(c)
t0 = time.perf_counter()
if kind == "batched-copy-fork" and batch:
    pid = os.fork()
    if pid == 0:
        torch.save(batch, path()); os._exit(0)
    children.append(pid)
for c in children:
    os.waitpid(c, 0)
for t in threads:
    t.join()
if kind == "flortrain":
    mat.flush()
    assert len(committed) == rounds, committed
drain = time.perf_counter() - t0
b = statistics.median(clean)
# blocked: the median call (Figure 5.3); cost: what a checkpoint adds to the pair of rounds it
# starts (its own and the plain one after it) over two clean rounds, averaged over the run, so
# a batch strategy's fork round is amortized over the rounds it covers, and a background
# writer's CPU is counted in whichever round it slows
print(json.dumps({"blocked_s": statistics.median(blocked),
                  "cost_s": statistics.mean(c + p for c, p in zip(cost, base[1:] + [b], strict=True)) - 2 * b,
                  "step_round_s": b, "buffer_bytes": max(held), "drain_s": drain, "state_bytes": nbytes(None)}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and repetitions")
    args = ap.parse_args()
    rounds, reps, steps = (4, 1, 2) if args.quick else (8, 3, 3)
    results: dict[str, list[dict[str, float]]] = {a: [] for a in ALTERNATIVES}
    for rep in range(reps):
        for alt in ALTERNATIVES:  # interleaved, so drift affects all alike
            with tempfile.TemporaryDirectory() as d:
                p = subprocess.run(
                    [sys.executable, "-c", CHILD, alt, str(rounds), str(steps), d],
                    capture_output=True,
                    text=True,
                    check=False,
                )
            if p.returncode:
                raise SystemExit(f"{alt} failed:\n{p.stderr}")
            results[alt].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"rep {rep} {alt}: {results[alt][-1]}", file=sys.stderr)
    summary: dict[str, dict[str, Any]] = {}
    for alt, runs in results.items():
        summary[alt] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        summary[alt]["cost_spread_s"] = [
            min(r["cost_s"] for r in runs),
            max(r["cost_s"] for r in runs),
        ]
    cp = summary["cloudpickle"]["blocked_s"]
    for alt in ALTERNATIVES:
        summary[alt]["blocked_vs_cloudpickle"] = summary[alt]["blocked_s"] / cp
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "rounds": rounds,
        "reps": reps,
        "steps_per_round": steps,
        "quick": args.quick,
        "results": summary,
        "runs": results,
    }
    name = "materializers-quick" if args.quick else "materializers"
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=2))
    _plot(summary, OUT / f"{name}.png")
    print(
        f"{'alternative':20} {'blocked ms':>11} {'cost ms':>9} {'buffer MB':>10} {'drain s':>8} {'vs cloudpickle':>15}"
    )
    for alt, s in summary.items():
        print(
            f"{alt:20} {s['blocked_s'] * 1e3:11.1f} {s['cost_s'] * 1e3:9.1f} {s['buffer_bytes'] / 2**20:10.0f}"
            f" {s['drain_s']:8.2f} {s['blocked_vs_cloudpickle']:15.3f}"
        )


def _plot(summary: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    xs = range(len(names))
    a.bar(
        [x - 0.2 for x in xs], [summary[n]["blocked_s"] * 1e3 for n in names], 0.4, label="blocked"
    )
    a.bar(
        [x + 0.2 for x in xs],
        [summary[n]["cost_s"] * 1e3 for n in names],
        0.4,
        label="cost to training",
    )
    a.set_xticks(list(xs), names, rotation=30, ha="right")
    a.set_ylabel("ms per checkpoint")
    a.set_title("Training thread time per checkpoint (268 MB state)")
    a.legend()
    b.bar(list(xs), [summary[n]["buffer_bytes"] / 2**20 for n in names])
    b.set_xticks(list(xs), names, rotation=30, ha="right")
    b.set_ylabel("MB")
    b.set_title("Buffer: bytes copied and held per checkpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
