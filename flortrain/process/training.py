"""Set up a session around a script run and tear it down, for record and replay alike."""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import sys
from collections.abc import Callable
from types import CodeType

from flortrain.process import distributed, stopping
from flortrain.process.as_main import run_as_main
from flortrain.runtime import session as _session
from flortrain.runtime.importhook import installed
from flortrain.runtime.session import Session
from flortrain.runtime.tee import Tee
from flortrain.static.text import torch_available


def set_aside_static_objects() -> None:
    """Move the objects flortrain made before the script runs (libcst's trees and metadata,
    click's, sqlite3's) out of the collector's sight, once their garbage is collected.

    They live until the process ends anyway, and every full collection walks every object it
    tracks: at interpreter exit CPython runs three, so the 0.1 s they added to a recorded
    script's exit was paid there, and any generation-2 collection during training walked them
    too. ``gc.freeze()`` takes only what exists now, so it is called before torch and the script
    are imported: their objects are collected exactly as in a plain run, finalizers and all.
    Where torch is imported already, nothing is set aside, so that none of its objects are."""
    if "torch" in sys.modules:
        return
    gc.collect()
    gc.freeze()


def intra_op_threads(uses_torch: bool = True) -> int | None:
    """Intra-op threads change float reductions bitwise (RepDL): recorded, pinned on replay."""
    if not uses_torch or not torch_available():
        return None
    import torch

    return int(torch.get_num_threads())


def import_torch() -> None:
    """Import torch now, where it is installed: while a forked static pass runs beside it
    (:mod:`flortrain.process.static_child`), rather than after it."""
    if torch_available():
        import torch  # noqa: F401


def pin_threads(n: int | None) -> None:
    if n is not None and torch_available():
        import torch

        torch.set_num_threads(n)


def execute(
    session: Session,
    code: CodeType,
    script: str,
    args: list[str],
    uses_torch: bool = True,
    hook: importlib.abc.MetaPathFinder | None = None,
    stop: Callable[[int], None] | None = None,
) -> int:
    """Run the script under ``session``; always finalize what was captured.

    The registry must be in place before the script builds its first module, so torch is imported
    up front when the script uses it (and not at all for a script that never mentions it).
    ``hook`` (the project-module import hook) is on ``sys.meta_path`` while the script runs.
    ``stop`` (a record's): what ends the run when a SIGTERM stops the script, called once what
    was captured is finalized, before the process dies of it (:mod:`~flortrain.process.stopping`).
    The handlers stay in place until the caller has finished the run (:func:`stopping.close`)."""
    if uses_torch and torch_available():
        session.registry.install()
    session.note_initial_streams()
    tee = Tee(
        sys.stdout, session.context, lambda entries: session.store.put_logs(session.run_id, entries)
    )
    session.tee = tee
    if session.resume is not None:  # the killed run's log is kept up to the resumed iteration
        tee.seq, tee.muted = session.resume_seq, True
    saved_stdout = sys.stdout
    finalized = False

    def finalize() -> None:
        nonlocal finalized
        if finalized:
            return
        finalized = True
        _session.current = None
        sys.stdout = saved_stdout
        with contextlib.suppress(Exception):
            saved_stdout.flush()
        session.flush()
        session.registry.uninstall()

    def stopped(signum: int) -> None:
        finalize()
        assert stop is not None
        stop(signum)

    stoppable = stopping.install(stopped) if stop is not None else None
    stopping.current = stoppable
    sys.stdout = tee
    _session.current = session
    status = 1
    try:
        with installed(hook), distributed.guarded():
            status = run_as_main(code, script, args)
    finally:
        if stoppable is not None:
            stoppable.script_over()
        finalize()
    return status
