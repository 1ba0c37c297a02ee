"""``flortrain verify SCRIPT [ARGS]``: DETrain's repeatability protocol (its Section 6.2) as a
command.

The script is recorded twice from the start, with a checkpoint at every block instance and
every main-loop boundary (``FLORTRAIN_PERIOD=every``), into a temporary store of verify's own
(removed at the end; ``--keep DIR`` keeps it there). The second record is compared with the
first at every boundary (random streams, state) and every checkpoint (state, tensor by tensor),
and by what it printed. Then the first record is resumed from ``k`` of its boundary
checkpoints, spread over the run: each resume is a fresh process that restores the boundary
and executes every block from there on, as a parallel replay's worker does, with no probes,
its digests compared with the first record's. The first divergence is named (iteration, block,
tensor or stream), beside the determinism hazards ``flortrain check`` finds in the script
(:mod:`flortrain.commands.reproducibility`). Exit 0 reproducible, 1 not, 2 bad input.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

from flortrain.check.before_record import check
from flortrain.commands.comparison import Comparison, Digests, Divergence, compare
from flortrain.commands.reproducibility import Report
from flortrain.errors import FlortrainError
from flortrain.replay.backends import LocalBackend, Outcome
from flortrain.replay.divergence import Boundary, loads_boundaries
from flortrain.replay.parallel import worker_task
from flortrain.replay.preparation import Prepared, prepare
from flortrain.runtime.jumps import Segment
from flortrain.static.text import read_text
from flortrain.store.db import Store, open_store
from flortrain.store.records import BlockState, Run

#: the code of a script verify cannot judge: a record of it failed
CODE = "FT080"


def _record(script: str, args: list[str], store_dir: str, n: int, trust: bool) -> None:
    """Record the script from the start, every instance and boundary checkpointed; its output is
    kept in the store, not printed. A failed record is bad input: its last line says why."""
    env = {**os.environ, "FLORTRAIN_PERIOD": "every", "FLORTRAIN_CHECK": "off"}
    env.pop("FLORTRAIN_STORE", None)
    cmd = [sys.executable, "-m", "flortrain", "--store", store_dir]
    cmd += ["--trust"] if trust else []
    p = subprocess.run(
        [*cmd, "record", "--no-check", script, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        check=False,
    )
    if p.returncode == 0:
        return
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    if p.returncode == 2 and lines:  # flortrain's own one-line refusal: relayed as it is
        raise _Relayed(lines[-1])
    # the script's last words (its exception), not flortrain's summary after them
    said = next((ln for ln in reversed(lines) if not ln.startswith("flortrain: ")), "no message")
    raise FlortrainError(f"record {n} of {script} exited {p.returncode}: {said}", code=CODE)


class _Relayed(Exception):
    """A record's own one-line error, printed as it is."""


def _digests(store: Store, run_id: int) -> Digests:
    """A record's digests, its boundaries in the order the run reached them."""
    hashes = loads_boundaries(store.iteration_hashes(run_id))
    t = {
        (m, e, it): at for (m, e), rows in store.iteration_times(run_id).items() for it, at in rows
    }
    ordered = sorted(hashes, key=lambda b: (t.get(b, float("inf")), b))
    return Digests({b: hashes[b] for b in ordered}, store.blocks(run_id), list(store.logs(run_id)))


def _spread(boundaries: list[Boundary], k: int) -> list[Boundary]:
    """``k`` of the boundaries, spread over the run (the first and the last among them)."""
    n = len(boundaries)
    if k <= 0 or n == 0:
        return []
    if k == 1:
        return [boundaries[n // 2]]
    return [boundaries[i] for i in sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})]


def _resumed(outcome: Outcome, start: Boundary) -> Digests | Divergence:
    """A resumed run's digests, or how it failed (it did not run to the end as the first did)."""
    r = outcome.result
    if r is None or outcome.status != 0:
        last = next((ln for ln in reversed(outcome.stderr.splitlines()) if ln.strip()), "")
        why = f"exited {outcome.status}" + (f": {last}" if last else "")
        return Divergence("failed", start[0], start[1], start[2], None, None, (why,))
    rows = sorted(r.iterations, key=lambda row: row[6] if row[6] is not None else float("inf"))
    return Digests({(m, e, it): json.loads(sha) for m, e, it, sha, *_ in rows}, r.blocks, r.logs)


def _resumes(p: Prepared, reference: Digests, starts: list[Boundary]) -> list[Comparison]:
    """Resume the first record at each of ``starts``, a few at a time (each pinned to the
    record's threads), and compare each with it."""
    execute = frozenset(b.block_id for b in p.blocks if b.state != BlockState.BOUNDARY)
    jobs = max(1, min(len(starts), len(os.sched_getaffinity(0)) // max(1, p.record.threads or 1)))
    marks = p.boundaries
    backend = LocalBackend()
    done: dict[int, Outcome] = {}
    try:
        pending = list(enumerate(starts))
        while pending or len(done) < len(starts):
            while pending and len(backend.procs) < jobs:
                i, start = pending.pop(0)
                segment = Segment(start[0], start[1], start[2], None)
                backend.submit(worker_task(p, i, segment, str(p.store.blobs), execute, {}, marks))
            for o in backend.wait(1.0):
                done[o.index] = o
    finally:
        backend.close()
    out = []
    for i, start in enumerate(starts):
        m, e, it = start
        name = f"resume at {m} iteration {it}" + (f" (entry {e})" if e else "")
        got = _resumed(done[i], start)
        if isinstance(got, Divergence):
            out.append(Comparison(name, divergences=[got]))
        else:
            out.append(compare(name, reference, got, since=start))
    return out


def _boundary_checkpoints(p: Prepared, order: Iterable[Boundary]) -> list[Boundary]:
    """The first record's committed boundary checkpoints, in run order."""
    have = {(m, e, it) for (m, e), its in p.boundaries.items() for it in its}
    return [b for b in order if b in have]


def _protocol(
    script: str, args: list[str], store_dir: str, k: int, trust: bool
) -> tuple[list[Comparison], str]:
    for n in (1, 2):
        _record(script, args, store_dir, n, trust)
    store = open_store(store_dir, create=False, trust=trust)
    first, second = (r for r in store.runs() if r.kind == "record")
    reference = _digests(store, first.id)
    comparisons = [compare("record 2", reference, _digests(store, second.id))]
    if k == 0:
        return comparisons, ""
    with contextlib.redirect_stderr(io.StringIO()):  # the replay plan: not verify's to print
        p = prepare(script, first.id, [], None, store_dir, trust, located=(store, first))
    starts = _spread(_boundary_checkpoints(p, reference.boundaries), k)
    if not starts:
        return comparisons, _no_boundaries(store, first)
    return comparisons + _resumes(p, reference, starts), ""


def _no_boundaries(store: Store, run: Run) -> str:
    """Why the first record has no boundary checkpoint to resume from."""
    if not store.iteration_hashes(run.id):
        return "the script has no main loop (see `flortrain instrument --explain`)"
    why = next((b.note for b in store.blocks(run.id) if b.note), None)
    return "the main loop took no boundary checkpoint" + (f": {why}" if why else "")


def verify(
    script: str, args: list[str], resumes: int, as_json: bool, trust: bool, keep: str | None
) -> int:
    """Run the protocol and print its report; the exit status (0 reproducible, 1 not)."""
    t0 = time.perf_counter()
    text = read_text(script)  # a missing or undecodable script: one line, before any record
    root = keep if keep is not None else tempfile.mkdtemp(prefix="flortrain-verify-")
    if keep is not None and os.path.exists(os.path.join(keep, "flortrain.db")):
        raise FlortrainError(f"--keep {keep}: a store is already there", code=CODE)
    try:
        comparisons, no_resumes = _protocol(script, args, root, resumes, trust)
    except _Relayed as e:
        print(e, file=sys.stderr)
        return 2
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    checked = check(script, text)
    report = Report(
        script,
        args,
        comparisons,
        no_resumes,
        list(checked.findings),
        checked.failed,
        time.perf_counter() - t0,
    )
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.reproducible else 1


__all__ = ["verify"]
