"""Record overhead and replay speedup, measured side by side in one run.

For each workload, R repetitions of (interleaved, so drift affects all equally):
- ``python S``                      plain run (ground truth and baseline)
- ``flortrain record S``            record with the default adaptive period
- ``python S'``                     plain run of S with an outer probe (what a user would re-run)
- ``flortrain replay S'``           partial replay: memoized loops skipped
- ``python S''`` / ``replay S''``   an inner probe: the probed loop re-executes

Wall-clock medians end to end, process start-up included (that is what a user waits for).
Writes benchmarks/results/record_replay.json and .png: the latest result of each workload, so
that ``--workload NAME`` replaces that workload's and keeps the others', each naming the commit
and the machine it measured. A replay re-executes with a steady heap (``runtime/allocator.py``);
run with ``FLORTRAIN_REPLAY_ALLOCATOR=default`` in the environment to measure it without.

    python benchmarks/record_replay.py [--reps 5] [--workload NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
# _HELD: the pattern of record's closing line, kept once
from record_overhead import _HELD, commit  # noqa: E402
from record_overhead import source as overhead_source  # noqa: E402

#: The floor every run pays before training: the interpreter, torch, and the first optimizer
#: (which imports torch._dynamo).
STARTUP = "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)"
OUT = ROOT / "benchmarks" / "results"
#: Start-up medians of repeated runs spread by about this much here: work beyond the floor that
#: is smaller is not measured, and ratios of it are not reported.
FLOOR_NOISE_S = 0.5

REALCODE = ROOT / "fixtures" / "realcode"

#: nanoGPT at a small but not toy size (64-dim embeddings, 32-token context, 400 iterations): an
#: iteration computes for several times what checkpointing its state costs, as in real runs
#: (at the fixture's 16-dim size, checkpointing costs about what an iteration does)
NANOGPT_EDITS = {
    "max_iters = 60 ": "max_iters = 400 ",
    "lr_decay_iters = 60 ": "lr_decay_iters = 400 ",
    "n_embd = 16\n": "n_embd = 64\n",
    "block_size = 8\n": "block_size = 32\n",
    "batch_size = 8 ": "batch_size = 16 ",
}

WORKLOADS: dict[
    str,
    tuple[Path | str, list[str], tuple[str, str] | None, tuple[str, str] | None, dict[str, str]],
] = {
    # name: (source file, args, outer probe (after, statement), inner probe (after, statement),
    #        edits to the source that make the run long enough to measure beyond start-up)
    # None for a probe: use the file's `# flortrain-probe outer/inner:` marker
    # training dominates: an epoch costs far more than checkpointing its loop
    "example-40-epochs": (
        ROOT / "examples" / "train.py",
        ["--epochs", "40"],
        ("        scheduler.step()\n", "        print('PROBE', model[0].weight.norm().item())\n"),
        (
            "        loss.backward()\n",
            "        print('PROBE', model[0].weight.grad.norm().item())\n",
        ),
        {},
    ),
    # record_overhead's CNN (a source text, not a file): large tensors freed and allocated at
    # every step, where a re-executing replay's steady heap shows (runtime/allocator.py)
    "cnn": (
        overhead_source("cnn", quick=False),
        [],
        ("    model.train()\n", "    print('PROBE', model.fc1.weight.norm().item())\n"),
        (
            "        opt.step()\n",
            "        if i == 0: print('PROBE', epoch, model.fc1.weight.norm().item())\n",
        ),
        {},
    ),
    # start-up dominates, and a 6 ms epoch costs about as much as its checkpoint: Eq. 4 declines
    # to checkpoint after the first instance, so replay re-executes nearly everything
    "fixture-module-level": (
        ROOT / "fixtures" / "module_level.py",
        ["--epochs", "8"],
        None,
        None,
        {},
    ),
    # nanoGPT's shape: `while True` over iterations, micro-steps, a ddp-guarded attribute
    "realcode-nanogpt": (
        REALCODE / "nanogpt.py",
        [],
        None,
        None,
        NANOGPT_EDITS,
    ),
    # the same, with the outer probe guarded as nanoGPT guards its own logging
    # (`if iter_num % log_interval == 0`): iteration spans jump over the iterations between
    "realcode-nanogpt-logged": (
        REALCODE / "nanogpt.py",
        [],
        (
            "    optimizer.zero_grad(set_to_none=True)\n",
            '    if iter_num % 50 == 0: print(f"PROBE outer {iter_num}'
            ' {sum(p.detach().abs().sum().item() for p in raw_model.parameters()):.10f}")\n',
        ),
        None,
        NANOGPT_EDITS,
    ),
    # pytorch/examples word_language_model: hidden state carried across batches, evaluate()
    "realcode-word_language_model": (
        REALCODE / "word_language_model.py",
        ["--emsize", "128", "--nhid", "128", "--epochs", "6", "--log-interval", "200"],
        None,
        None,
        {"self._generate(rng, succ, 2048)": "self._generate(rng, succ, 65536)"},
    ),
}


def _marker(text: str, kind: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        s = line.strip()
        prefix = f"# flortrain-probe {kind}: "
        if s.startswith(prefix):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + s[len(prefix) :] + "\n")
        else:
            out.append(line)
    return "".join(out)


def _insert(text: str, after: str, stmt: str) -> str:
    assert after in text, after
    return text.replace(after, after + stmt, 1)


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str, str]:
    """(wall seconds, stdout, stderr) of ``cmd``, which must succeed."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return dt, p.stdout, p.stderr


def _probe_lines(out: str) -> list[str]:
    """The lines this benchmark's probes print (each starts with ``PROBE``)."""
    return [line for line in out.splitlines() if line.startswith("PROBE")]


def checkpoints(store: Path) -> dict[str, dict[str, int]]:
    """Per memoized loop (and main loop, for its iteration boundaries) of the latest record: how
    many instances ended in each state (``checkpointed``, ``recorded``: not checkpointed)."""
    db = sqlite3.connect(store / "flortrain.db")
    try:
        (rid,) = db.execute("SELECT MAX(id) FROM runs WHERE kind='record'").fetchone()
        rows = db.execute(
            "SELECT block_id, state, COUNT(*) FROM blocks WHERE run_id=? GROUP BY 1, 2", (rid,)
        )
        out: dict[str, dict[str, int]] = {}
        for block, state, n in rows:
            out.setdefault(block, {})[state] = n
        return out
    finally:
        db.close()


def edited_source(name: str) -> str:
    """The workload's script with its edits applied (the size that makes it worth measuring);
    an edit whose text the source no longer has stops the benchmark."""
    src, _, _, _, edits = WORKLOADS[name]
    base = src.read_text() if isinstance(src, Path) else src
    for old, new in edits.items():
        if old not in base:
            raise SystemExit(f"{name}: the source no longer has {old!r}: update its edits")
        base = base.replace(old, new)
    return base


def bench(name: str, reps: int) -> dict[str, Any]:
    _, args, outer, inner, _ = WORKLOADS[name]
    base = edited_source(name)
    s_outer = _insert(base, *outer) if outer else _marker(base, "outer")
    s_inner = _insert(base, *inner) if inner else _marker(base, "inner")
    env = {**os.environ}
    ft = [sys.executable, "-m", "flortrain"]
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "startup",
            "plain",
            "record",
            "plain_outer",
            "replay_outer",
            "plain_inner",
            "replay_inner",
        )
    }
    held: list[float] = []
    saved: list[dict[str, dict[str, int]]] = []
    exact = {"outer": 0, "inner": 0}

    def run(key: str, cmd: list[str]) -> tuple[str, str]:
        dt, out, err = timed(cmd, cwd, env)
        times[key].append(dt)
        return out, err

    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        script = cwd / "train.py"
        for _ in range(reps):
            shutil.rmtree(cwd / ".flortrain", ignore_errors=True)
            script.write_text(base)
            run("startup", [sys.executable, "-c", STARTUP])
            run("plain", [sys.executable, "train.py", *args])
            _, err = run("record", [*ft, "record", "train.py", *args])
            held.append(float(m.group(1)) / 100 if (m := _HELD.search(err)) else 0.0)
            saved.append(checkpoints(cwd / ".flortrain"))
            for probe, text in (("outer", s_outer), ("inner", s_inner)):
                script.write_text(text)
                want, _ = run(f"plain_{probe}", [sys.executable, "train.py", *args])
                got, _ = run(f"replay_{probe}", [*ft, "replay", "train.py"])
                # the correctness protocol (DESIGN.md): a replay prints the probe lines a plain run of
                # the probed script prints, identical and in the same order
                exact[probe] += bool(_probe_lines(want)) and _probe_lines(got) == _probe_lines(want)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med["startup"]

    def beyond_startup(a: str, b: str) -> float | None:
        """None when either side is within the floor's own run-to-run spread of the floor: a
        ratio of two noise-sized numbers would be meaningless (even negative)."""
        if min(med[a], med[b]) - floor < FLOOR_NOISE_S:
            return None
        return (med[a] - floor) / (med[b] - floor)

    return {
        "workload": name,
        "reps": reps,
        "median_s": med,
        "samples_s": times,
        "record_overhead": med["record"] / med["plain"] - 1.0,
        "held": statistics.median(held),
        "checkpoints": saved,
        "exact_replays": exact,
        "outer_probe_speedup": med["plain_outer"] / med["replay_outer"],
        "inner_probe_speedup": med["plain_inner"] / med["replay_inner"],
        # the same ratios with the interpreter + torch start-up floor taken out of both sides:
        # what they tend to as training gets longer
        "record_overhead_beyond_startup": None
        if (x := beyond_startup("record", "plain")) is None
        else x - 1.0,
        "outer_probe_speedup_beyond_startup": beyond_startup("plain_outer", "replay_outer"),
        "inner_probe_speedup_beyond_startup": beyond_startup("plain_inner", "replay_inner"),
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["plain", "record", "plain_outer", "replay_outer", "plain_inner", "replay_inner"]
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        med = r["median_s"]
        assert isinstance(med, dict)
        ax.bar(
            labels, [med[k] for k in labels], color=["#888", "#c44", "#888", "#48c", "#888", "#48c"]
        )
        ax.axhline(med["startup"], color="k", linestyle=":", linewidth=1, label="start-up floor")
        ax.legend(fontsize=8)
        ax.set_title(
            f"{r['workload']}: record {100 * float(r['record_overhead']):+.0f}%, outer probe"
            f" {float(r['outer_probe_speedup']):.2f}x",
            fontsize=9,
        )
        ax.set_ylabel("median wall time (s)")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = {
        "commit": commit(),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "replay_allocator": os.environ.get("FLORTRAIN_REPLAY_ALLOCATOR", "steady"),
    }
    results = [{**bench(w, a.reps), **stamp} for w in (a.workload or list(WORKLOADS))]
    latest = {r["workload"]: r for r in _kept(OUT / "record_replay.json")} | {
        r["workload"]: r for r in results
    }
    kept = [latest[w] for w in WORKLOADS if w in latest]
    (OUT / "record_replay.json").write_text(json.dumps({"results": kept}, indent=2))
    plot(kept, OUT / "record_replay.png")
    for r in results:
        med = r["median_s"]
        assert isinstance(med, dict)
        print(
            f"{r['workload']}: plain {med['plain']:.2f}s record {med['record']:.2f}s"
            f" ({100 * float(r['record_overhead']):+.1f}%); outer probe {med['plain_outer']:.2f}s ->"
            f" {med['replay_outer']:.2f}s ({float(r['outer_probe_speedup']):.2f}x); inner probe"
            f" {med['plain_inner']:.2f}s -> {med['replay_inner']:.2f}s ({float(r['inner_probe_speedup']):.2f}x)"
        )
        print(
            f"  beyond the {med['startup']:.2f}s start-up floor: record"
            f" {_shown(r['record_overhead_beyond_startup'], pct=True)}, outer probe"
            f" {_shown(r['outer_probe_speedup_beyond_startup'])}, inner probe"
            f" {_shown(r['inner_probe_speedup_beyond_startup'])}"
        )
        saved = r["checkpoints"]
        assert isinstance(saved, list)
        print(
            f"  held {100 * float(r['held']):.1f}%; exact replays {r['exact_replays']} of {r['reps']};"
            " checkpointed, last record: "
            + ", ".join(_counts(b, s) for b, s in sorted(saved[-1].items()))
        )


def _kept(path: Path) -> list[dict[str, Any]]:
    """The workloads' results in the result file ``path``, or none if there is no such file."""
    try:
        results = json.loads(path.read_text()).get("results", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in results if isinstance(r, dict) and r.get("workload") in WORKLOADS]


def _counts(block: str, states: dict[str, int]) -> str:
    """A memoized loop's instances checkpointed of all; a main loop's boundary checkpoints (its
    rows are only those)."""
    if "boundary" in states:
        return f"{block} {states['boundary']} boundaries"
    return f"{block} {states.get('checkpointed', 0)}/{sum(states.values())}"


def _shown(v: object, pct: bool = False) -> str:
    if v is None:
        return "n/a (within the floor's noise)"
    return f"{100 * float(v):+.1f}%" if pct else f"{float(v):.2f}x"  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
