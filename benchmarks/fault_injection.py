"""The fault-injection suite, long mode: many SIGKILLed records across fixtures and every kind of
store fault, with the figures that say whether a record can be trusted (trials, faults by kind,
exact replays, clean refusals, silent wrong answers, training runs broken by flortrain).

The harness and what each fault and outcome means are in tests/faults.py; the default test
command runs a short mode of it (tests/test_fault_injection.py). This is not a timing benchmark:
it counts outcomes. It is here because it takes minutes.

    python benchmarks/fault_injection.py [--quick] [--kills N] [--store-faults M] [--seed S]

Writes benchmarks/results/fault_injection.json and .png (``-quick`` in the name with --quick).
Exits 1 if any trial ended in a silent wrong answer or a broken training run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from record_overhead import commit  # noqa: E402

from tests.faults import KILL_FIXTURES, STORE_FAULTS, Tally, namespaces_available, run_suite  # noqa: E402

OUTCOMES = ("exact", "refused", "none", "wrong", "broken")
COLORS = {
    "exact": "#2e7d32",
    "refused": "#1565c0",
    "none": "#9e9e9e",
    "wrong": "#c62828",
    "broken": "#6a1b9a",
}


def plot(tally: Tally, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = sorted({t.fault for t in tally.trials})
    fig, ax = plt.subplots(figsize=(10, 4.5))
    left = [0] * len(faults)
    for outcome in OUTCOMES:
        counts = [
            sum(1 for t in tally.trials if t.fault == f and t.outcome == outcome) for f in faults
        ]
        if any(counts):
            ax.barh(faults, counts, left=left, color=COLORS[outcome], label=outcome)
            left = [a + b for a, b in zip(left, counts, strict=True)]
    ax.set_xlabel("trials")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few trials, to check the harness")
    ap.add_argument("--kills", type=int, default=36)
    ap.add_argument("--store-faults", type=int, default=2 * len(STORE_FAULTS))
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    kills, faults = (4, len(STORE_FAULTS)) if a.quick else (a.kills, a.store_faults)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flortrain-faults-") as tmp:
        tally = run_suite(
            Path(tmp), a.seed, kills=kills, store_faults=faults, fixtures=KILL_FIXTURES, log=True
        )
    figures = tally.figures()
    result = {
        "benchmark": "fault_injection",
        "seed": a.seed,
        "commit": commit(),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "user_namespaces": namespaces_available(),
        "seconds": round(time.perf_counter() - t0, 1),
        **figures,
        "trials_detail": [vars(t) for t in tally.trials],
    }
    suffix = "-quick" if a.quick else ""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"fault_injection{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(
        tally,
        OUT / f"fault_injection{suffix}.png",
        f"fault injection: {figures['trials']} trials, seed {a.seed}: "
        f"{figures['silent_wrong_answers']} wrong, {figures['training_runs_broken']} broken",
    )
    print(json.dumps(figures, indent=2))
    return 1 if tally.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
