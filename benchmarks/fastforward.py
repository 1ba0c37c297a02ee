"""Fast-forward: a pseudoresume that leaves out what nothing later needs, against one that runs
every statement of the iterations it only passes through.

The workload's main loop trains an MLP on a small training set each epoch and then evaluates
it on a large validation set, full-batch under ``torch.no_grad()`` in eval mode, and prints the
validation loss: the shape fast-forward is for. The evaluation is not a loop, so no checkpoint
restores it; a pseudoresume that runs it pays its full cost in every iteration it passes
through. The script is recorded once (``OMP_NUM_THREADS=1``), then a probe is added in the
epoch loop and, R times, interleaved:

- ``forward``: ``flortrain replay S --jobs 2`` with ``FLORTRAIN_RESUME=pseudo`` and
  ``FLORTRAIN_SEGMENTS=even``: the second worker pseudoresumes through the first half of the
  epochs, fast-forward on (the default);
- ``full``: the same with ``FLORTRAIN_FAST_FORWARD=off``: every statement of those epochs runs.

Measured: the CPU seconds of the whole command and its processes (the driver and both workers:
``RUSAGE_CHILDREN``; wall time on a shared two-core machine is noise), and the wall seconds the
pseudoresuming worker's script ran (its own report). Every replay's output must equal the plain
run of the probed script, and its ``diff`` must pass; a run that does not is an error.

    python benchmarks/fastforward.py [--quick] [--reps R]

Writes benchmarks/results/fastforward.json and .png (``-quick`` in the name with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from record_overhead import commit  # noqa: E402

WORKLOAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.randn(2048, 256)
labels = torch.randint(0, 10, (2048,))
val_x = torch.randn(VALIDATION, 256)
val_y = torch.randint(0, 10, (VALIDATION,))
for epoch in range(EPOCHS):
    model.train()
    for i in range(0, 2048, 64):
        loss = F.cross_entropy(model(data[i:i + 64]), labels[i:i + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = F.cross_entropy(model(val_x), val_y).item()
    model.train()
    print(f"epoch {epoch} loss {loss.item():.6f} val {val:.6f}")
    #PROBE
"""

PROBE = 'print(f"PROBE {epoch} {model[0].weight.norm().item():.8f}")'

VARIANTS = {"forward": {}, "full": {"FLORTRAIN_FAST_FORWARD": "off"}}
ENV = {
    "OMP_NUM_THREADS": "1",
    "FLORTRAIN_RESUME": "pseudo",
    "FLORTRAIN_SEGMENTS": "even",
}


def source(quick: bool, probe: bool) -> str:
    text = WORKLOAD.replace("EPOCHS", "4" if quick else "8")
    text = text.replace("VALIDATION", "20000" if quick else "60000")
    return text.replace("#PROBE", PROBE if probe else "#")


def run(
    cmd: list[str], cwd: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command's result and the CPU seconds it and its processes used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p, cpu


def flortrain(
    cwd: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return run([sys.executable, "-m", "flortrain", *args], cwd, {**env, "PYTHONPATH": pythonpath})


def bench(reps: int, quick: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="ff-bench-") as d:
        tmp = Path(d)
        script = tmp / "train.py"
        script.write_text(source(quick, probe=False))
        rec, _ = flortrain(tmp, ENV, "record", "train.py")
        if rec.returncode != 0:
            raise SystemExit(f"record failed: {rec.stderr}")
        script.write_text(source(quick, probe=True))
        truth, _ = run([sys.executable, "train.py"], tmp, ENV)
        cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        worker: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for r in range(reps):
            for name, extra in VARIANTS.items():
                p, seconds = flortrain(tmp, {**ENV, **extra}, "replay", "train.py", "--jobs", "2")
                if p.returncode != 0 or p.stdout != truth.stdout:
                    raise SystemExit(f"{name}: replay not exact (exit {p.returncode}):\n{p.stderr}")
                if name == "forward" and "fast-forward left out" not in p.stderr:
                    raise SystemExit(f"forward: nothing left out:\n{p.stderr}")
                d2, _ = flortrain(tmp, ENV, "diff")
                if d2.returncode != 0:
                    raise SystemExit(f"{name}: diff failed:\n{d2.stdout}{d2.stderr}")
                m = re.search(r"worker 2/2 done .*its script ran ([0-9.]+)s", p.stderr)
                cpu[name].append(seconds)
                worker[name].append(float(m.group(1)) if m else float("nan"))
                print(
                    f"rep {r + 1} {name}: {seconds:.1f} CPU s, worker 2 script {worker[name][-1]:.1f}s",
                    flush=True,
                )
    return {
        "cpu_s": cpu,
        "worker2_script_s": worker,
        "median_cpu_s": {v: statistics.median(xs) for v, xs in cpu.items()},
        "median_worker2_s": {v: statistics.median(xs) for v, xs in worker.items()},
    }


def plot(results: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, title in (
        (axes[0], "cpu_s", "replay --jobs 2: CPU seconds (all processes)"),
        (axes[1], "worker2_script_s", "pseudoresuming worker: script wall s"),
    ):
        data = results[key]
        assert isinstance(data, dict)
        names = list(data)
        meds = [statistics.median(data[n]) for n in names]
        ax.bar(names, meds, color=["tab:green", "tab:gray"])
        for k, n in enumerate(names):
            ax.scatter([k] * len(data[n]), data[n], color="black", s=12, zorder=3)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("seconds")
    fig.suptitle(
        "fast-forward on (forward) vs off (full pseudoresume); medians, dots = runs", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    results = bench(a.reps, a.quick)
    out = {
        "benchmark": "fastforward",
        "commit": commit(),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "reps": a.reps,
        "quick": a.quick,
        "env": ENV,
        **results,
    }
    name = "fastforward-quick" if a.quick else "fastforward"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    plot(results, OUT / f"{name}.png")
    print(
        json.dumps(
            {
                "median_cpu_s": results["median_cpu_s"],
                "median_worker2_s": results["median_worker2_s"],
            }
        )
    )


if __name__ == "__main__":
    main()
