"""The record-overhead bar over several ``record_overhead.py --bar`` runs, their pairs pooled.

Why: on a 2-core VM two plain runs of one script differ by as much as 25 to 50% (the A/A
control of ``record_overhead.py --control``), so one run of 10 to 24 pairs pins the median over
workloads only to within a few points of the 2% bar, and runs of the same code have read from
-0.6% to +5.5%. A median is as good as the number of pairs behind it. Each pair is a plain run
and a recorded run in the same repetition, so its ratio is meaningful wherever it was
measured; pooling the pairs of several runs of comparable trees gives the bar more pairs than
one session can afford.

What it reports, per workload and for the median over workloads:
- each run's median and 90% bootstrap interval, as the run reported them;
- the **pooled** median over every pair of the runs given, with a 90% bootstrap interval that
  resamples pairs *within each run* (a run's weight stays its number of pairs, and a run
  measured at a fast hour does not stand in for a slow one); it does not resample the runs,
  so it speaks for the hours measured, not for any hour;
- where the runs had ``--control``, the same for the A/A control, pooled: the floor;
- held, the median of the runs' held figures (held is measured on the training thread, not a
  difference of two runs, so it needs no pooling).

It runs nothing: the inputs are result files, either ``--bar`` runs or an earlier pool, whose
runs carry their pairs. Pool only runs of trees whose record paths do not differ in what they
cost. To add a new run to the pool:

    python benchmarks/record_overhead.py --bar --steady-allocator --control --reps 20
    python benchmarks/bar_pool.py benchmarks/results/bar_pool.json benchmarks/results/record_overhead-bar.json

    python benchmarks/bar_pool.py FILE [FILE ...] [--out NAME]

Writes benchmarks/results/NAME.json and .png (NAME defaults to bar_pool).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from record_overhead import WORKLOADS, _pairs, save, stratified_interval

EPSILON = 1 / 15
BAR = 0.02


def _run(d: dict[str, Any]) -> dict[str, Any]:
    """One ``--bar`` run's entry in a pool: its reported figures and its pairs."""
    names = list(WORKLOADS)
    run: dict[str, Any] = {
        "commit": d.get("commit"),
        "pairs": len(_pairs(d["results"][names[0]])),
        "median": d["median_record_training_overhead"],
        "interval": d["median_record_training_interval"],
        "held": d["median_record_held_overhead"],
        "workloads": {n: d["results"][n]["record_training_overhead"] for n in names},
        "held_by_workload": {n: d["results"][n]["record_held_overhead"] for n in names},
        "ratios": {n: _pairs(d["results"][n]) for n in names},
    }
    if d.get("control"):
        run["control_ratios"] = {n: _pairs(d["results"][n], "plain-control") for n in names}
    return run


def runs_of(path: Path) -> list[dict[str, Any]]:
    """The runs in result file ``path``: one for a ``--bar`` run, its runs for a pool. Raises
    ``ValueError`` naming a file that is neither."""
    try:
        d = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not a result file ({e})") from None
    if (
        isinstance(d, dict)
        and isinstance(d.get("runs"), list)
        and all("ratios" in r for r in d["runs"])
    ):
        return list(d["runs"])
    if not isinstance(d, dict) or not d.get("bar") or set(d.get("results", ())) != set(WORKLOADS):
        raise ValueError(
            f"{path}: not a --bar run of every workload ({', '.join(WORKLOADS)}), nor a pool"
        )
    return [_run(d)]


def pool(paths: list[Path]) -> dict[str, Any]:
    """The pooled figures of the runs in result files ``paths`` (see the module's docstring)."""
    runs = [r for p in paths for r in runs_of(p)]
    names = list(WORKLOADS)
    controls = [r["control_ratios"] for r in runs if "control_ratios" in r]
    out: dict[str, Any] = {"runs": runs, "pairs": sum(r["pairs"] for r in runs), "workloads": {}}
    for n in names:
        ratios = [x for r in runs for x in r["ratios"][n]]
        w: dict[str, Any] = {
            "median": statistics.median(ratios) - 1,
            "interval": stratified_interval([[r["ratios"][n]] for r in runs]),
            "pairs_above_epsilon": sum(x - 1 > EPSILON for x in ratios),
            "pairs": len(ratios),
            "held": statistics.median(r["held_by_workload"][n] for r in runs),
        }
        if controls:
            c = [x for run in controls for x in run[n]]
            w["control_median"] = statistics.median(c) - 1
            w["control_pairs_above_epsilon"] = sum(x - 1 > EPSILON for x in c)
            w["control_pairs"] = len(c)
        out["workloads"][n] = w
    out["median"] = statistics.median(w["median"] for w in out["workloads"].values())
    out["interval"] = stratified_interval([[r["ratios"][n] for n in names] for r in runs])
    out["held"] = statistics.median(r["held"] for r in runs)
    if controls:
        out["control_runs"] = len(controls)
        out["control_median"] = statistics.median(
            w["control_median"] for w in out["workloads"].values()
        )
        out["control_interval"] = stratified_interval([[run[n] for n in names] for run in controls])
    return out


def _label(k: int, r: dict[str, Any]) -> str:
    return f"{k + 1}" + (f" {r['commit']}" if r.get("commit") else "")


def _print(out: dict[str, Any]) -> None:
    print(f"{'run':20} {'pairs':>5} {'median':>7} {'90% interval':>18} {'held':>6}")
    for k, r in enumerate(out["runs"]):
        lo, hi = r["interval"]
        print(
            f"{_label(k, r):20} {r['pairs']:5d} {r['median']:+7.1%} {f'{lo:+.1%} .. {hi:+.1%}':>18} {r['held']:6.1%}"
        )
    lo, hi = out["interval"]
    print(
        f"{'pooled':20} {out['pairs']:5d} {out['median']:+7.1%} {f'{lo:+.1%} .. {hi:+.1%}':>18} {out['held']:6.1%}"
    )
    for n, w in out["workloads"].items():
        lo, hi = w["interval"]
        line = (
            f"{n:10} pooled {w['median']:+.1%} ({lo:+.1%} .. {hi:+.1%}), {w['pairs_above_epsilon']}/{w['pairs']}"
            f" pairs above ε, held {w['held']:.1%}"
        )
        if "control_median" in w:
            line += (
                f"; control {w['control_median']:+.1%}, {w['control_pairs_above_epsilon']}/{w['control_pairs']}"
                " pairs above ε"
            )
        print(line)
    if "control_interval" in out:
        lo, hi = out["control_interval"]
        print(
            f"control, pooled over {out['control_runs']} runs: {out['control_median']:+.1%} ({lo:+.1%} .. {hi:+.1%})"
        )


def _plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [_label(k, r) for k, r in enumerate(out["runs"])] + ["pooled"]
    meds = [100 * r["median"] for r in out["runs"]] + [100 * out["median"]]
    ivs = [r["interval"] for r in out["runs"]] + [out["interval"]]
    err = [
        [m - 100 * iv[0] for m, iv in zip(meds, ivs, strict=True)],
        [100 * iv[1] - m for m, iv in zip(meds, ivs, strict=True)],
    ]
    xs = list(range(len(meds)))
    a.bar(xs, meds, yerr=err, capsize=3, color=["tab:blue"] * (len(meds) - 1) + ["tab:orange"])
    a.axhline(100 * BAR, color="green", linestyle=":", label="2% (median bar)")
    a.axhline(100 * EPSILON, color="red", linestyle="--", label="ε = 1/15")
    a.axhline(0, color="black", linewidth=0.5)
    a.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
    a.set_ylabel("median over workloads, % to exit")
    a.set_title("Each run and the pooled pairs (90% intervals)")
    a.legend(fontsize=7)
    names = list(out["workloads"])
    ys = [100 * out["workloads"][n]["median"] for n in names]
    werr = [
        [y - 100 * out["workloads"][n]["interval"][0] for y, n in zip(ys, names, strict=True)],
        [100 * out["workloads"][n]["interval"][1] - y for y, n in zip(ys, names, strict=True)],
    ]
    wx = list(range(len(names)))
    b.bar([x - 0.2 for x in wx], ys, 0.4, yerr=werr, capsize=3, label="record, pooled")
    if "control_interval" in out:
        b.bar(
            [x + 0.2 for x in wx],
            [100 * out["workloads"][n]["control_median"] for n in names],
            0.4,
            label="plain against plain (control), pooled",
        )
    b.bar(
        [x - 0.2 for x in wx],
        [100 * out["workloads"][n]["held"] for n in names],
        0.15,
        color="black",
        label="held",
    )
    b.axhline(100 * EPSILON, color="red", linestyle="--", label="ε = 1/15")
    b.axhline(0, color="black", linewidth=0.5)
    b.set_xticks(wx, names)
    b.set_ylabel("% to exit")
    b.set_title(f"Per workload, {out['pairs']} pairs pooled")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="record_overhead.py --bar result files, or an earlier pool",
    )
    ap.add_argument("--out", default="bar_pool", help="the result files' name, without suffix")
    args = ap.parse_args()
    missing = [p for p in args.files if not p.is_file()]
    if missing:
        print(f"{missing[0]}: no such result file", file=sys.stderr)
        raise SystemExit(2)
    try:
        out = pool(args.files)
    except ValueError as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    save(args.out, out, lambda png: _plot(out, png), stamp=False)
    _print(out)


if __name__ == "__main__":
    main()
