"""What ``record --deterministic`` costs against a plain record, on the benchmark workloads.

Each repetition runs ``flortrain record`` and ``flortrain record --deterministic`` of the same
workload (``record_overhead.WORKLOADS``), each into a fresh store, in an order that alternates
by repetition, with the steady allocator both ways. Reported per workload: the median and the
spread (min to max) of each mode's training loop and end-to-end seconds, and of the ratio of the
deterministic record's to the plain record's, pair by pair. The workloads draw nothing in a
data-parallel region, so what is measured is the settings (deterministic algorithms, the global
streams seeded, DataLoaders keyed) and the rewrite's static pass, not per-example generators.

    python benchmarks/determinism_overhead.py [--only cnn] [--reps 4] [--quick]

Writes ``results/determinism_overhead.json`` and ``.png``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_overhead import (
    STEADY_ALLOCATOR,
    _run,
    become_subreaper,
    median_spread,
    save,
    source,
    workload_args,
)

MODES = {"record": [], "deterministic": ["--deterministic"]}


def measure(name: str, reps: int, quick: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"det-{name}-"))
    try:
        (work / "train.py").write_text(source(name, quick))
        runs: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for rep in range(reps):
            order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
            for mode in order:
                shutil.rmtree(work / ".flortrain", ignore_errors=True)
                cmd = [sys.executable, "-m", "flortrain", "record", *MODES[mode], "train.py"]
                _, end_to_end, loop, *_ = _run(cmd, work, STEADY_ALLOCATOR)
                runs[mode].append((loop, end_to_end))
                print(f"{name} rep {rep} {mode}: loop {loop:.2f}s, end to end {end_to_end:.2f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {"reps": reps, "runs": runs}
    for k, what in enumerate(("loop", "end_to_end")):
        ratios = [d[k] / r[k] for r, d in zip(runs["record"], runs["deterministic"], strict=True)]
        out[what] = {
            m: dict(zip(("median", "spread"), median_spread([x[k] for x in runs[m]]), strict=True))
            for m in MODES
        }
        out[what]["ratio"] = dict(zip(("median", "spread"), median_spread(ratios), strict=True))
    return out


def _plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what in zip(axes, ("loop", "end_to_end"), strict=True):
        for j, mode in enumerate(MODES):
            med = [results[n][what][mode]["median"] for n in names]
            lo = [med[i] - results[n][what][mode]["spread"][0] for i, n in enumerate(names)]
            hi = [results[n][what][mode]["spread"][1] - med[i] for i, n in enumerate(names)]
            xs = [i + (j - 0.5) * 0.4 for i in range(len(names))]
            ax.bar(xs, med, 0.4, yerr=[lo, hi], capsize=3, label=mode)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("seconds (median, min to max)")
        ax.set_title(what.replace("_", " "))
        ax.legend()
    fig.suptitle("record vs record --deterministic")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    args = workload_args(__doc__ or "", reps=4).parse_args()
    become_subreaper()
    reps = 1 if args.quick else args.reps
    results = {name: measure(name, reps, args.quick) for name in args.only}
    for name, r in results.items():
        for what in ("loop", "end_to_end"):
            ratio = r[what]["ratio"]
            lo, hi = ratio["spread"]
            print(
                f"{name} {what}: deterministic/record {ratio['median']:.3f} ({lo:.3f} to {hi:.3f})"
            )
    stem = "determinism_overhead" + ("-quick" if args.quick else "")
    save(stem, {"workloads": results}, lambda p: _plot(results, p))


if __name__ == "__main__":
    main()
