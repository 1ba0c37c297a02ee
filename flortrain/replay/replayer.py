"""``flortrain replay``: run the current script against a record, skipping what it can."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from flortrain import knobs
from flortrain.errors import FlortrainError, Located
from flortrain.replay.backends import LocalBackend
from flortrain.replay.diff import diff_runs
from flortrain.replay.files import Prologue, begin_files, end_files, plan_files
from flortrain.replay.inputs import check_inputs
from flortrain.replay.replayplan import ReplayPlan
from flortrain.replay.sharing import cannot_pay
from flortrain.runtime import allocator, runner
from flortrain.runtime.importhook import ProjectFiles, ProjectHook, project_roots
from flortrain.runtime.launch import execute, import_torch, pin_threads, set_aside_static_objects
from flortrain.runtime.session import ReplaySource, Session
from flortrain.runtime.spans import SpanReplay, compile_guard
from flortrain.static.linemap import compile_for
from flortrain.static.overlap import Overlapped, module_passes, worth_overlapping
from flortrain.static.plan import ModulePasses, Plan
from flortrain.static.text import project_uses_torch, read_text, torch_available, uses_torch
from flortrain.store.db import Store, open_store
from flortrain.store.records import BlockRow, BlockState, Checkpoint, Run, RunStatus


def find_record(store: Store, script: str, run_id: int | None) -> Run:
    if run_id is not None:
        run = store.run(run_id)
        if run.kind != "record":
            raise FlortrainError(
                f"run {run_id} is a {run.kind}; replay needs a record run", code="FT031"
            )
        return run
    abspath = os.path.abspath(script)
    latest = store.latest("record", abspath, "complete") or store.latest("record", abspath)
    if latest is None:
        raise FlortrainError(
            f"no recorded run of this script in {store.root}; run `flortrain record {script}` first",
            Located(script),
            "FT031",
        )
    return latest


def _costs(
    blocks: list[BlockRow], restore_ratio: float
) -> dict[str, tuple[int, int, float, float]]:
    """Per block: instances, checkpoints, compute, and the estimated time to restore them (``c``
    times what each checkpoint held the record, Eq. 3)."""
    out: dict[str, tuple[int, int, float, float]] = {}
    for b in blocks:
        if b.state == BlockState.BOUNDARY:
            continue  # a main-loop boundary checkpoint, not a block instance
        n, k, c, r = out.get(b.block_id, (0, 0, 0.0, 0.0))
        ck = b.state == BlockState.CHECKPOINTED
        m = b.materialize_s or 0.0
        out[b.block_id] = (
            n + 1,
            k + int(ck),
            c + (b.compute_s or 0.0),
            r + (restore_ratio * m if ck else 0.0),
        )
    return out


def _why_not(blocks: list[BlockRow]) -> dict[str, str]:
    """Per block, the reason its first instance that could not be checkpointed gives (a tensor
    carrying an autograd graph, an object that cannot be captured), for the replay plan."""
    out: dict[str, str] = {}
    for b in blocks:
        if b.state == BlockState.RECORDED and b.note and b.block_id not in out:
            out[b.block_id] = b.note
    return out


def _boundaries(
    blocks: list[BlockRow], checkpoints: dict[str, Checkpoint]
) -> dict[tuple[str, int], list[int]]:
    """Per main-loop entry, the iterations with a committed boundary checkpoint."""
    out: dict[tuple[str, int], list[int]] = {}
    for b in blocks:
        if b.state == BlockState.BOUNDARY and b.key in checkpoints:
            out.setdefault((b.main_id, b.main_inst), []).append(b.iteration)
    return {k: sorted(v) for k, v in out.items()}


def span_replay(p: Prepared) -> SpanReplay | None:
    """What the runtime needs to jump over main-loop iterations: the probes' guards, the
    recorded scalars of every iteration, and where boundary checkpoints were taken."""
    if not p.rplan.spans:
        return None
    guards = {
        m: [compile_guard(g.source, g.recorded, g.live, g.through) for g in gs]
        for m, gs in p.rplan.spans.items()
    }
    return SpanReplay(guards, p.store.iteration_scalars(p.record.id), p.boundaries)


def _module_blocks(costs: dict[str, tuple[int, int, float, float]]) -> list[str]:
    """Replay-plan lines for the blocks of project modules (ids ``module:L<line>``): never probed,
    so each instance with a checkpoint is skipped."""
    return [
        f"  {bid}: skip {k} of {n} instance(s), restoring checkpoints (project module, unchanged)"
        for bid, (n, k, _, _) in costs.items()
        if ":" in bid
    ]


def recorded_modules(store: Store, record: Run) -> dict[str, str]:
    """The project modules the record instrumented (file -> text), each checked against the file
    on disk. Replay runs them with the recorded plan, so a changed module is refused: probes (and
    any edit) inside imported modules are not supported yet, only in the script."""
    out: dict[str, str] = {}
    for path, sha in dict(record.meta.get("modules", {})).items():
        text = store.source(sha)
        shown = os.path.relpath(path)
        try:
            same = read_text(path) == text
        except FlortrainError:
            same = False
        if not same:
            raise FlortrainError(
                f"project module changed since record {record.id}; imported modules replay unchanged"
                " (probes and edits are supported only in the script for now): restore it",
                Located(shown),
                "FT032",
            )
        out[path] = text
    return out


@dataclass
class Prepared:
    """A replay, planned and ready to run: serially here, or by parallel workers."""

    store: Store
    record: Run
    script: str
    args: list[str]
    current_text: str  # the script with its probes (CLI probes added)
    disk_text: str
    code_text: str  # instrumented for this replay
    modules: dict[str, str]
    rplan: ReplayPlan
    checkpoints: dict[str, Checkpoint]
    uses_torch: bool
    probes: list[str]
    compares: bool  # the record's own arguments: diff can check the replay
    blocks: list[BlockRow]  # the record's block and boundary rows, read once
    boundaries: dict[tuple[str, int], list[int]]  # per main-loop entry: committed boundaries
    module_passes: ModulePasses = field(
        default_factory=dict
    )  # done ahead by the static pass's child
    #: Flor's c = R/M as the latest replay of the script measured it (the default before any):
    #: the plan's estimates and parallel segments price restores with the c a record's period
    #: judged them by (``AdaptivePeriod.futile``, Eq. 4)
    restore_ratio: float = knobs.DEFAULT_RESTORE_RATIO
    #: the files the record wrote, as the replay's start and its restores put them back
    files: Prologue | None = None


def _stopped(store: Store, record: Run) -> str:
    """Where an unfinished record stopped, for the user reading a replay of it."""
    last = store.last_iteration(record.id)
    if last is None:
        return "it stopped before any main-loop iteration was committed; the whole script executes"
    m, entry, it = last
    where = f"main loop {m}" + (f" (entry {entry})" if entry else "")
    return (
        f"it stopped in {where} at iteration {it}: what it recorded up to there is restored where"
        " it can be, and the rest executes"
    )


def _executed_source(script: str, record: Run, probes: tuple[tuple[int, str], ...]) -> list[str]:
    """What this replay will execute, shown before it does: the only code a replay runs is the
    user's script, which must be the recorded source (named by its hash) plus these probes."""
    out = [
        f"  executes {script}: the source of record run {record.id} (sha256 {record.source_sha[:12]}) plus:"
    ]
    out += [f"    line {line}: {code.splitlines()[0]}" for line, code in probes] or [
        "    no probes"
    ]
    return out


@dataclass(frozen=True)
class StaticReplay:
    """What the replay's static pass makes of the recorded script and the current one: plain
    data, so that it can be made in a forked child (:mod:`flortrain.static.overlap`)."""

    current_text: str  # the script with its CLI probes added
    plan: Plan  # of the recorded script
    rplan: ReplayPlan
    code_text: str  # the current script instrumented for this replay
    probes: tuple[tuple[int, str], ...]  # (line, code) of each probe
    #: the recorded project modules the script imports directly, their passes done ahead (in
    #: the child only: inline, the import hook does them as they are imported)
    modules: ModulePasses = field(default_factory=dict)


def static_replay(
    script: str,
    recorded_text: str,
    disk_text: str,
    cli_probes: list[str],
    run_id: int,
    modules: Collection[str] = (),
) -> StaticReplay:
    """Find the probes, analyse the recorded script, plan the replay and instrument the current
    script; with ``modules`` (the recorded project modules), instrument those the script imports
    directly too (each checked against its file by the import hook). A pure function of its
    arguments (libcst is imported here, where it runs)."""
    from flortrain.replay.planner import plan_replay
    from flortrain.replay.probes import add_cli_probe, find_probes
    from flortrain.static.analysis import analyse
    from flortrain.static.source import parse
    from flortrain.static.transform import transform

    current_text = disk_text
    for spec in cli_probes:
        current_text = add_cli_probe(current_text, spec, script)
    probes = find_probes(recorded_text, current_text, script, run_id)
    plan = analyse(parse(script, recorded_text))
    rplan = plan_replay(plan, probes)
    code_text = transform(probes.current, rplan.instrumentation)
    ahead = module_passes(script, disk_text, only=modules) if modules else {}
    return StaticReplay(
        current_text, plan, rplan, code_text, tuple((p.line, p.code) for p in probes.probes), ahead
    )


def locate(
    script: str, run_id: int | None, store_dir: str | None, trust: bool = False
) -> tuple[Store, Run]:
    """The store and the record a replay of ``script`` replays."""
    knobs.validate()
    store = open_store(
        store_dir, create=False, trust=trust
    )  # a typo in --store must not create one
    return store, find_record(store, script, run_id)


def prepare(
    script: str,
    run_id: int | None,
    cli_probes: list[str],
    new_args: list[str] | None,
    store_dir: str | None,
    trust: bool = False,
    overlap: bool = False,
    allow_changed_inputs: bool = False,
    located: tuple[Store, Run] | None = None,
) -> Prepared:
    """Find the record (unless ``located`` already), check its inputs, read the probes, plan the
    replay and print the plan. With ``overlap`` (this process runs the replay next, so it will
    import torch), the static pass runs in a forked child while torch is imported here, where
    that saves time."""
    store, record = located or locate(script, run_id, store_dir, trust)
    check_inputs(store, record, allow_changed_inputs)
    files = plan_files(store, record)
    if record.effective_status != RunStatus.COMPLETE:
        print(
            f"flortrain: record run {record.id} is {record.effective_status}; {_stopped(store, record)}",
            file=sys.stderr,
        )
    recorded_text = store.source(record.source_sha)
    disk_text = read_text(script)
    # a --probe spec is not Python until it is placed (``6:x``): tested apart from the script
    torch_script = project_uses_torch(script, disk_text) or any(
        uses_torch(spec) for spec in cli_probes
    )
    recorded_paths = frozenset(dict(record.meta.get("modules", {})))
    static = Overlapped(
        lambda: static_replay(
            script, recorded_text, disk_text, cli_probes, record.id, recorded_paths
        ),
        StaticReplay,
        overlap and worth_overlapping(torch_script and torch_available()),
        fallback=lambda: static_replay(script, recorded_text, disk_text, cli_probes, record.id),
    )
    try:
        if static.forked:
            set_aside_static_objects()  # before torch's import, as a replay without the child does
            import_torch()
        s = static.result()
    finally:
        static.close()
    if static.fell_back:
        print(f"flortrain: {static.fell_back}", file=sys.stderr)
    modules = recorded_modules(store, record)  # after the probes, whose errors come first
    blocks = store.blocks(record.id)
    checkpoints = store.checkpoints(record.id)  # a damaged row refused before the plan is shown
    measured = store.restore_ratio(os.path.abspath(script))
    restore_ratio = knobs.DEFAULT_RESTORE_RATIO if measured is None else measured[0]
    costs = _costs(blocks, restore_ratio)
    lines = s.rplan.describe(s.plan, costs, _why_not(blocks))
    lines[-1:-1] = _module_blocks(costs)
    if measured is not None:  # before the estimate it went into
        lines.insert(
            -1,
            f"restore/materialize ratio c = {measured[0]:.2f} (measured by replay run {measured[1]})",
        )
    lines[1:1] = _executed_source(script, record, s.probes)
    for line in lines:
        print(f"flortrain: {line}", file=sys.stderr)
    return Prepared(
        store,
        record,
        script,
        record.argv if new_args is None else new_args,
        s.current_text,
        disk_text,
        s.code_text,
        modules,
        s.rplan,
        checkpoints,
        torch_script,
        [code for _, code in s.probes],
        new_args is None,
        blocks,
        _boundaries(blocks, checkpoints),
        s.modules,
        restore_ratio,
        files,
    )


def begin(p: Prepared, meta: dict[str, Any] | None = None) -> int:
    """The replay's run row."""
    return p.store.begin_run(
        "replay",
        os.path.abspath(p.script),
        p.args,
        p.current_text,
        p.record.id,
        p.record.threads,
        {"probes": p.probes, "execute": p.rplan.execute, **(meta or {})},
    )


def conclude(
    p: Prepared, run: int, status: int, elapsed: float, counts: dict[str, int], how: str = ""
) -> int:
    """Finish the run, summarize it on stderr and check it with diff (when it replayed the
    record's own arguments). The exit status is the script's, or 1 when the check finds the
    replay differs from the record, as ``flortrain diff`` would: a replay that knows it is not
    faithful must not pass for a faithful one in a script or CI. Its output is printed all the
    same, and the run row keeps the script's own status (the run did complete)."""
    store = p.store
    store.finish_run(run, RunStatus.COMPLETE if status == 0 else RunStatus.FAILED, status)
    if runner.refusal is not None:  # the script went on where flortrain cannot follow
        store.close()
        raise runner.refusal
    if store.failed:
        store.close()
        raise FlortrainError(
            f"the store failed during replay run {run} ({store.failed}): its output above was printed but"
            " could not all be stored, so it is not checked; fix the store and replay again",
            Located(str(store.root)),
            "FT016",
        )
    print(
        f"flortrain: replay run {run} of record {p.record.id} {'complete' if status == 0 else f'failed (exit {status})'}"
        f" in {elapsed:.2f}s{how}: {counts.get(BlockState.SKIPPED, 0)} block instances skipped, {counts.get(BlockState.EXECUTED, 0)} executed"
        + (
            f", {counts['jumped']} main-loop iterations jumped over" if counts.get("jumped") else ""
        ),
        file=sys.stderr,
    )
    if status == 0 and p.compares:
        result = diff_runs(store, store.run(run))
        for line in result.report(limit=3):
            print(f"flortrain: {line}", file=sys.stderr)
        if not result.identical:
            print(
                "flortrain: warning: the replay is not faithful (exit 1); see `flortrain diff`",
                file=sys.stderr,
            )
            status = 1
    store.close()
    return status


def _warm_workers(script: str, jobs: int) -> LocalBackend | None:
    """Local workers started before planning, so that their start-up (the interpreter, torch)
    overlaps the driver's (see :class:`LocalBackend`); None when prestarting is off."""
    if knobs.prestart() == "off":
        return None
    try:
        text = read_text(script)
    except FlortrainError:
        return None  # prepare() says why in one line
    return LocalBackend(warm=jobs, uses_torch=project_uses_torch(script, text))


def replay(
    script: str,
    run_id: int | None,
    cli_probes: list[str],
    new_args: list[str] | None,
    store_dir: str | None,
    jobs: int = 1,
    backend: str = "local",
    blobs: str | None = None,
    trust: bool = False,
    allow_changed_inputs: bool = False,
) -> int:
    located = locate(script, run_id, store_dir, trust)
    serially = None
    if jobs > 1 and backend == "local" and knobs.segments() == "estimated":
        # decided from the record before any worker is paid for (:mod:`flortrain.replay.sharing`)
        serially = cannot_pay(*located, jobs)
    divides = jobs > 1 and serially is None
    warm = _warm_workers(script, jobs) if divides and backend == "local" else None
    try:
        # a replay that runs here imports torch next: its static pass can overlap that
        p = prepare(
            script,
            run_id,
            cli_probes,
            new_args,
            store_dir,
            trust,
            not divides,
            allow_changed_inputs,
            located,
        )
        set_aside_static_objects()
        if jobs == 1 and backend != "local":
            print("flortrain: --jobs 1: replaying serially, in this process", file=sys.stderr)
        if serially is not None:
            print(f"flortrain: replaying serially: {serially}", file=sys.stderr)
        if divides:
            from flortrain.replay.parallel import replay_parallel

            status = replay_parallel(p, jobs, backend, blobs, warm)
            if status is not None:
                return status
    finally:
        if warm is not None:  # a serial replay must not share the cores with idle imports
            warm.close()
    allocator.steady()
    pin_threads(p.record.threads)
    run = begin(p)
    if p.files is not None:
        begin_files(p.files, p.store, run)
    p.store.guarded = True
    source = ReplaySource(
        p.record.id,
        frozenset(p.rplan.execute),
        p.checkpoints,
        span_replay(p),
        p.files.states if p.files else {},
    )
    session = Session("replay", p.store, run, replay=source)
    code = compile_for(os.path.abspath(script), p.code_text, p.disk_text)
    t0 = time.perf_counter()
    hook = ProjectHook(
        ProjectFiles(project_roots(script), script), recorded=p.modules, prepared=p.module_passes
    )
    try:
        status = execute(session, code, script, p.args, p.uses_torch, hook)
    finally:
        if p.files is not None:
            end_files(p.files)
    return conclude(p, run, status, time.perf_counter() - t0, session.counts)
