"""Where a record's overhead comes from: plain runs alternated with records that each leave out
one part of what a record does, on one workload shape.

``record_overhead.py`` measures what a record costs and ``hook_times.py`` what each hook takes on
the training thread. Neither says whether the overhead beyond what a record reports it *held*
training up comes from the training thread or from elsewhere: the writer's CPU on cores training
uses, the disk, the caches a hook leaves cold. Here each variant takes one part away, and the
difference with a default record is what that part costs the loop. The default variants:

- ``no-checkpoints``: ``--epsilon 1e-9``; every hook runs and no checkpoint is taken, the fixed
  cost of the instrumentation;
- ``writer-fails``: ``FLORTRAIN_INJECT=writer-fail=1``; every checkpoint is captured and staged
  as usual, and the writer fails it at once (as on a full disk), so it neither hashes nor writes;
- ``tmpfs-store``: the store on ``/dev/shm``, no disk I/O;
- ``sync``: ``FLORTRAIN_MATERIALIZER=sync``, serialized and written on the training thread.

``--inner`` adds two clock reads to each step of the workload's batch loop and sums, per run,
the time from each instance's first step to the end of its last: the training steps alone, with
no hook in them. A record whose steps take longer than a plain run's pays something the hooks
leave behind (cold caches, a heap laid out differently, a core taken by the writer).

Every repetition also runs ``plain-control``, a second plain run compared with the first as a
record is (an A/A control): what the pairs cannot resolve. Every run uses the steady allocator
(``record_overhead.STEADY_ALLOCATOR``), as the bar does. The order of the modes rotates by
repetition, so that over as many repetitions as there are modes every mode runs in every
position once.

    python benchmarks/record_variants.py [--only finetune] [--reps 8] [--inner] [--quick]
        [--variant NAME=KEY:VALUE,...]...

A ``--variant`` replaces the defaults: ``epsilon:X`` passes ``--epsilon X``, ``store:tmpfs`` puts
the store on ``/dev/shm``, any other key is an environment variable (``FLORTRAIN_PERIOD:every``).
Writes ``results/record_variants.json`` and ``.png`` (``-quick`` added with ``--quick``): the
latest result of each shape, so that a run of one keeps the others' when it ran with the same
settings, each naming its commit.
"""

from __future__ import annotations

import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_overhead import (
    EPOCH_S,
    STEADY_ALLOCATOR,
    WORKLOADS,
    _calibrated,
    _record_rows,
    _run,
    become_subreaper,
    calibrate,
    interval,
    median_spread,
    merge_by_workload,
    save,
    source,
    workload_args,
)

DEFAULT_VARIANTS = (
    "no-checkpoints=epsilon:1e-9",
    "writer-fails=FLORTRAIN_INJECT:writer-fail=1",
    "tmpfs-store=store:tmpfs",
    "sync=FLORTRAIN_MATERIALIZER:sync",
)

_STEP = re.compile(r"^(    for i in .*:\n)", re.M)
_STEPPED = "        opt.step()\n"
_EPOCH_LINE = '    print(f"epoch {epoch}'
_TMPFS = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME=KEY:VALUE,...`` as (name, settings); raises ``ValueError`` saying what is wrong."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or name in ("plain", "plain-control", "record"):
        raise ValueError(
            f"--variant {spec!r}: expected NAME=KEY:VALUE,... with a NAME other than plain, plain-control"
            " or record"
        )
    settings: dict[str, str] = {}
    for pair in filter(None, rest.split(",")):
        key, sep, value = pair.partition(":")
        if not sep or not key:
            raise ValueError(f"--variant {spec!r}: {pair!r} is not KEY:VALUE")
        settings[key] = value
    return name, settings


def timed_steps(text: str) -> str:
    """The workload's script with its batch loop's steps timed: ``_steps`` sums, over the
    instances, the time from the start of the first step to the end of the last, written beside
    the loop's end time (``t0.end.steps``)."""
    if len(_STEP.findall(text)) != 1 or text.count(_STEPPED) != 1 or text.count(_EPOCH_LINE) != 1:
        raise ValueError("the workload's batch loop is not where --inner looks for it")
    text = _STEP.sub(r"\1        if i == 0:\n            _t_a = time.perf_counter()\n", text)
    text = text.replace(_STEPPED, _STEPPED + "        _t_b = time.perf_counter()\n")
    text = text.replace("for epoch in range(", "_steps = 0.0\nfor epoch in range(", 1)
    text = text.replace(_EPOCH_LINE, "    _steps += _t_b - _t_a\n" + _EPOCH_LINE, 1)
    return text + (
        'if os.environ.get("BENCH_T0"):\n'
        '    with open(os.environ["BENCH_T0"] + ".end.steps", "w") as f:\n'
        "        f.write(repr(_steps))\n"
    )


def command(
    mode: str, settings: dict[str, str] | None, work: Path, rep: int
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one run of ``mode`` (``settings`` None: a plain run)."""
    env = {**STEADY_ALLOCATOR, "FLORTRAIN_STORE": str(work / f"{mode}-{rep}")}
    if settings is None:
        return [sys.executable, "train.py"], env
    args: list[str] = []
    for key, value in settings.items():
        if key == "epsilon":
            args = ["--epsilon", value]
        elif key == "store" and value == "tmpfs":
            env["FLORTRAIN_STORE"] = str(_TMPFS / f"flortrain-variants-{work.name}-{mode}-{rep}")
        else:
            env[key] = value
    return [sys.executable, "-m", "flortrain", "record", *args, "train.py"], env


def bench(
    name: str, variants: dict[str, dict[str, str]], reps: int, quick: bool, inner: bool
) -> dict[str, Any]:
    # ``plain-control``, a second plain run compared with the first as a record is: every
    # variant's ratio has the same plain runs below it, so a few fast ones would move them all
    # alike, and the control shows it
    modes: dict[str, dict[str, str] | None] = {
        "plain": None,
        "plain-control": None,
        "record": {},
        **variants,
    }
    order = list(modes)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        text = source(name, quick)
        (work / "train.py").write_text(timed_steps(text) if inner else text)
        for rep in range(reps):
            turn = order[rep % len(order) :] + order[: rep % len(order)]
            for mode in turn:
                cmd, env = command(mode, modes[mode], work, rep)
                t = _run(cmd, work, env)
                run: dict[str, Any] = {"loop": t[2], "to_exit": t[0], "held": t[4]}
                if inner:
                    run["steps"] = float((work / "t0.end.steps").read_text())
                if modes[mode] is not None:
                    store = Path(env["FLORTRAIN_STORE"])
                    (done, total), boundaries = _record_rows(store)
                    run.update(checkpointed=done, instances=total, boundaries=boundaries)
                    shutil.rmtree(store, ignore_errors=True)
                runs[mode].append(run)
            print(
                f"{name} rep {rep}: " + ", ".join(f"{m} {runs[m][-1]['loop']:.2f}s" for m in order),
                file=sys.stderr,
            )
    out: dict[str, Any] = {
        "steps_per_epoch": _calibrated.get(name, WORKLOADS[name][1]),
        "variants": variants,
        "runs": runs,
        "summary": {},
    }
    for mode in order[1:]:
        s: dict[str, Any] = {}
        for what in ("loop", "to_exit", *(("steps",) if inner else ())):
            ratios = [r[what] / p[what] for r, p in zip(runs[mode], runs["plain"], strict=True)]
            s[f"{what}_overhead"], s[f"{what}_spread"] = median_spread(ratios, 1)
            s[f"{what}_interval"] = interval([ratios])
        s["held"], s["held_spread"] = median_spread([r["held"] for r in runs[mode]])
        if modes[mode] is not None:
            s["checkpointed"] = [f"{r['checkpointed']}/{r['instances']}" for r in runs[mode]]
            s["boundaries"] = [r["boundaries"] for r in runs[mode]]
        out["summary"][mode] = s
    return out


def main() -> None:
    ap = workload_args(__doc__ or "", 8)
    ap.set_defaults(only=["finetune"])
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME=KEY:VALUE,...",
        help="a record variant (repeatable; replaces the defaults)",
    )
    ap.add_argument("--inner", action="store_true", help="also time the batch loop's steps alone")
    args = ap.parse_args()
    try:
        variants = dict(parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS))
    except ValueError as e:
        ap.error(str(e))
    reps = 1 if args.quick else args.reps
    become_subreaper()
    for name in args.only:
        if name in EPOCH_S:
            calibrate(name, STEADY_ALLOCATOR)
    results = {name: bench(name, variants, reps, args.quick, args.inner) for name in args.only}
    stem = "record_variants" + ("-quick" if args.quick else "")
    doc = {
        "reps": reps,
        "quick": args.quick,
        "inner": args.inner,
        "steady_allocator": True,
        "results": results,
    }
    doc = merge_by_workload(stem, doc)
    save(stem, doc, lambda png: _plot(doc["results"], png), stamp=False)
    for name, r in results.items():
        print(f"{name} ({reps} reps, steps per epoch {r['steps_per_epoch']}):")
        print(
            f"  {'mode':16} {'loop':>8} {'90% interval':>18} {'held':>7}"
            + (f" {'steps':>8}" if args.inner else "")
            + "  checkpointed"
        )
        for mode, s in r["summary"].items():
            lo, hi = s["loop_interval"]
            line = f"  {mode:16} {s['loop_overhead']:+8.1%} {f'{lo:+.1%} .. {hi:+.1%}':>18} {s['held']:7.1%}"
            if args.inner:
                line += f" {s['steps_overhead']:+8.1%}"
            print(
                line
                + (
                    f"  {statistics.median_low(s['checkpointed'])} (median)"
                    if "checkpointed" in s
                    else ""
                )
            )


def _plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        modes = list(r["summary"])
        xs = range(len(modes))
        loop = [100 * r["summary"][m]["loop_overhead"] for m in modes]
        err = [
            [
                y - 100 * r["summary"][m]["loop_interval"][0]
                for y, m in zip(loop, modes, strict=True)
            ],
            [
                100 * r["summary"][m]["loop_interval"][1] - y
                for y, m in zip(loop, modes, strict=True)
            ],
        ]
        w = 0.27
        ax.bar(
            [x - w for x in xs], loop, w, yerr=err, capsize=3, label="loop vs plain (90% interval)"
        )
        ax.bar(list(xs), [100 * r["summary"][m]["held"] for m in modes], w, label="held (reported)")
        if "steps_overhead" in r["summary"][modes[0]]:
            ax.bar(
                [x + w for x in xs],
                [100 * r["summary"][m]["steps_overhead"] for m in modes],
                w,
                label="training steps alone vs plain",
            )
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks(list(xs), modes, fontsize=8)
        ax.set_ylabel("% of the plain run")
        ax.set_title(f"{name}: what each part of a record costs", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
