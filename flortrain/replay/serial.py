"""A replay run in this process: the prepared script executes under a replay session, which
skips the block instances and main-loop iterations the plan lets it skip."""

from __future__ import annotations

import os
import time

from flortrain.determinism.settings import deterministic
from flortrain.process.training import execute, pin_threads
from flortrain.replay.conclusion import conclude, open_run
from flortrain.replay.files import begin_files, end_files
from flortrain.replay.preparation import Prepared
from flortrain.runtime import allocator
from flortrain.runtime.importhook import ProjectHook
from flortrain.runtime.jumps import SpanReplay, compile_guard
from flortrain.runtime.replaying import ReplaySession
from flortrain.runtime.session import ReplaySource
from flortrain.static.linemap import compile_for
from flortrain.static.project_files import ProjectFiles, project_roots


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


def replay_serial(p: Prepared) -> int:
    """Execute the prepared replay here; its exit status (:func:`conclude`)."""
    allocator.steady()
    pin_threads(p.record.threads)
    deterministic(p.record.meta, p.uses_torch)
    run = open_run(p)
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
    session = ReplaySession(p.store, run, replay=source)
    code = compile_for(os.path.abspath(p.script), p.code_text, p.disk_text)
    t0 = time.perf_counter()
    hook = ProjectHook(
        ProjectFiles(project_roots(p.script), p.script),
        recorded=p.modules,
        prepared=p.module_passes,
    )
    try:
        status = execute(session, code, p.script, p.args, p.uses_torch, hook)
    finally:
        if p.files is not None:
            end_files(p.files)
    return conclude(p, run, status, time.perf_counter() - t0, session.counts)


__all__ = ["replay_serial", "span_replay"]
