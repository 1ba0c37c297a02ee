"""Record overhead by wall clock, measured in pairs that run at the same time, each on a core of
its own: a plain run and a recorded one side by side, with an A/A control (two plain runs) that
shows what the method cannot resolve.

Why: on this project's 2-core VM, plain runs of one script measured one after the other differ
by ±15% (``record_overhead.py``), more than the 2% the record's overhead is meant to stay under,
because the host's speed drifts from minute to minute. Two runs that start together, each pinned
to one core (``sched_setaffinity``, inherited by every process it starts: the recorded run's
writer competes with its own training, never with the other run), meet the same drift. The
ratio of their times to exit is then a wall-clock overhead, with the writer's whole CPU cost,
its cache and memory traffic and the final flush in it. Which core runs which side alternates
by repetition, and which side starts first every second one.

It measures something other than ``record_overhead.py``: each run trains on one thread
(``OMP_NUM_THREADS=1``), and the recorded run's writer gets no idle core at all, so everything
it hashes and writes comes out of training or is waited for at exit. On a machine whose cores
training leaves partly idle (a GPU host), it costs less. The two runs still share the memory
bandwidth and the last-level cache, so a memory-bound workload (the fine-tuning shape's
embedding lookups) pairs less well than a compute-bound one: the A/A control says how well.

The fine-tuning shape's batches per epoch are calibrated as in ``record_overhead.py``
(``calibrate``), from plain runs on one thread, and the number chosen is in the JSON: its
epochs are then 0.1 s for a run alone on its core, a little longer beside another.

    python benchmarks/paired_overhead.py [--quick] [--reps N] [--only NAME...]

Writes benchmarks/results/paired_overhead.json and .png.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_overhead import (
    _HELD,
    EPOCH_S,
    WORKLOADS,
    _calibrated,
    become_subreaper,
    calibrate,
    median_spread,
    save,
    settle,
    source,
    workload_args,
)

#: one training thread per run, so that each has its core and only its core
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass
class Side:
    """One run of a pair: its directory, its command and, once it is over, its figures."""

    work: Path
    record: bool
    to_exit: float = 0.0
    held: float = 0.0

    def command(self) -> list[str]:
        return (
            [sys.executable, "-m", "flortrain", "record", "train.py"]
            if self.record
            else [sys.executable, "train.py"]
        )


def _pin(core: int) -> Callable[[], None]:
    """What a child runs before ``exec``: keep to ``core``, and so does every process it starts."""
    return lambda: os.sched_setaffinity(0, {core})


def _pair(a: Side, b: Side, cores: tuple[int, int]) -> None:
    """Run ``a`` on ``cores[0]`` and ``b`` on ``cores[1]``, started together (``a`` a moment
    earlier); each side's time from its training loop's first line to its process's exit."""
    procs = []
    for side, core in ((a, cores[0]), (b, cores[1])):
        (side.work / "t0").unlink(missing_ok=True)
        env = {
            **os.environ,
            **_ONE_THREAD,
            "BENCH_T0": str(side.work / "t0"),
            "FLORTRAIN_STORE": str(side.work / f"store{time.time_ns()}"),
        }
        procs.append(
            subprocess.Popen(
                side.command(),
                cwd=side.work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_pin(core),
            )
        )
    ends: list[float] = [0.0, 0.0]
    errs: list[str] = ["", ""]

    def wait(i: int) -> None:
        errs[i] = procs[i].communicate()[1]
        ends[i] = time.time()

    waiters = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
    for t in waiters:
        t.start()
    for t in waiters:
        t.join()
    settle()  # a writer that outlives its run ends before the next pair starts
    for i, side in enumerate((a, b)):
        if procs[i].returncode:
            raise SystemExit(f"{' '.join(side.command())} failed:\n{errs[i]}")
        side.to_exit = ends[i] - float((side.work / "t0").read_text())
        held = _HELD.search(errs[i])
        side.held = float(held.group(1)) / 100 if held else 0.0


def bench(name: str, reps: int, quick: bool) -> dict[str, Any]:
    """``reps`` A/B pairs (plain, recorded) and as many A/A pairs (plain, plain), interleaved."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("paired_overhead needs two cores")
    out: dict[str, list[dict[str, float]]] = {"ab": [], "aa": []}
    with tempfile.TemporaryDirectory() as d:
        for side in ("a", "b"):
            (Path(d) / side).mkdir()
            (Path(d) / side / "train.py").write_text(source(name, quick))
        for rep in range(reps):
            # the core each side gets alternates every repetition, which side starts first every
            # second one: neither a faster core nor the first start favours one side
            order = (cores[0], cores[1]) if rep % 2 == 0 else (cores[1], cores[0])
            for kind in ("ab", "aa"):
                a, b = Side(Path(d) / "a", False), Side(Path(d) / "b", kind == "ab")
                if rep // 2 % 2 == 0:
                    _pair(a, b, order)
                else:
                    _pair(b, a, order[::-1])
                out[kind].append(
                    {
                        "a": a.to_exit,
                        "b": b.to_exit,
                        "ratio": b.to_exit / a.to_exit,
                        "held": b.held,
                        "core_a": order[0],
                        "a_first": rep // 2 % 2 == 0,
                    }
                )
                print(
                    f"{name} rep {rep} {kind}: plain {a.to_exit:.2f}s, {'recorded' if b.record else 'plain'}"
                    f" {b.to_exit:.2f}s ({b.to_exit / a.to_exit - 1:+.1%}){f', held {b.held:.1%}' if b.record else ''}",
                    file=sys.stderr,
                    flush=True,
                )
    summary: dict[str, Any] = {"pairs": out}
    for kind in ("ab", "aa"):
        summary[f"{kind}_overhead"], summary[f"{kind}_spread"] = median_spread(
            [p["ratio"] for p in out[kind]], 1
        )
    summary["held"], summary["held_spread"] = median_spread([p["held"] for p in out["ab"]])
    return summary


def main() -> None:
    args = workload_args(__doc__ or "", 4).parse_args()
    reps = 1 if args.quick else args.reps
    become_subreaper()
    for name in args.only:
        if name in EPOCH_S:  # one thread, as each side of a pair runs (alone, not beside another)
            calibrate(name, _ONE_THREAD)
    results = {name: bench(name, reps, args.quick) for name in args.only}
    for name, steps in _calibrated.items():
        results[name]["steps_per_epoch"] = steps
    doc: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "reps": reps,
        "quick": args.quick,
        "epsilon": 1 / 15,
        "threads_per_run": 1,
        "results": results,
    }
    if len(args.only) == len(WORKLOADS):
        doc["median_ab_overhead"] = statistics.median(r["ab_overhead"] for r in results.values())
        doc["median_aa_overhead"] = statistics.median(r["aa_overhead"] for r in results.values())
    save("paired_overhead" + ("-quick" if args.quick else ""), doc, lambda png: _plot(results, png))
    print(f"{'workload':10} {'recorded vs plain':>22} {'plain vs plain (A/A)':>24} {'held':>14}")
    for n, r in results.items():
        ab, aa, hs = r["ab_spread"], r["aa_spread"], r["held_spread"]
        print(
            f"{n:10} {r['ab_overhead']:+7.1%} ({ab[0]:+.1%}..{ab[1]:+.1%})"
            f" {r['aa_overhead']:+7.1%} ({aa[0]:+.1%}..{aa[1]:+.1%})"
            f" {r['held']:5.1%} ({hs[0]:.1%}..{hs[1]:.1%})"
        )
    if "median_ab_overhead" in doc:
        print(
            f"median over workloads: recorded {doc['median_ab_overhead']:+.1%}, A/A {doc['median_aa_overhead']:+.1%}"
        )


def _plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (kind, label) in enumerate(
        (("ab", "recorded vs plain"), ("aa", "plain vs plain (A/A control)"))
    ):
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        for x, n in zip(xs, names, strict=True):
            ratios = [100 * (p["ratio"] - 1) for p in results[n]["pairs"][kind]]
            ax.scatter([x] * len(ratios), ratios, color=f"C{k}", s=12, zorder=3)
        ax.bar(
            xs,
            [100 * results[n][f"{kind}_overhead"] for n in names],
            0.38,
            color=f"C{k}",
            alpha=0.5,
            label=label,
        )
    ax.axhline(100 / 15, color="red", linestyle="--", label="ε = 1/15")
    ax.axhline(2, color="grey", linestyle=":", label="2%")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("time to exit, % over the plain run beside it")
    ax.set_title("Record overhead, pairs run side by side (one core each)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
