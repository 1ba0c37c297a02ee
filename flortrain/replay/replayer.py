"""``flortrain replay``: run the current script against a record, skipping what it can.

The entry only picks the mode: serially in this process (:mod:`flortrain.replay.serial`), or
divided among workers (:mod:`flortrain.replay.parallel`) when ``--jobs`` asks for it and the
record says dividing might pay (:mod:`flortrain.replay.sharing`). Either way the replay is
prepared first (:mod:`flortrain.replay.preparation`).
"""

from __future__ import annotations

import sys

from flortrain import knobs
from flortrain.errors import FlortrainError
from flortrain.process.training import set_aside_static_objects
from flortrain.replay.backends import LocalBackend
from flortrain.replay.parallel import replay_parallel
from flortrain.replay.preload import needs_torch
from flortrain.replay.preparation import locate, prepare
from flortrain.replay.serial import replay_serial
from flortrain.replay.sharing import cannot_pay
from flortrain.static.text import read_text


def _warm_workers(script: str, jobs: int, cli_probes: list[str]) -> LocalBackend | None:
    """Local workers started before planning, so that their start-up (the interpreter, torch)
    overlaps the driver's (see :class:`LocalBackend`); None when prestarting is off."""
    if knobs.prestart() == "off":
        return None
    try:
        text = read_text(script)
    except FlortrainError:
        return None  # prepare() says why in one line
    return LocalBackend(warm=jobs, uses_torch=needs_torch(script, text, cli_probes))


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
    warm = _warm_workers(script, jobs, cli_probes) if divides and backend == "local" else None
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
            status = replay_parallel(p, jobs, backend, blobs, warm)
            if status is not None:
                return status
    finally:
        if warm is not None:  # a serial replay must not share the cores with idle imports
            warm.close()
    return replay_serial(p)


__all__ = ["replay"]
