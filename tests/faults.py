"""The fault-injection harness: crash a record, damage a store, and check what survives.

Each trial injects one fault into real processes on a real store and classifies the outcome
against the ground truth, a plain ``python`` run:

- ``exact``: the replay exits 0, prints exactly the probe lines a plain run of the probed script
  prints, and ``flortrain diff`` exits 0;
- ``refused``: a clean refusal, exit 2 with one line on stderr and no traceback;
- ``wrong``: anything else a user could take for an answer (exit 0 with other output, a diff
  that passes a different replay). Must stay 0;
- ``none``: the record was killed before it began a run: there is nothing to replay (the store
  must still open);
- ``broken``: the training run itself (``flortrain record``) printed or exited otherwise than
  ``python`` does, other than by the injected kill. Must stay 0.

Faults:

- ``kill``: SIGKILL the recording process (or its whole process group: the background writer
  and DataLoader workers too) at a random moment. Then the store must open, the run must read as
  incomplete, every checkpoint marked complete must verify by hash, a probed replay of the
  incomplete run must be exact and say where the record stopped, and (once per fixture, after
  its trials) a complete record of the same script into the same store must be unaffected.
  The killed run is then resumed (``record --resume``): it must print the rest of python's
  output, its whole log must be python's output, and its probed replay must be exact (or it
  refuses in one line when no boundary checkpoint was committed);
- ``blob-truncated``, ``blob-bitflip``, ``blob-missing``, ``object-truncated``,
  ``object-missing``: damage one checkpoint file of a complete record, then replay;
- ``db-corrupt``: overwrite one page of the SQLite database with garbage, then replay;
- ``db-locked``: hold the database's write lock during a replay (``FLORTRAIN_DB_TIMEOUT=1``);
- ``db-locked-record``: hold it for a while in the middle of a record;
- ``enospc``: record into a small tmpfs that fills up (needs unprivileged user namespaces:
  ``unshare -rm``), then replay a copy of what was stored;
- ``read-only``: replay from, and record into, a store bind-mounted read-only (``unshare``).

Every random choice comes from one ``random.Random(seed)``, so a failing trial reproduces.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from flortrain.store.blobs import digest
from tests.protocol import FIXTURES, Result, plain, probe_lines, record, with_probe

#: Fixtures with a few seconds of training at most, several epochs and checkpoints.
KILL_FIXTURES = (
    "module_level",
    "while_early_stop",
    "random_shuffle",
    "warmup_accum",
    "dataloader_workers",
    "rnn_hidden",
)
STORE_FAULTS = (
    "blob-truncated",
    "blob-bitflip",
    "blob-missing",
    "object-truncated",
    "object-missing",
    "db-corrupt",
    "db-locked",
    "db-locked-record",
    "enospc",
    "read-only",
)
NEEDS_NAMESPACE = frozenset({"enospc", "read-only"})
EVERY = {"FLORTRAIN_PERIOD": "every"}


#: A script whose loop changes a tensor large enough to be a content-addressed object (a 2 MB
#: table): the ``object-*`` faults damage those files, which the fixtures' small models lack.
FROZEN = """import torch
import torch.nn as nn

torch.manual_seed(0)
table = nn.Linear(512, 1024, bias=False)   # 2 MB: an object in every checkpoint
head = nn.Linear(1024, 4)
opt = torch.optim.SGD([*table.parameters(), *head.parameters()], lr=0.1)
x = torch.randn(64, 512)
y = torch.randint(0, 4, (64,))
for epoch in range(4):
    for step in range(4):
        feats = table(x[step * 16:(step + 1) * 16])
        loss = nn.functional.cross_entropy(head(feats), y[step * 16:(step + 1) * 16])
        opt.zero_grad()
        loss.backward()
        # flortrain-probe inner: print(f"PROBE inner {epoch} {step} {head.weight.grad.norm().item():.10f}")
        opt.step()
    # flortrain-probe outer: print(f"PROBE outer {epoch} {head.weight.sum().item():.10f}")
    print(f"epoch {epoch} loss {loss.item():.10f}")
"""


def namespaces_available() -> bool:
    """Whether this machine lets an unprivileged user namespace mount a tmpfs (``enospc`` and
    ``read-only`` need it to make a real full or read-only filesystem)."""
    try:
        return (
            subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=10).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Proc:
    code: int
    out: str
    err: str


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> Proc:
    p = subprocess.run(
        cmd,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Proc(p.returncode, p.stdout, p.stderr)


def _ft(cwd: Path, store: Path, *args: str, env: dict[str, str] | None = None) -> Proc:
    return _run([sys.executable, "-m", "flortrain", "--store", str(store), *args], cwd, env)


def clean_refusal(p: Proc) -> bool:
    lines = [ln for ln in p.err.splitlines() if ln.strip()]
    return p.code == 2 and "Traceback" not in p.err and bool(lines) and not p.out.strip()


@dataclass
class Trial:
    fault: str
    fixture: str
    outcome: str  # exact | refused | wrong | broken
    detail: str = ""


@dataclass
class Tally:
    trials: list[Trial] = field(default_factory=list)
    later_records_ok: int = 0
    later_records: int = 0
    checkpoints_verified: int = 0
    warnings_naming_damage: int = 0
    resumed: int = 0
    resumes_refused: int = 0

    def add(self, t: Trial) -> None:
        self.trials.append(t)

    def figures(self) -> dict[str, object]:
        by_fault = Counter(t.fault for t in self.trials)
        outcomes = Counter(t.outcome for t in self.trials)
        return {
            "trials": len(self.trials),
            "faults_by_kind": dict(sorted(by_fault.items())),
            "replays_exact": outcomes["exact"],
            "killed_before_a_run_began": outcomes["none"],
            "clean_refusals": outcomes["refused"],
            "silent_wrong_answers": outcomes["wrong"],
            "training_runs_broken": outcomes["broken"],
            "checkpoints_verified_after_kill": self.checkpoints_verified,
            "warnings_naming_the_damage": self.warnings_naming_damage,
            "killed_records_resumed_exactly": self.resumed,
            "resumes_refused_no_boundary": self.resumes_refused,
            "later_complete_records_unaffected": f"{self.later_records_ok} of {self.later_records}",
            "by_fault_and_outcome": {
                f: dict(Counter(t.outcome for t in self.trials if t.fault == f))
                for f in sorted(by_fault)
            },
        }

    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.outcome in ("wrong", "broken")]


class Fixture:
    """One fixture in its own directory, with its plain runs (the ground truth) done once."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.text = FROZEN if name == "frozen_table" else (FIXTURES / f"{name}.py").read_text()
        # named as tests/test_protocol.py names it, so that their ground truths are one run
        self.script = self.dir / f"{name}.py"
        self.script.write_text(self.text)
        self.truth = plain(self.script)
        self.seconds = self.truth.seconds
        self._probed: dict[str, list[str]] = {}
        self.pristine_run = 0

    def pristine_copy(self, store: Path) -> int:
        """A copy of one complete record of this fixture (checkpoints at every instance), made
        once: each store fault damages its own copy. Returns the record's run id."""
        pristine = self.dir / "pristine-store"
        if not pristine.exists():
            self.pristine_run = _complete_record(self, pristine)
        shutil.copytree(pristine, store, symlinks=True)
        return self.pristine_run

    def probed_truth(self, kind: str) -> list[str]:
        if kind not in self._probed:
            self.script.write_text(with_probe(self.text, kind))
            self._probed[kind] = probe_lines(plain(self.script).out)
            self.script.write_text(self.text)
            assert self._probed[kind], f"{self.name}: the {kind} probe printed nothing"
        return self._probed[kind]

    def replay(
        self, store: Path, kind: str, *extra: str, env: dict[str, str] | None = None
    ) -> tuple[Proc, Proc | None]:
        """A probed replay and, when it succeeded, ``diff``; the script is restored afterwards."""
        self.script.write_text(with_probe(self.text, kind))
        try:
            rep = _ft(self.dir, store, "replay", self.script.name, *extra, env=env)
        finally:
            self.script.write_text(self.text)
        d = _ft(self.dir, store, "diff") if rep.code == 0 else None
        return rep, d

    def judge(self, rep: Proc, d: Proc | None, kind: str) -> tuple[str, str]:
        if rep.code == 0:
            if probe_lines(rep.out) != self.probed_truth(kind):
                return "wrong", "probe lines differ from the plain probed run"
            if d is None or d.code != 0:
                return (
                    "wrong",
                    f"diff exit {None if d is None else d.code}: {'' if d is None else d.out[-300:]}",
                )
            return "exact", ""
        if clean_refusal(rep):
            return "refused", rep.err.strip().splitlines()[-1]
        return "wrong", f"replay exit {rep.code} without a clean refusal: {rep.err[-400:]}"


# -- crashes ---------------------------------------------------------------------------------------
def _runs(fx: Fixture, store: Path) -> list[dict[str, object]]:
    r = _ft(fx.dir, store, "runs", "--json")
    assert r.code == 0, f"the store does not open after a kill: {r.err}"
    out: list[dict[str, object]] = json.loads(r.out)
    return out


def verify_checkpoints(store: Path, run_id: int) -> int:
    """Every committed checkpoint's blob hashes to its row, and every content-addressed object to
    its name (torn temporary files of a killed writer are hidden names, never committed)."""
    db = sqlite3.connect(store / "flortrain.db")
    try:
        rows = db.execute(
            "SELECT key, path, sha256 FROM checkpoints WHERE run_id=?", (run_id,)
        ).fetchall()
    finally:
        db.close()
    blobs = store / "blobs"
    for key, rel, sha in rows:
        data = (blobs / rel).read_bytes()
        assert digest(key, data) == sha, f"committed checkpoint {key} does not verify"
    objects = blobs / "objects"
    if objects.exists():
        for p in objects.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                assert xxhash.xxh3_128_hexdigest(p.read_bytes()) == p.name, (
                    f"object {p.name} does not verify"
                )
    return len(rows)


def kill_trial(fx: Fixture, store: Path, rng: random.Random, tally: Tally) -> None:
    """Record, SIGKILL at a random moment, then check the store and replay what was recorded.
    One kill in ten lands while flortrain starts (instrumenting, opening the store); the others
    at a uniform moment of the training that follows the run's start, or just after it."""
    whole_group = rng.random() < 0.5
    early = rng.random() < 0.1
    delay = rng.uniform(0.0, 1.0) if early else rng.uniform(0.0, fx.seconds * 1.1)
    kind = rng.choice(("inner", "outer"))
    env = {**os.environ, **(EVERY if rng.random() < 0.5 else {})}
    before = len(_runs(fx, store)) if (store / "flortrain.db").exists() else 0
    p = subprocess.Popen(
        [sys.executable, "-m", "flortrain", "--store", str(store), "record", fx.script.name],
        cwd=fx.dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    if not early:
        assert p.stderr is not None
        for line in p.stderr:  # the run has begun: the script starts now
            if line.startswith("flortrain: record run "):
                break
    time.sleep(delay)
    try:
        if whole_group:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            p.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, _ = p.communicate(timeout=120)
    what = (
        f"kill {delay:.2f}s after {'start' if early else 'the run began'}"
        f" ({'group' if whole_group else 'process'}), {kind} probe"
    )
    if not fx.truth.out.startswith(out):
        tally.add(Trial("kill", fx.name, "broken", f"{what}: record printed what python does not"))
        return
    # the writer and DataLoader workers notice their parent is gone within a second or two
    deadline = time.monotonic() + 20
    while True:
        runs = _runs(fx, store) if (store / "flortrain.db").exists() else []
        if len(runs) == before:
            tally.add(Trial("kill", fx.name, "none", f"{what}: killed before its run began"))
            return
        run = runs[-1]
        if run["status"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # a kill after the run was finalized (at interpreter exit) leaves a complete run, which must
    # then hold everything python printed; any other run must read as incomplete
    finished = run["status"] == "complete"
    if (finished and out != fx.truth.out) or run["status"] not in ("complete", "incomplete"):
        tally.add(
            Trial(
                "kill",
                fx.name,
                "wrong",
                f"{what}: run reads {run['status']} after printing {len(out)} bytes",
            )
        )
        return
    tally.checkpoints_verified += verify_checkpoints(store, int(run["id"]))  # type: ignore[call-overload]
    rep, d = fx.replay(store, kind, "--run", str(run["id"]))
    outcome, detail = fx.judge(rep, d, kind)
    if outcome == "exact" and not finished and "stopped" not in rep.err:
        outcome, detail = "wrong", "the replay did not say where the record stopped"
    if outcome == "exact" and not finished:
        outcome, detail = resume_trial(fx, store, int(run["id"]), kind, tally)  # type: ignore[call-overload]
    tally.add(Trial("kill", fx.name, outcome, f"{what}: {detail}" if detail else what))


def resume_trial(fx: Fixture, store: Path, run_id: int, kind: str, tally: Tally) -> tuple[str, str]:
    """``record --resume`` of the killed run: it continues from where its checkpoints reach and
    prints the rest of what python prints; the run's whole log is then python's output, and a
    probed replay of it is exact. Or it refuses in one line (nothing to continue from)."""
    res = _ft(fx.dir, store, "record", "--resume", str(run_id), fx.script.name)
    if res.code == 2 and clean_refusal(res) and "FT042" in res.err:
        tally.resumes_refused += 1
        return "exact", "resume refused: no boundary or checkpointed iteration committed"
    if res.code != fx.truth.code or not fx.truth.out.endswith(res.out):
        return (
            "broken",
            f"resumed record exit {res.code}, not the rest of python's output: {res.err[-300:]}",
        )
    db = sqlite3.connect(store / "flortrain.db")
    try:
        logged = [
            t for (t,) in db.execute("SELECT text FROM logs WHERE run_id=? ORDER BY seq", (run_id,))
        ]
    finally:
        db.close()
    if logged != fx.truth.out.splitlines():
        return "wrong", "the resumed run's log is not python's output"
    rep, d = fx.replay(store, kind, "--run", str(run_id))
    outcome, detail = fx.judge(rep, d, kind)
    if outcome == "exact":
        tally.resumed += 1
    return outcome, detail and f"after resume: {detail}"


def later_record(fx: Fixture, store: Path, tally: Tally) -> None:
    """After crashed records, a complete record of the same script into the same store."""
    tally.later_records += 1
    rec = _ft(fx.dir, store, "record", fx.script.name)
    if rec.out != fx.truth.out or rec.code != fx.truth.code:
        tally.add(
            Trial("kill", fx.name, "broken", "the record after the crashes differs from python")
        )
        return
    rep, d = fx.replay(store, "inner")
    if fx.judge(rep, d, "inner")[0] == "exact" and "incomplete" not in rep.err:
        tally.later_records_ok += 1


# -- store faults ----------------------------------------------------------------------------------
def _complete_record(fx: Fixture, store: Path) -> int:
    """A complete record of the fixture in ``store``: the session's record of it (test_protocol
    records each fixture so) moved there, or, beside the kill trials' store, a record into it."""
    rec: Proc | Result
    if (fx.dir / ".flortrain").exists():
        rec = _ft(fx.dir, store, "record", fx.script.name, env=EVERY)
    else:
        rec = record(fx.dir, fx.script.name, env=EVERY)
        (fx.dir / ".flortrain").rename(store)
    assert rec.out == fx.truth.out and rec.code == fx.truth.code, rec.err
    run_id = _runs(fx, store)[-1]["id"]
    assert isinstance(run_id, int)
    return run_id


def _damage_file(path: Path, how: str, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: rng.randrange(len(data))]))
    elif how == "bitflip":
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    else:
        path.unlink()


def _in_namespace(script: str, cwd: Path) -> Proc:
    return _run(["unshare", "-rm", "sh", "-c", script], cwd)


def store_fault_trial(
    fault: str, fx: Fixture, base: Path, rng: random.Random, tally: Tally
) -> None:
    """One store fault against a fresh complete record (or, for record-time faults, a record)."""
    # damage is found where a checkpoint is restored: an outer probe restores every inner block
    kind = "outer" if fault.startswith(("blob-", "object-")) else rng.choice(("inner", "outer"))
    store = base / f"store-{fault}-{len(tally.trials)}"
    if fault == "db-locked-record":
        _locked_record(fx, store, rng, kind, tally)
        return
    if fault == "enospc":
        _full_disk_record(fx, store, rng, kind, tally)
        return
    run_id = fx.pristine_copy(store)
    env: dict[str, str] = {}
    warned = ""
    if fault.startswith(("blob-", "object-")):
        how = fault.split("-", 1)[1]
        if fault.startswith("blob-"):
            db = sqlite3.connect(store / "flortrain.db")
            # a block instance's checkpoint (``L...``), not a main-loop boundary's (``M...``): a
            # replay that does not jump over iterations never reads those
            rows = db.execute(
                "SELECT key, path FROM checkpoints WHERE run_id=? AND key LIKE 'L%' ORDER BY key",
                (run_id,),
            ).fetchall()
            db.close()
            key, rel = rng.choice(rows)
            _damage_file(store / "blobs" / rel, how, rng)
            warned = key
        else:
            objects = sorted(p for p in (store / "blobs" / "objects").rglob("*") if p.is_file())
            assert objects, f"{fx.name} stores no content-addressed object"
            _damage_file(rng.choice(objects), how, rng)
            warned = "missing or corrupt"
    if fault == "db-corrupt":
        _corrupt_page(store / "flortrain.db", rng)
    if fault == "read-only":
        _read_only_trials(fx, store, kind, tally)
        return
    if fault == "db-locked":
        env = {"FLORTRAIN_DB_TIMEOUT": "1"}
        holder = sqlite3.connect(store / "flortrain.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            rep, d = fx.replay(store, kind, env=env)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    else:
        rep, d = fx.replay(store, kind, env=env)
    outcome, detail = fx.judge(rep, d, kind)
    if (
        outcome == "exact"
        and warned
        and ("missing or corrupt" in rep.err or "cannot be read" in rep.err)
    ):
        tally.warnings_naming_damage += 1
    tally.add(Trial(fault, fx.name, outcome, detail))


def _corrupt_page(db_path: Path, rng: random.Random) -> None:
    """Garbage over one 4 KB page of the database (its WAL checkpointed into it first)."""
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = bytearray(db_path.read_bytes())
    pages = max(1, len(data) // 4096)
    page = rng.randrange(pages)
    data[page * 4096 : (page + 1) * 4096] = rng.randbytes(min(4096, len(data) - page * 4096))
    db_path.write_bytes(bytes(data))


def _locked_record(fx: Fixture, store: Path, rng: random.Random, kind: str, tally: Tally) -> None:
    """Another process holds the database's write lock in the middle of a record: the record's
    writes time out, and training must go on untouched."""
    fx.pristine_copy(store)  # the store and its database exist before the lock is taken
    p = subprocess.Popen(
        [sys.executable, "-m", "flortrain", "--store", str(store), "record", fx.script.name],
        cwd=fx.dir,
        env={**os.environ, **EVERY, "FLORTRAIN_DB_TIMEOUT": "1", "FLORTRAIN_COMMIT_INTERVAL": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stderr is not None
    first = ""
    for first in p.stderr:  # the run has begun (a lock before it is a refusal to start, not this)
        if first.startswith("flortrain: record run "):
            break
    time.sleep(rng.uniform(0.0, fx.seconds * 0.8))
    holder = sqlite3.connect(store / "flortrain.db", isolation_level=None, timeout=30)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        out, err = p.communicate(timeout=300)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    err = first + err
    if out != fx.truth.out or p.returncode != fx.truth.code:
        tally.add(
            Trial("db-locked-record", fx.name, "broken", f"exit {p.returncode}: {err[-300:]}")
        )
        return
    run = _runs(fx, store)[-1]
    rep, d = fx.replay(store, kind, "--run", str(run["id"]))
    outcome, detail = fx.judge(rep, d, kind)
    tally.add(
        Trial(
            "db-locked-record",
            fx.name,
            outcome,
            detail or f"run {run['status']}, stored: {'failed' in err}",
        )
    )


def _full_disk_record(
    fx: Fixture, store: Path, rng: random.Random, kind: str, tally: Tally
) -> None:
    """Record into a tmpfs that fills up part way (a real ENOSPC), then replay a copy of it."""
    size_kb = rng.choice((160, 400, 1200, 4000))
    mnt = store.parent / f"mnt-{store.name}"
    mnt.mkdir(parents=True)
    out_dir = store.parent / f"out-{store.name}"
    out_dir.mkdir()
    env = " ".join(f"{k}={v}" for k, v in EVERY.items())
    script = (
        f"mount -t tmpfs -o size={size_kb}k tmpfs {mnt} || exit 97; "
        f"{env} {sys.executable} -m flortrain --store {mnt}/store record {fx.script.name} "
        f"> {out_dir}/stdout 2> {out_dir}/stderr; echo $? > {out_dir}/code; cp -a {mnt}/store {store} 2>/dev/null; true"
    )
    ns = _in_namespace(script, fx.dir)
    if ns.code == 97:
        raise RuntimeError(f"cannot mount a tmpfs in a user namespace: {ns.err}")
    out = (out_dir / "stdout").read_text()
    code = int((out_dir / "code").read_text())
    err = (out_dir / "stderr").read_text()
    if code == 2 and not out and "Traceback" not in err:  # the store could not even be created
        tally.add(
            Trial("enospc", fx.name, "refused", f"{size_kb} KB: {err.strip().splitlines()[-1]}")
        )
        return
    if out != fx.truth.out or code != fx.truth.code:
        tally.add(Trial("enospc", fx.name, "broken", f"{size_kb} KB: exit {code}: {err[-300:]}"))
        return
    rep, d = fx.replay(store, kind)
    outcome, detail = fx.judge(rep, d, kind)
    tally.add(
        Trial("enospc", fx.name, outcome, f"{size_kb} KB: {detail}" if detail else f"{size_kb} KB")
    )


def _read_only_trials(fx: Fixture, store: Path, kind: str, tally: Tally) -> None:
    """A replay from and a record into a store mounted read-only: each a clean refusal or exact."""
    probed = fx.dir / "probed.py"
    probed.write_text(with_probe(fx.text, kind))
    ro = f"mount --bind {store} {store} && mount -o remount,bind,ro {store} || exit 97; "
    cmd = f"{sys.executable} -m flortrain --store {store}"
    for what, tail in (
        ("replay", f"cp probed.py {fx.script.name}; {cmd} replay {fx.script.name}"),
        ("record", f"{cmd} record {fx.script.name}"),
    ):
        ns = _in_namespace(ro + tail, fx.dir)
        fx.script.write_text(fx.text)
        if ns.code == 97:
            raise RuntimeError(f"cannot bind-mount read-only in a user namespace: {ns.err}")
        if clean_refusal(ns):
            tally.add(
                Trial("read-only", fx.name, "refused", f"{what}: {ns.err.strip().splitlines()[-1]}")
            )
        elif what == "record" and (ns.out != fx.truth.out or ns.code != fx.truth.code):
            tally.add(
                Trial("read-only", fx.name, "broken", f"{what}: exit {ns.code}: {ns.err[-300:]}")
            )
        elif what == "replay" and ns.code == 0 and probe_lines(ns.out) != fx.probed_truth(kind):
            tally.add(Trial("read-only", fx.name, "wrong", f"{what}: probe lines differ"))
        else:
            tally.add(
                Trial(
                    "read-only",
                    fx.name,
                    "exact" if ns.code == 0 else "wrong",
                    f"{what}: exit {ns.code}",
                )
            )
    probed.unlink()


# -- the suite -------------------------------------------------------------------------------------
def run_suite(
    root: Path,
    seed: int,
    kills: int,
    store_faults: int,
    fixtures: tuple[str, ...] = KILL_FIXTURES,
    faults: tuple[str, ...] = STORE_FAULTS,
    log: bool = False,
) -> Tally:
    """``kills`` crash trials spread over ``fixtures`` (each fixture's store then takes a complete
    record), and ``store_faults`` store-fault trials cycling through ``faults``."""
    rng = random.Random(seed)
    tally = Tally()
    if not namespaces_available():
        faults = tuple(f for f in faults if f not in NEEDS_NAMESPACE)
    fx_cache: dict[str, Fixture] = {}

    def fixture(name: str) -> Fixture:
        if name not in fx_cache:
            fx_cache[name] = Fixture(name, root)
        return fx_cache[name]

    used: list[str] = []
    for i in range(kills):
        fx = fixture(fixtures[i % len(fixtures)])
        kill_trial(fx, fx.dir / ".flortrain", rng, tally)
        if fx.name not in used:
            used.append(fx.name)
        if log:
            print(f"trial {len(tally.trials)}: {tally.trials[-1]}", file=sys.stderr)
    for name in used:
        later_record(fx_cache[name], fx_cache[name].dir / ".flortrain", tally)
    for i in range(store_faults):
        fault = faults[i % len(faults)]
        name = (
            "frozen_table"
            if fault.startswith("object-")
            else fixtures[rng.randrange(len(fixtures))]
        )
        fx = fixture(name)
        store_fault_trial(fault, fx, root / "stores", rng, tally)
        if log:
            print(f"trial {len(tally.trials)}: {tally.trials[-1]}", file=sys.stderr)
    for fx in fx_cache.values():
        shutil.rmtree(fx.dir / ".flortrain", ignore_errors=True)
    return tally
