"""``flortrain verify`` on every fixture and every real-code fixture: its verdict, how long it
takes, and the hazards it reports.

Each script is copied alone into a fresh directory and verified there with ``--json -k K``
(``python -m flortrain verify``, a fresh process: two records and K resumes, each a process
that imports torch). Every fixture is written to be deterministic, so each should be
reproducible; a script that is not is listed with its first divergence. Wall and CPU seconds
(the children's user + system) are both reported: the machine may be shared.

    python benchmarks/verify_fixtures.py [--resumes 2] [--only NAME ...] [--keep]

Writes ``results/verify_fixtures.json`` and ``.png`` after every script (``--keep``: the rows of
scripts already there, at the same ``--resumes``, are kept and those scripts not run again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"


def scripts() -> list[Path]:
    """The fixtures (``fixtures/*.py``), the real-code fixtures (``fixtures/realcode/*.py``) and
    the hazard fixtures (``fixtures/hazards/*.py``: deterministic under ``python``, with what
    ``flortrain check`` reports)."""
    return [
        *sorted((ROOT / "fixtures").glob("*.py")),
        *sorted((ROOT / "fixtures" / "realcode").glob("*.py")),
        *sorted((ROOT / "fixtures" / "hazards").glob("*.py")),
    ]


def _env() -> dict[str, str]:
    """This tree first on the path; no store of the caller's."""
    env = {k: v for k, v in os.environ.items() if k != "FLORTRAIN_STORE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def verify_one(script: Path, resumes: int) -> dict[str, Any]:
    """One verify of ``script``, alone in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="flortrain-bench-verify-") as d:
        shutil.copy(script, Path(d) / script.name)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "flortrain",
                "verify",
                "--json",
                "-k",
                str(resumes),
                script.name,
            ],
            cwd=d,
            env=_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row: dict[str, Any] = {
        "script": str(script.relative_to(ROOT)),
        "exit": p.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
    }
    if p.returncode in (0, 1) and p.stdout.strip():
        report = json.loads(p.stdout)
        row.update(
            reproducible=report["reproducible"],
            runs=len(report["runs"]),
            checkpoints=sum(r["checkpoints"] for r in report["runs"]),
            boundaries=sum(r["boundaries"] for r in report["runs"]),
            no_resumes=report["no_resumes"],
            first_divergence=report["first_divergence"],
            hazards=[h["code"] for h in report["hazards"]],
            addressed=[h["code"] for h in report["hazards"] if h["deterministic"]],
        )
    else:
        row["error"] = p.stderr.strip().splitlines()[-1:] or [""]
    return row


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    names = [Path(r["script"]).stem for r in rows]
    colours = [
        "#55a868" if r.get("reproducible") else "#c44e52" if "reproducible" in r else "#8c8c8c"
        for r in rows
    ]
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.bar(names, [r["wall_s"] for r in rows], color=colours, label="wall")
    ax.plot(names, [r["cpu_s"] for r in rows], "k.", label="CPU (children)")
    for i, r in enumerate(rows):
        codes = ",".join(r.get("hazards", [])) or ("" if "hazards" in r else "error")
        if codes:
            ax.annotate(codes, (i, r["wall_s"]), ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_ylabel("seconds")
    ax.set_title(
        f"flortrain verify -k {res['resumes']} per fixture (green reproducible, red not, grey"
        f" error); hazards above; {res['cpus']} CPUs, load {res['load']:.1f}"
    )
    ax.tick_params(axis="x", rotation=60)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)  # drawn after every row: keep one figure open, not one per row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resumes", type=int, default=2)
    ap.add_argument("--only", nargs="+", default=None, help="script stems to verify")
    ap.add_argument("--keep", action="store_true", help="keep the rows already in the results")
    a = ap.parse_args()
    chosen = [s for s in scripts() if a.only is None or s.stem in a.only]
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    path = OUT / "verify_fixtures.json"
    rows: list[dict[str, Any]] = []
    if a.keep and path.exists():
        old = json.loads(path.read_text())
        rows = [r for r in old["rows"] if old["resumes"] == a.resumes]
    done = {r["script"] for r in rows}
    for s in chosen:
        if str(s.relative_to(ROOT)) in done:
            continue
        row = verify_one(s, a.resumes)
        print(json.dumps(row), flush=True)
        rows.append(row)
        res = {
            "commit": commit,
            "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)),
            "load": os.getloadavg()[0],
            "resumes": a.resumes,
            "rows": rows,
        }
        OUT.mkdir(exist_ok=True)
        path.write_text(json.dumps(res, indent=1) + "\n")
        plot(res, OUT / "verify_fixtures.png")
    ok = sum(1 for r in rows if r.get("reproducible"))
    print(f"{ok} of {len(rows)} reproducible; {sum(r['wall_s'] for r in rows):.0f} s in all")


if __name__ == "__main__":
    main()
