"""``flortrain record``: run a script instrumented, checkpointing its memoized loops."""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

from flortrain import knobs
from flortrain.instrument import compile_for, instrument_file
from flortrain.runtime.importhook import ProjectFiles, ProjectHook, project_roots
from flortrain.runtime.launch import execute, intra_op_threads, project_uses_torch
from flortrain.runtime.session import Session
from flortrain.static.plan import UNTRACKED, Plan
from flortrain.static.source import read_text
from flortrain.store.db import Store, open_store


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
    return out


def _module_recorder(
    script: str, store: Store, run_id: int, meta: dict[str, Any], session: Session
) -> ProjectHook:
    """The import hook for a record: every project module it instruments has its text stored and
    its path -> source sha added to the run's meta at once (a record that crashes later is still
    replayable), and its plan summarised on stderr like the script's."""
    modules: dict[str, str] = {}

    def on_module(name: str, path: str, text: str, plan: Plan) -> None:
        if not store.owned():
            return  # a forked DataLoader worker importing late: the parent's connection is not its
        modules[path] = store.put_source(text)
        store.set_meta(run_id, {**meta, "modules": modules})
        shown = os.path.relpath(path)
        print(
            f"flortrain: module {name} ({shown}): {len(plan.main_loops)} main loop(s),"
            f" {len(plan.blocks)} memoized loop(s), {len(plan.refused)} refused",
            file=sys.stderr,
        )
        for r in plan.refused:
            print(f"flortrain: {shown}:{r.span.line}:{r.span.col}: loop not memoized: {r.reason}", file=sys.stderr)
        _untracked(shown, plan, session)

    return ProjectHook(ProjectFiles(project_roots(script), script), on_module)


def _untracked(shown: str, plan: Plan, session: Session) -> None:
    """Turn off the version-counter shortcuts for a run whose code writes behind their back."""
    if plan.untracked:
        session.untracked_writes()
        u = plan.untracked[0]
        print(f"flortrain: {shown}:{u.line}:{u.col}: {UNTRACKED}", file=sys.stderr)


def record(
    script: str, args: list[str], store_dir: str | None, epsilon: float | None = None, trust: bool = False
) -> int:
    knobs.validate()
    text = read_text(script)
    inst = instrument_file(script, text)
    code = compile_for(os.path.abspath(script), inst.code_text, text)
    store = open_store(store_dir, trust=trust)
    torch_script = project_uses_torch(script, text)
    threads = intra_op_threads(torch_script)
    plan = inst.plan
    meta = {
        "versions": _versions(),
        "main_loops": [m.id for m in plan.main_loops],
        "blocks": [b.id for b in plan.blocks],
        "refused": [f"{r.span.line}: {r.reason}" for r in plan.refused],
    }
    run_id = store.begin_run("record", os.path.abspath(script), args, text, None, threads, meta)
    print(
        f"flortrain: record run {run_id}: {len(plan.main_loops)} main loop(s), {len(plan.blocks)} memoized"
        f" loop(s), {len(plan.refused)} refused (see `flortrain instrument --explain`)",
        file=sys.stderr,
    )
    for r in plan.refused:
        print(f"flortrain: {script}:{r.span.line}:{r.span.col}: loop not memoized: {r.reason}", file=sys.stderr)
    store.guarded = True  # from here on the store failing must not break training
    session = Session("record", store, run_id)
    if epsilon is not None:
        session.adaptive.epsilon = epsilon
    measured = store.restore_ratio(os.path.abspath(script))
    if measured is not None:
        session.adaptive.restore_ratio = measured[0]
        print(f"flortrain: restore/materialize ratio c = {measured[0]:.2f} (measured by replay run {measured[1]})", file=sys.stderr)
    _untracked(script, plan, session)
    session.start_materializer()
    t0 = time.perf_counter()
    hook = _module_recorder(script, store, run_id, meta, session)
    status = execute(session, code, script, args, torch_script, hook)
    elapsed = time.perf_counter() - t0
    store.finish_run(run_id, "complete" if status == 0 else "failed", status)
    c = session.counts
    n_blocks = c.get("checkpointed", 0) + c.get("recorded", 0)
    outcome = "complete" if status == 0 else f"failed (exit {status})"
    if store.failed:
        outcome = f"incomplete (the store failed: {store.failed}; the script's exit {status} is kept)"
    print(
        f"flortrain: record run {run_id} {outcome}"
        f" in {elapsed:.2f}s: {c.get('checkpointed', 0)} of {n_blocks} block instances checkpointed",
        file=sys.stderr,
    )
    store.close()
    return status
