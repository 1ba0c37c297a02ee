"""Parallel replay: inner-probe replay with 1 and 2 workers against a plain re-run (Flor
Figure 10), direct resume against pseudoresume (Figure 11's comparison), and the outer-probe
partial replay against a plain re-run (Figure 7, top).

The workload is a training loop that is most of the run: an MLP on generated data, 12 epochs of
about two seconds, small state (checkpoints are cheap, so the adaptive period checkpoints every
epoch's boundary). It runs in two settings, each recorded once with default flortrain settings:

- ``1-thread``: training launched with ``OMP_NUM_THREADS=1`` (one core per job, common on shared
  CPU machines): the record used one core, and two replay workers can use both;
- ``2-threads``: torch's default here, two intra-op threads. A replay worker must use the
  record's thread count (float reductions depend on it: 1 and 2 threads give different bits
  for this very workload), so two workers share two cores with four threads: what parallelism
  can win is only what one training process leaves idle.

Then, R times, interleaved so that drift on a shared machine hits every variant alike:

- ``plain-inner``: ``python S`` with an inner probe (in the batch loop): the re-run the user
  would otherwise do;
- ``inner-j1``, ``inner-j2``: ``flortrain replay S --jobs 1`` / ``--jobs 2``; the probe is inside
  the memoized batch loop, so every epoch executes: only parallelism helps;
- ``inner-j2-pseudo``: ``--jobs 2`` with ``FLORTRAIN_RESUME=pseudo``: the second worker
  re-runs the first segment's iterations with their blocks restored (Flor's pseudoresume);
- ``inner-j2-cold``: ``--jobs 2`` with ``FLORTRAIN_PRESTART=off``: workers started once the
  plan is made, instead of before it (what prestarting saves);
- ``plain-outer``, ``outer-j1``, ``outer-j2``: the same with an outer probe (after the batch
  loop, in the epoch loop): partial replay restores every epoch's batch loop.

Every time is a whole command's wall time (start-up included: the user waits for it). Ratios
are per repetition (replay / plain of the same probe) and the median and range are reported.
Every replay's probe output is checked against the plain run's, and each replay's ``diff``.

    python benchmarks/parallel_replay.py [--quick] [--reps R] [--setting S] [--variants V ...]

Writes benchmarks/results/parallel_replay.json and .png (``-quick`` in the name with --quick),
with the settings and variants measured and the commit.
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
import time
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
N = SAMPLES
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.randn(N, 256)
labels = torch.randint(0, 10, (N,))
for epoch in range(EPOCHS):
    for i in range(0, N, 64):
        loss = F.cross_entropy(model(data[i:i + 64]), labels[i:i + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
        #INNER
    #OUTER
    print(f"epoch {epoch} loss {loss.item():.6f}")
"""

INNER = 'if i % 8192 == 0: print(f"PROBE {epoch} {i} {loss.item():.8f} {model[0].weight.grad.norm().item():.8f}")'
OUTER = (
    'print(f"PROBE {epoch} {sum(p.detach().abs().sum().item() for p in model.parameters()):.8f}")'
)

VARIANTS = {
    "plain-inner": ("inner", None, {}),
    "inner-j1": ("inner", 1, {}),
    "inner-j2": ("inner", 2, {}),
    "inner-j2-pseudo": ("inner", 2, {"FLORTRAIN_RESUME": "pseudo"}),
    "inner-j2-cold": ("inner", 2, {"FLORTRAIN_PRESTART": "off"}),
    "plain-outer": ("outer", None, {}),
    "outer-j1": ("outer", 1, {}),
    "outer-j2": ("outer", 2, {}),
}
#: setting -> (environment of every command, the variants measured in it)
SETTINGS = {
    "1-thread": ({"OMP_NUM_THREADS": "1"}, list(VARIANTS)),  # every variant
    "2-threads": ({}, ["plain-inner", "inner-j2", "plain-outer", "outer-j2"]),
}


def source(quick: bool, probe: str | None = None) -> str:
    text = WORKLOAD.replace("SAMPLES", "16384" if quick else "65536").replace(
        "EPOCHS", "6" if quick else "12"
    )
    text = text.replace("#INNER", INNER if probe == "inner" else "# (inner probe)")
    return text.replace("#OUTER", OUTER if probe == "outer" else "# (outer probe)")


def probes(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("PROBE")]


def timed(
    cmd: list[str], cwd: Path, env: dict[str, str]
) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    p = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return elapsed, p


def bench(reps: int, quick: bool, base: dict[str, str], variants: list[str]) -> dict[str, object]:
    flortrain = [sys.executable, "-m", "flortrain"]
    with tempfile.TemporaryDirectory(prefix="flortrain-bench-") as d:
        cwd = Path(d)
        script = cwd / "train.py"
        script.write_text(source(quick))
        _, rec = timed([*flortrain, "record", "train.py"], cwd, base)
        print(rec.stderr.strip().splitlines()[-1], file=sys.stderr)
        truth = {}
        for kind in ("inner", "outer"):
            script.write_text(source(quick, kind))
            truth[kind] = probes(timed([sys.executable, "train.py"], cwd, base)[1].stdout)
        times: dict[str, list[float]] = {v: [] for v in variants}
        resumes: dict[str, str] = {}
        for r in range(reps):
            for name in variants:
                kind, jobs, env = VARIANTS[name]
                script.write_text(source(quick, kind))
                if jobs is None:
                    t, p = timed([sys.executable, "train.py"], cwd, base)
                else:
                    t, p = timed(
                        [*flortrain, "replay", "train.py", "--jobs", str(jobs)],
                        cwd,
                        {**base, **env},
                    )
                    if "not faithful" in p.stderr:
                        raise SystemExit(f"{name}: the replay is not faithful:\n{p.stderr[-2000:]}")
                    resumes[name] = "; ".join(
                        ln.split("flortrain: ", 1)[1]
                        for ln in p.stderr.splitlines()
                        if "done at" in ln or "replaying serially" in ln
                    )
                if probes(p.stdout) != truth[kind]:
                    raise SystemExit(f"{name}: probe output differs from python's")
                times[name].append(t)
                print(f"rep {r + 1}/{reps} {name:16s} {t:6.2f}s", file=sys.stderr)
    ratios: dict[str, dict[str, float]] = {}
    for name in variants:
        kind, jobs, _ = VARIANTS[name]
        if jobs is None:
            continue
        rs = [a / b for a, b in zip(times[name], times[f"plain-{kind}"], strict=True)]
        ratios[name] = {"median": statistics.median(rs), "min": min(rs), "max": max(rs)}
    return {
        "times_s": times,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "ratio_to_plain": ratios,
        "workers": resumes,
        "record": rec.stderr.strip().splitlines()[-1],
    }


def plot(results: dict[str, dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(results), figsize=(max(7, 5 * len(results)), 4.2), sharey=True, squeeze=False
    )
    for ax, (setting, result) in zip(axes[0], results.items(), strict=True):
        ratios: dict[str, dict[str, float]] = result["ratio_to_plain"]  # type: ignore[assignment]
        names = list(ratios)
        med = [ratios[n]["median"] for n in names]
        lo = [ratios[n]["median"] - ratios[n]["min"] for n in names]
        hi = [ratios[n]["max"] - ratios[n]["median"] for n in names]
        colors = ["tab:blue" if n.startswith("inner") else "tab:green" for n in names]
        ax.bar(names, med, yerr=[lo, hi], color=colors, capsize=4)
        ax.axhline(1.0, color="grey", lw=1, ls="--", label="plain re-run")
        ax.axhline(0.6, color="tab:blue", lw=1, ls=":", label="inner target (--jobs 2)")
        ax.axhline(0.25, color="tab:green", lw=1, ls=":", label="outer target")
        for x, v in enumerate(med):
            ax.text(x, v + 0.02, f"{v:.2f}", ha="center", fontsize=8)
        ax.set_title(f"training with {setting}")
        plt.setp(ax.get_xticklabels(), rotation=25, ha="right")
    axes[0][0].set_ylabel("replay time / plain run of the probed script")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Parallel replay on a 2-core CPU (median and range over repetitions)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller workload, one repetition")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--setting", choices=list(SETTINGS), help="measure this setting only")
    ap.add_argument(
        "--variants", nargs="*", choices=list(VARIANTS), help="measure these variants only"
    )
    args = ap.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    results = {}
    for setting, (base, variants) in SETTINGS.items():
        if args.setting and setting != args.setting:
            continue
        if args.variants:
            variants = [v for v in variants if v in args.variants]
        print(f"-- {setting}", file=sys.stderr)
        results[setting] = bench(reps, args.quick, base, variants)
    out = {
        "settings": results,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "reps": reps,
        "commit": commit(),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "parallel_replay" + ("-quick" if args.quick else "")
    (OUT / f"{stem}.json").write_text(json.dumps(out, indent=2) + "\n")
    plot(results, OUT / f"{stem}.png")
    for setting, result in results.items():
        for name, r in result["ratio_to_plain"].items():  # type: ignore[attr-defined]
            workers = result["workers"].get(name, "")  # type: ignore[attr-defined]
            print(
                f"{setting:9s} {name:16s} {r['median']:.2f} of plain (range {r['min']:.2f}-{r['max']:.2f})  {workers}"
            )


if __name__ == "__main__":
    main()
