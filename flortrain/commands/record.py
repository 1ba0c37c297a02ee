"""``flortrain record``: run a script instrumented, checkpointing its memoized loops."""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
from typing import Any

from flortrain import knobs
from flortrain.check.before_record import warn
from flortrain.checkpoint.key import CheckpointKey
from flortrain.determinism.settings import DEFAULT_SEED, Settings, said_rewrite
from flortrain.determinism.settings import apply as apply_settings
from flortrain.errors import FlortrainError, Located
from flortrain.process import as_main, launcher, stopping
from flortrain.process.launcher import Summary
from flortrain.process.static_child import StaticPass, start_static_pass
from flortrain.process.training import (
    execute,
    intra_op_threads,
    pin_threads,
    set_aside_static_objects,
)
from flortrain.runtime.files import Watch, skip_roots, watching
from flortrain.runtime.importhook import ProjectHook
from flortrain.runtime.jumps import Segment, SpanReplay
from flortrain.runtime.recording import RecordSession
from flortrain.runtime.session import ReplaySource
from flortrain.static.linemap import compile_for
from flortrain.static.plan import UNTRACKED, ModulePasses, Plan, not_memoized
from flortrain.static.project_files import ProjectFiles, project_roots
from flortrain.static.text import project_uses_torch
from flortrain.store.db import Store, open_store
from flortrain.store.records import INCOMPLETE, BlockState, Run, RunStatus


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
    return out


def _module_recorder(
    script: str,
    store: Store,
    run_id: int,
    meta: dict[str, Any],
    session: RecordSession,
    prepared: ModulePasses,
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
            print(
                f"flortrain: {shown}:{r.span.line}:{r.span.col}: {not_memoized(r.reason)}",
                file=sys.stderr,
            )
        _untracked(shown, plan, session)

    return ProjectHook(ProjectFiles(project_roots(script), script), on_module, prepared=prepared)


def _untracked(shown: str, plan: Plan, session: RecordSession) -> None:
    """Turn off the version-counter shortcuts for a run whose code writes behind their back."""
    if plan.untracked:
        session.untracked_writes()
        u = plan.untracked[0]
        print(f"flortrain: {shown}:{u.line}:{u.col}: {UNTRACKED}", file=sys.stderr)


def _note_load(store: Store, run_id: int, session: RecordSession) -> None:
    """Keep, per main loop, the cores its iterations kept busy (CPU over wall seconds): a
    parallel replay's workers each need that many, so on a small machine they may only queue
    (:func:`flortrain.replay.sharing.loop_load`)."""
    load = {m: round(cpu / wall, 3) for m, (wall, cpu) in session.loop_load.items() if wall > 0}
    if load and store.owned() and store.failed is None:
        store.set_meta(run_id, {**store.run(run_id).meta, "load": load})


def _resumable(
    store: Store, run_id: int, script: str, text: str, args: list[str]
) -> tuple[Run, tuple[str, int, int], int]:
    """The killed record ``run_id`` of ``script``, the boundary it continues from and the
    iteration it computes from (:meth:`Store.replayable_through`), or a one-line refusal."""
    where = Located(script)
    run = store.run(run_id)
    if run.kind != "record" or run.script != os.path.abspath(script):
        raise FlortrainError(f"run {run_id} is not a record of this script", where, "FT040")
    if run.effective_status not in (INCOMPLETE, RunStatus.INTERRUPTED):
        raise FlortrainError(
            f"run {run_id} is {run.effective_status}; only a killed or interrupted record can be resumed",
            where,
            "FT040",
        )
    if store.source(run.source_sha) != text:
        raise FlortrainError(
            f"{script} changed since run {run_id}; a resumed record must run the recorded source",
            where,
            "FT040",
        )
    if args:
        raise FlortrainError(
            f"--resume reuses run {run_id}'s arguments ({' '.join(run.argv)}); give none",
            where,
            "FT040",
        )
    point = store.resume_point(run_id)
    if point is None:  # no boundary: from the first main loop's start, if its blocks reach past it
        first = store.first_main_loop(run_id)
        point = None if first is None else (*first, 0)
    until = 0 if point is None else store.replayable_through(run_id, *point)
    if point is None or until == 0:
        raise FlortrainError(
            f"run {run_id} committed no main-loop boundary checkpoint, nor a checkpointed"
            " iteration, to continue from; record it again",
            where,
            "FT042",
        )
    return run, point, until


def _same_mode(
    store: Store, killed: Run, script: str, deterministic: bool, seed: int | None
) -> Settings | None:
    """A resumed record runs in its killed run's mode, under its settings."""
    settings = Settings.from_meta(killed.meta, str(store.root / "flortrain.db"), f"run {killed.id}")
    if (settings is not None) != deterministic or (
        settings is not None and seed is not None and seed != settings.seed
    ):
        how = (
            f"with --deterministic --seed {settings.seed}"
            if settings is not None
            else "without --deterministic"
        )
        raise FlortrainError(
            f"run {killed.id} was recorded {how}; resume it the same way", Located(script), "FT040"
        )
    return settings


def record(
    script: str,
    args: list[str],
    store_dir: str | None,
    epsilon: float | None = None,
    trust: bool = False,
    resume: int | None = None,
    static: StaticPass | None = None,
    seed: int | None = None,
    deterministic: bool = False,
) -> int:
    """Record ``script``. ``static`` is its static pass, begun by the caller as early as it could
    (the CLI forks it off before importing this module: :mod:`flortrain.process.static_child`).
    ``deterministic``: per-example generators and the deterministic settings, seeded by ``seed``
    (docs/determinism.md)."""
    knobs.validate()
    if static is None:
        static = start_static_pass(script, knobs.check(), deterministic)
    try:
        text = static.text
        torch_script = project_uses_torch(script, text)
        set_aside_static_objects()  # before torch's import (intra_op_threads): see its docstring
        threads = intra_op_threads(torch_script)  # torch's import: the forked pass runs meanwhile
        done = static.result()
    finally:
        static.close()
    if static.fell_back:
        print(f"flortrain: {static.fell_back}", file=sys.stderr)
    inst = done.script
    code = compile_for(os.path.abspath(script), inst.code_text, text)
    store = open_store(store_dir, create=resume is None, trust=trust)
    plan = inst.plan
    meta = {
        "versions": _versions(),
        "main_loops": [m.id for m in plan.main_loops],
        "blocks": [b.id for b in plan.blocks],
        "refused": [f"{r.span.line}: {r.reason}" for r in plan.refused],
    }
    settings = None
    if deterministic:
        settings = Settings(DEFAULT_SEED if seed is None else seed, threads)
        meta["deterministic"] = settings.as_meta()
    if resume is None:
        run_id = store.begin_run("record", os.path.abspath(script), args, text, None, threads, meta)
        print(
            f"flortrain: record run {run_id}: {len(plan.main_loops)} main loop(s), {len(plan.blocks)} memoized"
            f" loop(s), {len(plan.refused)} refused (see `flortrain instrument --explain`)",
            file=sys.stderr,
        )
    else:
        killed, point, until = _resumable(store, resume, script, text, args)
        settings = _same_mode(store, killed, script, deterministic, seed)
        run_id, args, threads = killed.id, killed.argv, killed.threads
        pin_threads(threads)
        boundary = str(CheckpointKey.boundary(*point))
        kept, t = store.truncate_for_resume(run_id, point[0], point[1], until, boundary)
        resumed: list[Any] = [
            *killed.meta.get("resumed", []),
            {"at": [point[0], point[1], until], "boundary": point[2], "t": time.time()},
        ]
        meta = {**killed.meta, "resumed": resumed}
        store.reopen_run(run_id, meta)
        how = (
            "its last committed boundary checkpoint"
            if until == point[2]
            else f"after its last committed boundary checkpoint (iteration {point[2]}) and"
            f" iterations {point[2]}..{until - 1} with their blocks restored"
            if point[2]
            else f"after iterations 0..{until - 1} with their blocks restored (no boundary"
            " checkpoint was committed)"
        )
        print(
            f"flortrain: record run {run_id} resumes at main loop {point[0]} iteration {until}"
            f"{f' (entry {point[1]})' if point[1] else ''}, {how};"
            " what it printed before that is not printed again",
            file=sys.stderr,
        )
    launcher.tell("run", run_id, script, str(store.root))
    if done.checked is not None:
        said = [r.span.line for r in plan.refused] + [u.line for u in plan.untracked[:1]]
        warn(done.checked, said)
    for r in plan.refused:
        print(
            f"flortrain: {script}:{r.span.line}:{r.span.col}: {not_memoized(r.reason)}",
            file=sys.stderr,
        )
    store.guarded = True  # from here on the store failing must not break training
    store.hold_claims()  # written once per commit interval, not three transactions a checkpoint
    session = RecordSession(store, run_id)
    if resume is not None:
        m, entry, k = point
        session.resume, session.resume_seq, session.resume_until = point, kept, until
        session.started -= t  # iteration times continue the killed run's clock
        session.replay = ReplaySource(
            run_id,
            frozenset(),
            store.checkpoints(run_id),
            SpanReplay({}, {}, {(m, entry): [k]}, segment=Segment(m, entry, k, None)),
        )
    if epsilon is not None:
        session.adaptive.epsilon = epsilon
    measured = store.restore_ratio(os.path.abspath(script))
    if measured is not None:
        session.adaptive.restore_ratio = measured[0]
        print(
            f"flortrain: restore/materialize ratio c = {measured[0]:.2f} (measured by replay run {measured[1]})",
            file=sys.stderr,
        )
    _untracked(script, plan, session)
    if settings is not None:
        said_rewrite(script, done.rewritten)
        apply_settings(settings, torch_script)
    session.start_materializer()
    t0 = time.perf_counter()
    hook = _module_recorder(script, store, run_id, meta, session, done.modules)
    session.project = hook.files  # the side-effect audit walks the project modules' globals too
    session.files = Watch(skip_roots(store.root), store.blobs)

    def stopped(signum: int) -> None:  # a SIGTERM ended the script where it stood
        _finish(script, store, session, run_id, 128 + signum, time.perf_counter() - t0, signum)

    try:
        with watching(session.files):
            status = execute(session, code, script, args, torch_script, hook, stopped)
        stopped_by = signal.SIGINT if as_main.interrupted else None
        return _finish(script, store, session, run_id, status, time.perf_counter() - t0, stopped_by)
    finally:
        stopping.close()  # a SIGTERM that came while the run was being finished ends the process now


def _finish(
    script: str,
    store: Store,
    session: RecordSession,
    run_id: int,
    status: int,
    elapsed: float,
    stopped_by: int | None,
) -> int:
    """Finish the run: ``complete``, ``failed``, or ``interrupted`` when ``stopped_by`` (SIGINT,
    SIGTERM) stopped it, which ``record --resume`` continues. The record's last line is printed
    here, or by the launcher once it has committed what was handed over."""
    _note_load(store, run_id, session)
    store.finish_run(
        run_id,
        RunStatus.COMPLETE
        if status == 0
        else RunStatus.FAILED
        if stopped_by is None
        else RunStatus.INTERRUPTED,
        status,
    )
    c = session.counts
    outcome = "complete" if status == 0 else f"failed (exit {status})"
    if stopped_by is not None and status != 0:
        outcome = (
            f"interrupted by {signal.Signals(stopped_by).name} (`flortrain record --resume {run_id} {script}`"
            " continues it from its latest checkpointed iteration)"
        )
    if store.failed:
        outcome = (
            f"incomplete (the store failed: {store.failed}; the script's exit {status} is kept)"
        )
    summary = Summary(
        run_id,
        outcome,
        elapsed,
        c.get(BlockState.CHECKPOINTED, 0),
        c.get(BlockState.CHECKPOINTED, 0) + c.get(BlockState.RECORDED, 0),
        session.held,
        session.exit_wait,
        as_main.refusal.one_line() if as_main.refusal is not None else None,
    )
    # closed before the launcher hears the run is over: the launcher, which holds the store open
    # too, then closes it last and pays the write-ahead log's copy while this process exits; and
    # a last write that failed here hands nothing over
    store.close()
    handoff = session.handoff()
    if handoff is not None:  # the launcher commits the rest and prints the last line
        launcher.tell("handoff", {**handoff, "summary": summary})
    else:
        print(summary.line(), file=sys.stderr)
        launcher.tell("finished")
    return status
