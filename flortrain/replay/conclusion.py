"""A replay's run row, from its opening to its conclusion: the summary on stderr and the check
against the record that ``flortrain diff`` makes. Serial and parallel replays end alike."""

from __future__ import annotations

import os
import sys
from typing import Any

from flortrain.errors import FlortrainError, Located
from flortrain.process import as_main as runner
from flortrain.replay.diff import diff_runs
from flortrain.replay.preparation import Prepared
from flortrain.store.records import RunStatus


def open_run(p: Prepared, meta: dict[str, Any] | None = None) -> int:
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
        f" in {elapsed:.2f}s{how}: {counts.get('skipped', 0)} block instances skipped, {counts.get('executed', 0)} executed"
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


__all__ = ["conclude", "open_run"]
