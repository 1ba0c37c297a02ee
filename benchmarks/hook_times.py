"""What flortrain's hooks cost, one by one, inside a record of each workload shape.

``record_overhead.py`` measures what a record costs; this says where it goes. Each record runs
``flortrain record`` in a child process whose hooks are wrapped to time every call (the
launcher off, so the script runs in the process that was wrapped), and reports, per hook, its
calls per record, its median time per call and its total per epoch.

Why in a record and not in a loop of calls: after a training step the hook's code and data are
out of the caches. ``rng.capture`` takes about 37 µs called in a loop and 80 to 130 µs at a
main-loop boundary of the fine-tuning shape; only the calls as training makes them
say what training pays. The wrappers add a few microseconds to each call timed, and a hook's
time includes the hooks timed inside it (the indented rows).

The times go to a file descriptor, not to a Python object: the record's side-effect audit
walks what the script can reach, the wrappers' closures included, and a list that grows would
be a side effect of the loop it does not name.

A step loop pays its hooks at every step, not every epoch: ``--only nanogpt`` times them in
``record_replay.py``'s nanoGPT shape (the fixture at 64 dimensions, 400 iterations of about
20 ms), where an "epoch" below is one main-loop iteration.

``python benchmarks/hook_times.py [--only finetune nanogpt] [--reps 3] [--quick]`` writes
``results/hook_times.json`` and ``.png``: the latest result of each workload, so that a run of
some keeps the others' (when it ran with the same settings), each naming its commit.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_overhead  # the workloads and their calibration
import record_replay  # nanoGPT's shape

#: Step-loop workloads beside record_overhead's: name -> (record_replay's workload, its main
#: loop's iterations)
STEP_LOOPS = {"nanogpt": ("realcode-nanogpt", 400)}

#: (label, module, attribute path, depth): what is timed, in the order the report lists it;
#: depth is how deep in the rows above it a call runs
HOOKS: tuple[tuple[str, str, str, int], ...] = (
    ("main_iteration()", "flortrain.runtime", "main_iteration", 0),
    ("boundary checkpoint", "flortrain.runtime.recording", "RecordSession._record_boundary", 1),
    ("boundary RNG digests", "flortrain.runtime.session", "Session._boundary_digests", 1),
    ("boundary scalars", "flortrain.runtime.recording", "scalars_json", 1),
    # every boundary's, and every checkpoint payload's: one function, whoever calls it
    ("RNG capture (boundaries, payloads)", "flortrain.runtime.rng", "capture", 1),
    ("side-effect audit", "flortrain.runtime.recording", "RecordSession._audit_iteration", 1),
    ("block()", "flortrain.runtime", "block", 0),
    ("end()", "flortrain.runtime.skipblock", "SkipBlock.end", 0),
    ("alias watch", "flortrain.runtime.skipblock", "SkipBlock._learn_light", 1),
    ("checkpoint", "flortrain.runtime.recording", "RecordSession.checkpoint", 1),
    ("payload", "flortrain.runtime.checkpointable", "Checkpointable._payload", 2),
    ("state capture", "flortrain.runtime.checkpointable", "capture_named", 3),
    ("submit", "flortrain.checkpoint.materializer", "BackgroundMaterializer.submit", 2),
    ("stage (split, pickle)", "flortrain.checkpoint.skeleton", "stage", 3),
    ("send to writer", "flortrain.channel", "Channel.send", 3),
)


def child(script: str, times: str) -> None:
    """Run ``flortrain record script`` in this process with every hook of :data:`HOOKS` timed."""
    import importlib
    import time

    fd = os.open(times, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for label, module, path, _ in HOOKS:
        owner: Any = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        setattr(owner, name, _timed(getattr(owner, name), label, fd, time.perf_counter))
    from flortrain import cli

    sys.argv = ["flortrain", "record", script]
    cli.main()


def _timed(f: Any, label: str, fd: int, clock: Any) -> Any:
    tag = label.encode() + b"\t"

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return f(*args, **kwargs)
        finally:
            os.write(fd, tag + repr(clock() - t0).encode() + b"\n")

    return timed


def _source(name: str, quick: bool) -> tuple[str, int]:
    """The workload's script and its epochs (a step loop's: its iterations)."""
    if name not in STEP_LOOPS:
        return record_overhead.source(name, quick), record_overhead.WORKLOADS[name][2] // (
            2 if quick else 1
        )
    workload, iterations = STEP_LOOPS[name]
    return record_replay.edited_source(workload), iterations


def measure(name: str, reps: int, quick: bool) -> dict[str, Any]:
    """Time the hooks in ``reps`` records of a workload; per hook, the medians over records."""
    text, epochs = _source(name, quick)
    per_record: list[dict[str, list[float]]] = []
    held: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "train.py").write_text(text)
        for rep in range(reps):
            times = work / f"times{rep}.tsv"
            env = {
                **os.environ,
                **record_overhead.STEADY_ALLOCATOR,
                "FLORTRAIN_LAUNCHER": "off",
                "FLORTRAIN_STORE": str(work / f"store{rep}"),
            }
            done = subprocess.run(
                [sys.executable, __file__, "--child", "train.py", str(times)],
                cwd=work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                check=True,
            )
            m = record_overhead._HELD.search(done.stderr)
            held.append(float(m.group(1)) / 100 if m else float("nan"))
            calls: dict[str, list[float]] = {}
            for line in times.read_text().splitlines():
                label, seconds = line.split("\t")
                calls.setdefault(label, []).append(float(seconds))
            per_record.append(calls)
            print(f"{name} record {rep}: held {held[-1]:.1%}", file=sys.stderr)
    hooks = {}
    for label, _, _, depth in HOOKS:
        seen = [c.get(label, []) for c in per_record]
        if not any(seen):
            continue
        hooks[label] = {
            "depth": depth,
            "calls": statistics.median(len(s) for s in seen),
            "per_call_us": statistics.median(1e6 * statistics.median(s) for s in seen if s),
            "per_epoch_ms": statistics.median(1e3 * sum(s) / epochs for s in seen),
        }
    return {
        "epochs": epochs,
        "held": statistics.median(held),
        "hooks": hooks,
        "steps_per_epoch": None
        if name in STEP_LOOPS
        else record_overhead._calibrated.get(name, record_overhead.WORKLOADS[name][1]),
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    ap = record_overhead.workload_args(__doc__ or "", 3, extra=tuple(STEP_LOOPS))
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    for name in args.only:
        if name in record_overhead.EPOCH_S:
            record_overhead.calibrate(name, record_overhead.STEADY_ALLOCATOR)
    results = {name: measure(name, reps, args.quick) for name in args.only}
    stem = "hook_times" + ("-quick" if args.quick else "")
    doc = record_overhead.merge_by_workload(
        stem, {"reps": reps, "quick": args.quick, "results": results}
    )
    record_overhead.save(stem, doc, lambda png: _plot(doc["results"], png), stamp=False)
    for name, r in results.items():
        print(f"{name}: {r['epochs']} epochs (main-loop iterations), held {r['held']:.1%}")
        print(f"  {'hook':38} {'calls':>6} {'per call':>10} {'per epoch':>10}")
        for label, h in r["hooks"].items():
            print(
                f"  {'  ' * h['depth'] + label:38} {h['calls']:6.0f} {h['per_call_us']:8.0f}µs {h['per_epoch_ms']:8.3f}ms"
            )


def _plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.5), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        labels = [("  " * h["depth"]) + label for label, h in r["hooks"].items()]
        ax.barh(range(len(labels)), [h["per_epoch_ms"] for h in r["hooks"].values()])
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms per epoch (a row includes the rows indented below it)", fontsize=8)
        ax.set_title(f"{name}: held {r['held']:.1%} of training", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
