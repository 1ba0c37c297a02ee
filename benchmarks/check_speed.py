"""How fast ``flortrain check`` is, and whether it survives real code.

1. One script, as a user (or the pre-commit hook) runs it: ``python -m flortrain check FILE`` in
   a fresh process, start-up included, the median of ``--reps`` runs. The file is the longest
   fixture (``fixtures/realcode/nanogpt.py``, nanoGPT's ``train.py`` and model in one file,
   about 400 lines). The goal is at most 1.5 s. ``python -X importtime`` of one more run says
   how much of it is importing libcst, which no rule can save.
2. A corpus in one invocation: every ``.py`` file at HEAD of each fetched snapshot (bare git
   directories under ``--mirrors``, as ``benchmarks/corpus.py`` reads them), exported to a
   temporary directory. It reports the wall time, files per second, the exit code (0 or 1: no
   crash on any file; anything else, or a traceback, is a crash) and the findings by code.

    python benchmarks/check_speed.py [--reps 7] [--mirrors DIR] [--repos owner+name ...]

Writes ``results/check_speed.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
SCRIPT = ROOT / "fixtures" / "realcode" / "nanogpt.py"
GOAL_S = 1.5
#: the snapshots checked by default: pytorch/examples and karpathy's, as ``fetch`` names them
REPOS = (
    "pytorch+examples",
    "karpathy+nanoGPT",
    "karpathy+minGPT",
    "karpathy+makemore",
    "yunjey+pytorch-tutorial",
)
FINDING = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>[A-Z]{3}\d{3}) ")


def _env() -> dict[str, str]:
    """This tree first on the path, as the benchmark runs it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _check(
    args: list[str], cwd: Path, *flags: str
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU seconds (user + system: what the run costs whatever else the machine runs)
    of one ``flortrain check`` process, and its result."""
    cmd = [sys.executable, *flags, "-m", "flortrain", "check", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done


def _import_times(stderr: str) -> dict[str, float]:
    """Cumulative import seconds of each module, from ``-X importtime``'s lines (``import time:
    self [us] | cumulative | name``; each module is imported once, wherever it is first)."""
    out: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        out.setdefault(name.strip(), int(cumulative) / 1e6)
    return out


def single(reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / SCRIPT.name
        path.write_text(SCRIPT.read_text())
        _check([path.name], Path(tmp))  # warm the page cache and the bytecode of flortrain
        times, cpus = [], []
        for _ in range(reps):
            t, cpu, done = _check([path.name], Path(tmp))
            assert done.returncode in (0, 1), done.stderr
            times.append(t)
            cpus.append(cpu)
        imports = []
        for _ in range(3):
            _, _, traced = _check([path.name], Path(tmp), "-X", "importtime")
            imports.append(_import_times(traced.stderr))
    libcst = statistics.median(i.get("libcst", 0.0) for i in imports)
    return {
        "file": str(SCRIPT.relative_to(ROOT)),
        "lines": len(SCRIPT.read_text().splitlines()),
        "reps": reps,
        "wall_s": times,
        "median_s": statistics.median(times),
        "cpu_s": cpus,
        "median_cpu_s": statistics.median(cpus),
        "goal_s": GOAL_S,
        "libcst_import_s": libcst,
        "rules_import_s": statistics.median(i.get("flortrain.check.runner", 0.0) for i in imports),
        "findings": _by_code(done.stdout),
    }


def _by_code(stdout: str) -> dict[str, int]:
    found = collections.Counter(m["code"] for m in map(FINDING.match, stdout.splitlines()) if m)
    return dict(sorted(found.items()))


def export(gitdir: Path, dest: Path) -> str:
    """Every ``.py`` file at HEAD of the bare repository ``gitdir``, written under ``dest``; the
    commit. (Only those: a snapshot leaves its large data files out.)"""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "--git-dir", str(gitdir), "archive", "HEAD", "--", "*.py"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return subprocess.run(
        ["git", "--git-dir", str(gitdir), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def corpus(mirrors: Path, repos: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        commits = {}
        for repo in repos:
            gitdir = mirrors / repo / "repo"
            if gitdir.is_dir():
                commits[repo] = export(gitdir, base / repo)
        files = sum(1 for _ in base.rglob("*.py"))
        lines = sum(len(p.read_bytes().splitlines()) for p in base.rglob("*.py"))
        t, cpu, done = _check(sorted(commits), base)
    crashed = done.returncode not in (0, 1) or "Traceback" in done.stderr
    return {
        "repos": commits,
        "files": files,
        "lines": lines,
        "wall_s": t,
        "cpu_s": cpu,
        "files_per_s": files / t,
        "exit": done.returncode,
        "crashed": crashed,
        "stderr": done.stderr[-2000:] if crashed else "",
        "findings": _by_code(done.stdout),
        "files_with_findings": len(
            {m["path"] for m in map(FINDING.match, done.stdout.splitlines()) if m}
        ),
    }


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, c = res["single"], res["corpus"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    parts = [
        ("import libcst", s["libcst_import_s"]),
        ("rest: start-up, parse, rules", s["median_s"] - s["libcst_import_s"]),
    ]
    left = 0.0
    for (label, v), colour in zip(parts, ("#c44e52", "#4c72b0"), strict=True):
        a.barh([0], [v], left=left, color=colour, label=f"{label} {v:.2f} s")
        left += v
    a.barh([1], [s["median_cpu_s"]], color="#8172b2", label=f"CPU {s['median_cpu_s']:.2f} s")
    a.axvline(s["goal_s"], color="k", ls="--", label=f"goal {s['goal_s']} s")
    a.set_yticks([0, 1], ["wall", "CPU"])
    a.set_xlabel(f"seconds (median of {s['reps']} runs)")
    a.set_title(f"flortrain check, one {s['lines']}-line script (load {res['load']:.1f})")
    a.legend(loc="upper right", fontsize=8)
    codes = c["findings"] or {"(none)": 0}
    b.bar(list(codes), list(codes.values()), color="#55a868")
    b.set_title(
        f"{c['files']} corpus files in {c['wall_s']:.1f} s ({c['files_per_s']:.0f}/s): findings"
    )
    b.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    ap.add_argument("--repos", nargs="+", default=list(REPOS))
    a = ap.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    single_res, corpus_res = single(a.reps), corpus(a.mirrors, a.repos)
    res = {
        "commit": commit,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
        "load": os.getloadavg()[0],
        "single": single_res,
        "corpus": corpus_res,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "check_speed.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, OUT / "check_speed.png")
    s, c = single_res, corpus_res
    print(
        f"one {s['lines']}-line script: median {s['median_s']:.2f} s wall (goal {GOAL_S} s),"
        f" {s['median_cpu_s']:.2f} s CPU; importing libcst {s['libcst_import_s']:.2f} s, the rules"
        f" with it {s['rules_import_s']:.2f} s; load {res['load']:.1f}; findings {s['findings']}"
    )
    print(
        f"corpus: {c['files']} files, {c['lines']} lines in {c['wall_s']:.1f} s"
        f" ({c['cpu_s']:.1f} s CPU)"
        f" ({c['files_per_s']:.0f} files/s), exit {c['exit']}, crashed: {c['crashed']};"
        f" findings {c['findings']} in {c['files_with_findings']} files"
    )


if __name__ == "__main__":
    main()
