"""Preparing a replay: everything it needs before anything runs, as one :class:`Prepared`.

Preparation finds the record, checks the inputs and project modules it read, places the
probes, plans the replay (:mod:`flortrain.replay.planning`), instruments the current script
and prints the plan (:mod:`flortrain.replay.report`). What it returns is run either here
(:mod:`flortrain.replay.serial`) or by workers (:mod:`flortrain.replay.parallel`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from dataclasses import dataclass, field

from flortrain import knobs
from flortrain.determinism.settings import Settings
from flortrain.errors import FlortrainError, Located
from flortrain.process.static_child import Overlapped, module_passes, worth_overlapping
from flortrain.process.training import import_torch, set_aside_static_objects
from flortrain.replay.costs import block_costs
from flortrain.replay.files import Prologue, plan_files
from flortrain.replay.inputs import check_inputs
from flortrain.replay.plan import ReplayPlan
from flortrain.replay.preload import needs_torch
from flortrain.replay.report import plan_report, stopped
from flortrain.static.plan import ModulePasses, Plan
from flortrain.static.text import read_text, torch_available
from flortrain.store.db import Store, open_store
from flortrain.store.records import BlockRow, BlockState, Checkpoint, Run


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


def locate(
    script: str, run_id: int | None, store_dir: str | None, trust: bool = False
) -> tuple[Store, Run]:
    """The store and the record a replay of ``script`` replays."""
    knobs.validate()
    store = open_store(
        store_dir, create=False, trust=trust
    )  # a typo in --store must not create one
    return store, find_record(store, script, run_id)


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


def _boundaries(
    blocks: list[BlockRow], checkpoints: dict[str, Checkpoint]
) -> dict[tuple[str, int], list[int]]:
    """Per main-loop entry, the iterations with a committed boundary checkpoint."""
    out: dict[tuple[str, int], list[int]] = {}
    for b in blocks:
        if b.state == BlockState.BOUNDARY and b.key in checkpoints:
            out.setdefault((b.main_id, b.main_inst), []).append(b.iteration)
    return {k: sorted(v) for k, v in out.items()}


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
    uses_torch: bool  # :func:`flortrain.replay.preload.needs_torch`
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


@dataclass(frozen=True)
class StaticReplay:
    """What the replay's static pass makes of the recorded script and the current one: plain
    data, so that it can be made in a forked child (:mod:`flortrain.process.static_child`)."""

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
    deterministic: bool = False,
) -> StaticReplay:
    """Find the probes, analyse the recorded script, plan the replay and instrument the current
    script; with ``modules`` (the recorded project modules), instrument those the script imports
    directly too (each checked against its file by the import hook). A pure function of its
    arguments. libcst is imported here, where it runs: in the static pass's forked child, the
    process that imports torch meanwhile never pays for it."""
    from flortrain.replay.planning import plan_replay
    from flortrain.replay.probes import add_cli_probe, find_probes
    from flortrain.static.analysis import analyse
    from flortrain.static.source import parse
    from flortrain.static.transform import transform

    current_text = disk_text
    for spec in cli_probes:
        current_text = add_cli_probe(current_text, spec, script)
    probes = find_probes(recorded_text, current_text, script, run_id)
    current = probes.current
    if deterministic:  # the record instrumented its per-example rewrite: so does the replay
        from flortrain.determinism.rewrite import determinize

        recorded_text = determinize(script, recorded_text).text
        current = parse(script, determinize(script, current.text).text)
    plan = analyse(parse(script, recorded_text))
    rplan = plan_replay(plan, probes)
    code_text = transform(current, rplan.instrumentation)
    ahead = module_passes(script, disk_text, only=modules) if modules else {}
    return StaticReplay(
        current_text, plan, rplan, code_text, tuple((p.line, p.code) for p in probes.probes), ahead
    )


def _static_pass(
    script: str, record: Run, recorded_text: str, disk_text: str, cli_probes: list[str], fork: bool
) -> StaticReplay:
    """The static pass, in a forked child while torch is imported here (``fork``: that saves
    time), or inline."""
    recorded_paths = frozenset(dict(record.meta.get("modules", {})))
    det = "deterministic" in record.meta
    static = Overlapped(
        lambda: static_replay(
            script, recorded_text, disk_text, cli_probes, record.id, recorded_paths, det
        ),
        StaticReplay,
        fork,
        fallback=lambda: static_replay(
            script, recorded_text, disk_text, cli_probes, record.id, (), det
        ),
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
    return s


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
    Settings.from_meta(record.meta, str(store.root / "flortrain.db"), f"run {record.id}")
    files = plan_files(store, record)
    if record.effective_status != "complete":
        print(
            f"flortrain: record run {record.id} is {record.effective_status}; {stopped(store, record)}",
            file=sys.stderr,
        )
    recorded_text = store.source(record.source_sha)
    disk_text = read_text(script)
    torch_script = needs_torch(script, disk_text, cli_probes)
    fork = overlap and worth_overlapping(torch_script and torch_available())
    s = _static_pass(script, record, recorded_text, disk_text, cli_probes, fork)
    modules = recorded_modules(store, record)  # after the probes, whose errors come first
    blocks = store.blocks(record.id)
    measured = store.restore_ratio(os.path.abspath(script))
    restore_ratio = knobs.DEFAULT_RESTORE_RATIO if measured is None else measured[0]
    costs = block_costs(blocks, restore_ratio)
    checkpoints = store.checkpoints(record.id)  # validated (FT018) before the plan is printed
    for line in plan_report(script, record, s.plan, s.rplan, s.probes, blocks, costs, measured):
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


__all__ = ["Prepared", "StaticReplay", "find_record", "locate", "prepare", "static_replay"]
