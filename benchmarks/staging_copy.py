"""Two ways a checkpoint's staging copy might be cut, measured inside the workloads' own loops.

The staging copy (each changed tensor into the shared arena, ``BackgroundMaterializer.submit``)
is the largest single thing a checkpoint holds the training thread for: about 6.5 ms of the CNN
shape's 8.3 ms a checkpoint, about 3 of the LSTM's 4.6 (``hook_times.py``).
Two ideas would take part of it off the training thread, and both depend on what training
leaves free, so they are measured where training runs, not in a loop of copies:

- **Overlap.** Copy on a thread while the next epoch's first step runs its forward and
  backward, and make the training thread wait for the copy only before that step's optimizer
  update (the first write to the parameters). If a step left a core idle, the copy would cost
  training nothing.
- **Placement.** The arena is a ring: while the writer holds earlier checkpoints, the next one
  is staged further along, on pages warmed but not touched since. Copying into the same pages
  every time may be faster than into the next region of the ring.

How: the workload's script (``record_overhead.source``) runs in a child process with two calls
spliced in: ``_stage()`` where an outer probe goes (the end of each epoch), and
``_before_step()`` and ``_after_step()`` around each ``opt.step()``. Epochs take the modes in
turn, so every mode meets the same training state and the same machine, side by side:

- ``none``: nothing is staged (the baseline);
- ``fixed``: every parameter and optimizer tensor is copied on the training thread into a 256 MB
  warmed shared mapping (``arena.populate``, as record warms its arena), at its start each time;
- ``ring``: the same copy, each checkpoint at the next region of the mapping, as the arena
  places checkpoints while the writer holds earlier ones;
- ``overlap``: the ``fixed`` copy on a thread, joined before the next epoch's first optimizer
  update.

Per epoch it reports the staging call's time on the training thread (``held``) and the time
from the call's start to the end of the next epoch's first optimizer update (``to step``: what
the copy costs training in all, the step included). Once training is over, each process also
times copies in a row with nothing else running, per placement (the same pages each time, two
regions in turn, the ring's next region): what a loop of copies says, for comparison. The
fine-tuning shape is left out: what it stages per epoch is a 5 KB head (its frozen table is
unchanged, so it is not copied).

``python benchmarks/staging_copy.py [--only cnn rnn] [--reps 2] [--quick]`` writes
``results/staging_copy.json`` and ``.png``.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_overhead  # the workloads

from flortrain.store.direct import aligned

MODES = ("none", "fixed", "ring", "overlap")
#: the workloads whose per-epoch staging is large enough to matter
SHAPES = ("cnn", "rnn")
#: epochs per child process: each mode measured 10 (CNN) or 20 (LSTM) times after the first turn
EPOCHS = {"cnn": 44, "rnn": 84}
#: the mapping staged into (record's default warm arena)
ARENA = 256 << 20

STEP = "\n        opt.step()\n"


def script(name: str, epochs: int) -> str:
    """The workload's script with the two measuring calls spliced in."""
    text = record_overhead.source(name, quick=False, probe=True, epochs=epochs)
    _, _, _, stmt = record_overhead.WORKLOADS[name]
    if STEP not in text or f"    {stmt}\n" not in text:
        raise SystemExit(
            f"staging_copy.py: the {name} workload has no `opt.step()` or probe line to splice into"
        )
    text = text.replace(STEP, "\n        _before_step()" + STEP + "        _after_step()\n")
    return text.replace(f"    {stmt}\n", "    _stage()\n")


class Stager:
    """The spliced calls: stage the model's and optimizer's tensors by the epoch's mode, and
    time what that costs the training thread."""

    def __init__(self, ns: dict[str, Any]) -> None:
        from flortrain.checkpoint import arena

        self.ns = ns
        self.area = mmap.mmap(-1, ARENA, flags=mmap.MAP_SHARED)
        if not arena.populate(self.area, 0, ARENA):
            self.area[:] = bytes(ARENA)  # an older kernel: touch every page instead
        import torch

        self.whole = torch.frombuffer(self.area, dtype=torch.uint8)
        self.epoch = 0
        self.ring_at = 0
        self.thread: threading.Thread | None = None
        self.started: float | None = None
        self.rows: list[dict[str, Any]] = []
        self.copy_s = 0.0

    def tensors(self) -> list[Any]:
        import torch

        out = list(self.ns["model"].parameters())
        for state in self.ns["opt"].state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return out

    def copy(self, at: int) -> None:
        """Copy every tensor into the mapping from ``at``, each at a page-aligned offset, as the
        materializer places large tensors."""
        t0 = time.perf_counter()
        for t in self.tensors():
            n = t.numel() * t.element_size()
            self.whole[at : at + n].view(t.dtype).view(t.shape).copy_(t)
            at += aligned(n)
        self.copy_s = time.perf_counter() - t0

    def size(self) -> int:
        return sum(aligned(t.numel() * t.element_size()) for t in self.tensors())

    def stage(self) -> None:
        mode = MODES[self.epoch % len(MODES)]
        self.epoch += 1
        self.started = time.perf_counter()
        if mode == "fixed":
            self.copy(0)
        elif mode == "ring":
            size = self.size()
            if self.ring_at + size > ARENA:
                self.ring_at = 0
            self.copy(self.ring_at)
            self.ring_at += size
        elif mode == "overlap":
            self.thread = threading.Thread(target=self.copy, args=(0,))
            self.thread.start()
        held = time.perf_counter() - self.started
        self.rows.append({"mode": mode, "held": held})

    def loop(self, copies: int = 40) -> dict[str, float]:
        """The median of ``copies`` copies in a row, training over, per placement (ms): the same
        pages each time, two regions in turn, or the ring's next region."""
        size = self.size()
        out = {}
        for label, regions in (("fixed", 1), ("two regions", 2), ("ring", ARENA // size)):
            times = []
            for i in range(copies):
                self.copy((i % regions) * size)
                times.append(self.copy_s)
            out[label] = 1e3 * statistics.median(times[copies // 8 :])
        return out

    def before_step(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def after_step(self) -> None:
        if self.started is not None:
            self.rows[-1]["to_step"] = time.perf_counter() - self.started
            self.rows[-1]["copy"] = self.copy_s if self.rows[-1]["mode"] != "none" else 0.0
            self.started = None


def child(name: str, epochs: int, out: str) -> None:
    """Run the spliced workload in this process; write each epoch's row to ``out``."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    stager = Stager(ns)
    ns.update(_stage=stager.stage, _before_step=stager.before_step, _after_step=stager.after_step)
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            exec(compile(script(name, epochs), f"<{name}>", "exec"), ns)
        finally:
            sys.stdout = stdout
    rows = [
        r for r in stager.rows[len(MODES) :] if "to_step" in r
    ]  # the first turn of modes warms up
    loop = stager.loop()
    Path(out).write_text(json.dumps({"staged_mb": stager.size() / 1e6, "rows": rows, "loop": loop}))


def measure(name: str, reps: int, quick: bool) -> dict[str, Any]:
    """Rows from ``reps`` child processes of a workload; per mode, medians in ms."""
    epochs = EPOCHS[name] // (3 if quick else 1)
    rows: list[dict[str, Any]] = []
    loops: list[dict[str, float]] = []
    staged_mb = 0.0
    with tempfile.TemporaryDirectory() as d:
        for rep in range(reps):
            out = Path(d) / f"{rep}.json"
            env = {**os.environ, **record_overhead.STEADY_ALLOCATOR}
            subprocess.run(
                [sys.executable, __file__, "--child", name, str(epochs), str(out)],
                env=env,
                check=True,
            )
            got = json.loads(out.read_text())
            rows += got["rows"]
            loops.append(got["loop"])
            staged_mb = got["staged_mb"]
            print(f"{name} run {rep}: {len(got['rows'])} epochs measured", file=sys.stderr)
    modes: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        modes[mode] = {
            "epochs": len(mine),
            **{
                f"{k}_ms": 1e3 * statistics.median(r[k] for r in mine)
                for k in ("held", "to_step", "copy")
            },
            "to_step_spread_ms": [
                1e3 * min(r["to_step"] for r in mine),
                1e3 * max(r["to_step"] for r in mine),
            ],
        }
    base = modes["none"]["to_step_ms"]
    for mode in MODES:
        modes[mode]["costs_training_ms"] = modes[mode]["to_step_ms"] - base
    loop = {label: statistics.median(lp[label] for lp in loops) for label in loops[0]}
    return {"staged_mb": staged_mb, "modes": modes, "loop_ms": loop}


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    ap = record_overhead.workload_args(__doc__ or "", 2)
    ap.set_defaults(only=list(SHAPES))
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    shapes = [n for n in args.only if n in SHAPES]
    if not shapes:
        raise SystemExit(f"staging_copy.py: measures {', '.join(SHAPES)} only")
    results = {name: measure(name, reps, args.quick) for name in shapes}
    stem = "staging_copy" + ("-quick" if args.quick else "")
    doc = record_overhead.merge_by_workload(
        stem, {"reps": reps, "quick": args.quick, "results": results}
    )
    record_overhead.save(stem, doc, lambda png: _plot(doc["results"], png), stamp=False)
    for name, r in results.items():
        print(f"{name}: {r['staged_mb']:.1f} MB staged per epoch")
        print(
            f"  {'mode':8} {'epochs':>6} {'held':>8} {'copy':>8} {'to step':>9} {'costs training':>15}"
        )
        for mode, m in r["modes"].items():
            print(
                f"  {mode:8} {m['epochs']:6d} {m['held_ms']:6.2f}ms {m['copy_ms']:6.2f}ms"
                f" {m['to_step_ms']:7.2f}ms {m['costs_training_ms']:13.2f}ms"
            )
        print(
            "  copies in a row, training over: "
            + ", ".join(f"{k} {v:.2f}ms" for k, v in r["loop_ms"].items())
        )


def _plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        modes = [m for m in MODES if m != "none"]
        x = range(len(modes))
        ax.bar(
            [i - 0.2 for i in x],
            [r["modes"][m]["held_ms"] for m in modes],
            width=0.4,
            label="held by the call",
        )
        ax.bar(
            [i + 0.2 for i in x],
            [r["modes"][m]["costs_training_ms"] for m in modes],
            width=0.4,
            label="to the first update, less none's",
        )
        ax.set_xticks(list(x), modes)
        ax.set_ylabel("ms per checkpoint (median)")
        ax.set_title(f"{name}: {r['staged_mb']:.0f} MB staged", fontsize=9)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
