"""SQLite schema and queries. One :class:`Store` per process; forked children (DataLoader
workers, materializers) never touch the parent's connection."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import os
import socket
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from flortrain import knobs
from flortrain.errors import FlortrainError, Located
from flortrain.store import confine
from flortrain.store.blobs import BlobReader, hasher, object_rel
from flortrain.store.confine import DIR_MODE, private_dir
from flortrain.store.records import (
    BlockRow,
    BlockState,
    Checkpoint,
    Damaged,
    Run,
    RunStatus,
    refuse,
)
from flortrain.store.trust import MANIFEST, RunLock, held, verify, write_manifest

#: Bumped whenever a table changes, or what its rows name does. ``CREATE TABLE IF NOT EXISTS``
#: never migrates, so a store written by another version must be refused when it is opened, not
#: fail in the middle of a run. 8: tensor objects and the part digests are named by XXH3-128
#: instead of sha256 (``store/content.py``). 9: the ``files`` a record's script read and wrote
#: and their states at each checkpoint. 10: a checkpoint's ``sha256`` covers its key as well
#: as its blob's bytes (``store/blobs.py``: :func:`~flortrain.store.blobs.digest`), so a store of
#: 9 or earlier, whose rows hold the bytes' digest alone, is refused.
SCHEMA_VERSION = 10

SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (sha TEXT PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,               -- record | replay
    script TEXT NOT NULL,             -- absolute path
    cwd TEXT NOT NULL,
    argv TEXT NOT NULL,               -- JSON list, sys.argv[1:]
    source_sha TEXT NOT NULL REFERENCES sources(sha),
    parent INTEGER REFERENCES runs(id),   -- for a replay: the record it replays
    started REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,             -- running | complete | failed | interrupted (SIGINT, SIGTERM)
    exit_code INTEGER,
    threads INTEGER,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}'   -- JSON: versions, plan summary, probes
);
CREATE TABLE IF NOT EXISTS blocks (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    block_id TEXT NOT NULL,
    main_id TEXT NOT NULL,
    main_inst INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    occurrence INTEGER NOT NULL,
    state TEXT NOT NULL,              -- recorded | checkpointed | skipped | executed | failed
    compute_s REAL,
    materialize_s REAL,
    restore_s REAL,
    note TEXT,
    state_sha TEXT,                   -- JSON: part -> digest of the state at the end (checkpointed,
                                      -- or executed where the record has a checkpoint)
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    path TEXT NOT NULL,               -- relative to the store
    sha256 TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS iterations (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    main_id TEXT NOT NULL,
    main_inst INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    rng_sha TEXT NOT NULL,
    rng BLOB,                         -- NULL (full RNG states were kept here once, never read)
    scalars TEXT,                     -- JSON: the main loop's carried plain scalars at the start
                                      -- of the iteration (iteration spans evaluate probe guards)
    t REAL,                           -- seconds since the run's session began, at the start (the
                                      -- parallel replay planner's per-iteration cost)
    seq INTEGER,                      -- stdout lines captured before it started (where a resumed
                                      -- record's log continues)
    PRIMARY KEY (run_id, main_id, main_inst, iteration)
);
CREATE TABLE IF NOT EXISTS jumps (    -- replay: main-loop iterations skipped as a span
    run_id INTEGER NOT NULL REFERENCES runs(id),
    main_id TEXT NOT NULL,
    main_inst INTEGER NOT NULL,
    first INTEGER NOT NULL,           -- first iteration skipped
    resumed INTEGER NOT NULL,         -- the iteration whose boundary checkpoint was restored
    PRIMARY KEY (run_id, main_id, main_inst, first)
);
CREATE TABLE IF NOT EXISTS files (   -- record: a file its script opened, as it first found it
    run_id INTEGER NOT NULL REFERENCES runs(id),
    path TEXT NOT NULL,               -- absolute, symbolic links resolved
    first TEXT NOT NULL,              -- read | write: what the script did to it first
    size INTEGER,                     -- NULL: it did not exist
    fingerprint TEXT,                 -- runtime/files.py: fingerprint()
    object TEXT,                      -- its content when the script first wrote it, a blob-store
                                      -- object (NULL: absent, not kept, or never written)
    written INTEGER NOT NULL,         -- the script wrote, renamed or removed it
    reread INTEGER NOT NULL,          -- the script read it after writing it
    PRIMARY KEY (run_id, path)
);
CREATE TABLE IF NOT EXISTS file_states ( -- record: files it wrote, as a checkpoint found them
    run_id INTEGER NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,                -- the checkpoint's
    path TEXT NOT NULL,
    size INTEGER,                     -- NULL: absent
    fingerprint TEXT,
    object TEXT,                      -- its content (NULL: absent or not kept)
    PRIMARY KEY (run_id, key, path)
);
CREATE TABLE IF NOT EXISTS logs (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    main_id TEXT,
    main_inst INTEGER,
    iteration INTEGER,
    region TEXT,                      -- key of the outermost block instance it was printed in
    probe INTEGER NOT NULL,
    segments TEXT,                    -- JSON pieces when the line mixes regions or probe output
    PRIMARY KEY (run_id, seq)
);
"""


#: Additive changes a store of an older version takes when it is opened: version -> the statements
#: that bring it to the next one. Runs recorded before a migration simply have no rows there.
#: None since 10: no older store can be brought to it (its checkpoint digests would have to be
#: trusted to compute the new ones).
MIGRATIONS: dict[int, str] = {}


def store_path(explicit: str | None = None) -> Path:
    raw = explicit or os.environ.get(knobs.STORE_ENV) or knobs.STORE_DIRNAME
    return Path(raw).resolve()


#: One main-loop iteration's row: main id, entry, iteration, RNG digests, encoded RNG state (None:
#: no longer written), carried scalars (JSON), start time in seconds since the session began,
#: captured lines before it.
IterationRow = tuple[str, int, int, str, bytes | None, str | None, float | None, int | None]
#: a file a record's script opened: path, first (read | write), size, fingerprint, kept content
#: object, written, read back after writing
FileRow = tuple[str, str, int | None, str | None, str | None, bool, bool]
#: a file as a checkpoint found it: path, size (None: absent), fingerprint, content object
FileState = tuple[str, int | None, str | None, str | None]


@dataclass(frozen=True)
class LogEntry:
    seq: int
    text: str
    main_id: str | None
    main_inst: int | None
    iteration: int | None
    region: str | None
    probe: bool
    #: when a line was written from more than one region or probe (``print(.., end="")`` in the
    #: epoch loop, dots from the batch loop, a probe's newline in between): its pieces, each
    #: ``(text, region, probe)``; the line's newline belongs to the last piece
    segments: tuple[tuple[str, str | None, bool], ...] | None = None

    def pieces(self) -> tuple[tuple[str, str | None, bool], ...]:
        return (
            self.segments if self.segments is not None else ((self.text, self.region, self.probe),)
        )

    def context(self) -> str:
        if self.main_id is None:
            return "outside the main loop"
        where = f"{self.main_id} iteration {self.iteration}"
        if self.main_inst:
            where += f" (entry {self.main_inst})"
        return where + (f", block {self.region}" if self.region else "")


W = TypeVar("W", bound=Callable[..., None])


def _writer(method: W) -> W:
    """A write the running script must survive. Only the process that opened the store writes
    (a forked child must not use its parent's connection). Once the store is ``guarded`` (a record
    or replay is executing the user's script), a failing write (disk full, a read-only store, a
    lock held past the timeout, a damaged database) does not raise into the script: the store
    warns once and stops writing, the run stays ``running`` in the database and so reads as
    incomplete once its process is gone, and the command reports it at the end."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> None:
        if not self.owned() or self.failed is not None:
            return
        if not self.guarded:
            method(self, *args, **kwargs)
            return
        try:
            method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as e:
            self.fail(f"{type(e).__name__}: {e}")

    return wrapper  # type: ignore[return-value]


def _migrates(version: int) -> bool:
    """Whether :data:`MIGRATIONS` bring a store of ``version`` to :data:`SCHEMA_VERSION`."""
    if version not in MIGRATIONS:
        return False
    while version in MIGRATIONS:
        version += 1
    return version == SCHEMA_VERSION


class Store:
    """One store: SQLite metadata and the blob directory beside it. Opening an existing store
    verifies it is the user's own (:func:`~flortrain.store.trust.verify`) unless ``trust``; a new
    one is created private and signed."""

    def __init__(self, root: Path, trust: bool = False) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.pid = os.getpid()
        self.reader = BlobReader(self.blobs)
        self.lock: RunLock | None = None
        #: writes no longer raise (see :func:`_writer`); set while the user's script runs
        self.guarded = False
        #: why the store stopped taking writes, once it has
        self.failed: str | None = None
        #: block rows and checkpoint claims held for one transaction (:meth:`hold_claims`)
        self._held: list[tuple[str, list[tuple[Any, ...]]]] | None = None
        db_path = root / "flortrain.db"
        try:
            if (root / MANIFEST).exists() or db_path.exists():
                verify(root, trust)
            else:
                private_dir(root)
                with contextlib.suppress(OSError):  # an existing empty directory made a store
                    os.chmod(root, DIR_MODE)
                write_manifest(root)
            # a link planted at ``blobs``, at the database or at its journal is refused: the
            # store writes nothing outside itself (``store/confine.py``)
            confine.directory(root, "blobs")
            os.close(confine.open_file(root, "flortrain.db", os.O_RDWR | os.O_CREAT))  # 0600
            for journal in ("flortrain.db-wal", "flortrain.db-shm"):
                if (root / journal).is_symlink():
                    raise OSError(errno.ELOOP, "a symbolic link in the store", journal)
            self.db = self._connect(db_path)
        except (OSError, sqlite3.Error) as e:
            raise FlortrainError(f"cannot open store: {e}", Located(str(root)), "FT010") from None

    def _connect(self, db_path: Path) -> sqlite3.Connection:
        """Open the database in WAL mode with its schema. Two processes opening a new store at once
        meet locks that SQLite reports at once instead of waiting on (switching the journal mode
        to WAL takes an exclusive lock): retried until ``FLORTRAIN_DB_TIMEOUT``."""
        timeout = knobs.db_timeout()
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            db = sqlite3.connect(db_path, timeout=timeout, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                self.db = db
                if not self._check_version():
                    self._create_schema()
                return db
            except sqlite3.OperationalError as e:
                db.close()
                if "locked" not in str(e) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _create_schema(self) -> None:
        """Tables and version in one write transaction: two records creating a store at once must
        not see each other's tables without their version (``executescript`` would commit each)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            if not self._check_version():
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _check_version(self) -> bool:
        """Whether the store has this version's schema (False: an empty database); a store of
        another version is refused."""
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        (tables,) = self.db.execute(
            "SELECT count(*) FROM sqlite_master WHERE type='table'"
        ).fetchone()
        if tables and _migrates(version):
            self._migrate()
            return True
        if tables and version != SCHEMA_VERSION:
            raise FlortrainError(
                f"store was written by another version of flortrain (schema {version}, this one"
                f" reads {SCHEMA_VERSION}); record into a new store (--store DIR)",
                Located(str(self.root)),
                "FT014",
            )
        return bool(tables)

    def _migrate(self) -> None:
        """Bring an older store to this schema, in one write transaction (two processes opening
        it at once: the second finds it migrated)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = self.db.execute("PRAGMA user_version").fetchone()
            while version in MIGRATIONS:
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                version += 1
            self.db.execute(f"PRAGMA user_version={version}")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _db_path(self) -> str:
        return str(self.root / "flortrain.db")

    def fail(self, why: str) -> None:
        """Stop writing, and say so once: what was committed stays, nothing later is claimed."""
        if self.failed is None:
            self.failed = why
            print(
                f"flortrain: warning: the store at {self.root} failed ({why}); nothing more is stored"
                " for this run, and the script goes on",
                file=sys.stderr,
            )

    def owned(self) -> bool:
        """False in a forked child: it must not write through the parent's connection."""
        return os.getpid() == self.pid

    def close(self) -> None:
        if self.owned():
            self.write_held()
            self.db.close()
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    # -- runs --------------------------------------------------------------------------------
    def put_source(self, text: str) -> str:
        sha = hashlib.sha256(text.encode()).hexdigest()
        self._put_source(sha, text)
        return sha

    @_writer
    def _put_source(self, sha: str, text: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO sources VALUES (?, ?)", (sha, text))

    def source(self, sha: str) -> str:
        row = self.db.execute("SELECT text FROM sources WHERE sha=?", (sha,)).fetchone()
        if row is None:
            raise FlortrainError(
                f"source snapshot {sha[:12]} missing", Located(str(self.root)), "FT011"
            )
        return str(row[0])

    def begin_run(
        self,
        kind: str,
        script: str,
        argv: list[str],
        source: str,
        parent: int | None,
        threads: int | None,
        meta: dict[str, Any],
    ) -> int:
        sha = self.put_source(source)
        self.db.execute("BEGIN IMMEDIATE")  # no row is left of a run refused here
        try:
            cur = self.db.execute(
                "INSERT INTO runs (kind, script, cwd, argv, source_sha, parent, started, status,"
                " threads, pid, host, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    kind,
                    script,
                    os.getcwd(),
                    json.dumps(argv),
                    sha,
                    parent,
                    time.time(),
                    RunStatus.RUNNING,
                    threads,
                    os.getpid(),
                    socket.gethostname(),
                    json.dumps(meta),
                ),
            )
            assert cur.lastrowid is not None
            self._take(cur.lastrowid, kind == "record")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return cur.lastrowid

    def _take(self, run_id: int, records: bool) -> None:
        """Hold run ``run_id``'s lock (it is alive while this process, or a child it forked, holds
        it) and, for a record, make the directory its checkpoints are written to. A symbolic link
        planted at either is refused in one line, before the script runs: what the store writes
        would land outside it."""
        where = f"blobs/{run_id}"
        try:
            if records:
                confine.directory(self.blobs, str(run_id))
            where = f"locks/run-{run_id}.lock"
            self.lock = RunLock(self.root, run_id)
        except OSError as e:
            raise FlortrainError(
                f"cannot start run {run_id}: {e.strerror or e} at {where}",
                Located(str(self.root)),
                "FT010",
            ) from None

    @_writer
    def set_meta(self, run_id: int, meta: dict[str, Any]) -> None:
        """Replace a run's meta: what a run learns while it runs (the project modules a record
        instrumented, as they are imported)."""
        self.db.execute("UPDATE runs SET meta=? WHERE id=?", (json.dumps(meta), run_id))

    @_writer
    def finish_run(self, run_id: int, status: RunStatus, exit_code: int) -> None:
        self.write_held()  # a run never reads as complete with claims still held
        if self.failed is not None:
            return  # they could not be written: the run stays `running`, so reads as incomplete
        self.db.execute(
            "UPDATE runs SET finished=?, status=?, exit_code=? WHERE id=?",
            (time.time(), status, exit_code, run_id),
        )
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _run(self, row: tuple[Any, ...]) -> Run:
        """A ``runs`` row, validated (:meth:`Run.from_row`), and whether its process lives."""
        try:
            run = Run.from_row(row, live=False)
        except Damaged as e:
            raise refuse(self._db_path(), f"run {row[0]!r}", e) from None
        if (
            run.status == RunStatus.RUNNING
            and run.host == socket.gethostname()
            and held(self.root, run.id)
        ):
            return dataclasses.replace(run, live=True)
        return run

    def run(self, run_id: int) -> Run:
        row = self.db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise FlortrainError(f"no run {run_id}", Located(str(self.root)), "FT012")
        return self._run(row)

    def runs(self) -> list[Run]:
        return [self._run(r) for r in self.db.execute("SELECT * FROM runs ORDER BY id")]

    def latest(self, kind: str, script: str | None = None, status: str | None = None) -> Run | None:
        for r in reversed(self.runs()):
            if (
                r.kind == kind
                and (script is None or r.script == script)
                and (status is None or r.effective_status == status)
            ):
                return r
        return None

    # -- blocks and checkpoints ------------------------------------------------------------------
    @_writer
    def put_block(self, run_id: int, row: BlockRow) -> None:
        self.put_blocks(run_id, [row])

    @_writer
    def put_blocks(self, run_id: int, rows: Iterable[BlockRow]) -> None:
        """Block rows in one transaction: a session batches the rows of instances without a
        checkpoint (they only describe the run) and writes them with its iterations, not one
        transaction per instance (0.2 ms each on the training thread)."""
        self._claim(
            "INSERT OR REPLACE INTO blocks VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [r.values(run_id) for r in rows],
        )

    def hold_claims(self) -> None:
        """From now on, hold block rows and checkpoint claims (:meth:`commit_checkpoint`,
        :meth:`mark_checkpointed`, :meth:`note_block`) until :meth:`write_held`, which writes them
        in order in one transaction. A record holds them from the start, and its session writes
        them once per commit interval: each checkpoint was three transactions on the training
        thread (its row, its claim when the writer reported it, the row's update), 0.3 ms of a
        0.1 s epoch. A killed record then lacks up to a commit interval of claims, whose blobs
        are on disk unclaimed: nothing is trusted that was not claimed, so those instances
        re-execute on replay, as their iteration rows and output of that interval are lost too."""
        if self._held is None:
            self._held = []

    def _claim(self, sql: str, values: list[tuple[Any, ...]]) -> None:
        if self._held is not None:
            if values:
                self._held.append((sql, values))
            return
        self._transaction([(sql, values)])

    @_writer
    def write_held(self) -> None:
        """Write what :meth:`hold_claims` held, in one transaction."""
        if self._held:
            held, self._held = self._held, []
            self._transaction(held)

    def _transaction(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """``executemany`` of each statement, in order, as one transaction (the connection is in
        autocommit mode, where each row would be its own)."""
        if not any(values for _, values in statements):
            return
        self.db.execute("BEGIN")
        try:
            for sql, values in statements:
                self.db.executemany(sql, values)
        except BaseException:
            self.db.execute("ROLLBACK")  # leave the connection usable, not inside a transaction
            raise
        self.db.execute("COMMIT")

    def restore_ratio(self, script: str) -> tuple[float, int] | None:
        """Flor's c = R/M (Eq. 3) as the latest replay of ``script`` measured it: the time it took
        to restore the block instances it skipped over the time their record was blocked
        materializing them; with that replay's id. None before any replay skipped anything."""
        row = self.db.execute(
            "SELECT r.id, SUM(b.restore_s), SUM(a.materialize_s) FROM runs r"
            " JOIN blocks b ON b.run_id = r.id AND b.state = ? AND b.restore_s IS NOT NULL"
            " JOIN blocks a ON a.run_id = r.parent AND a.key = b.key AND a.materialize_s > 0"
            " WHERE r.kind = 'replay' AND r.script = ? GROUP BY r.id ORDER BY r.id DESC LIMIT 1",
            (BlockState.SKIPPED, script),
        ).fetchone()
        if row is None or not row[2]:
            return None
        return float(row[1]) / float(row[2]), int(row[0])

    def blocks(self, run_id: int) -> list[BlockRow]:
        """A run's block instances, in the order their rows were written, validated."""
        out = []
        for row in self.db.execute("SELECT * FROM blocks WHERE run_id=? ORDER BY rowid", (run_id,)):
            try:
                out.append(BlockRow.from_row(row[1:]))
            except Damaged as e:
                raise refuse(self._db_path(), f"block {row[1]!r} of run {run_id}", e) from None
        return out

    def blob_rel(self, run_id: int, key: str) -> str:
        """Where a checkpoint's blob lives, relative to the blobs directory."""
        return f"{run_id}/{_safe(key)}.ft"

    def write_blob(self, run_id: int, key: str, data: bytes) -> tuple[str, str]:
        """Write a checkpoint blob durably under a temporary name, then rename it into place."""
        rel = self.blob_rel(run_id, key)
        sha = write_durably(self.blobs, rel, key, [data])
        return rel, sha

    @_writer
    def commit_checkpoint(self, run_id: int, key: str, rel: str, sha: str, nbytes: int) -> None:
        """The commit marker: a checkpoint exists only once this row does. Written only after its
        blob (and every tensor object it refers to) is on disk and verified."""
        self._claim(
            "INSERT OR REPLACE INTO checkpoints VALUES (?,?,?,?,?)",
            [(run_id, key, rel, sha, nbytes)],
        )

    @_writer
    def mark_checkpointed(self, run_id: int, key: str, digests: dict[str, str]) -> None:
        """A block instance's checkpoint committed (a main-loop boundary stays ``boundary``)."""
        self._claim(
            "UPDATE blocks SET state=CASE WHEN state=? THEN state ELSE ? END,"
            " state_sha=?, note=NULL WHERE run_id=? AND key=?",
            [(BlockState.BOUNDARY, BlockState.CHECKPOINTED, json.dumps(digests), run_id, key)],
        )

    @_writer
    def note_block(self, run_id: int, key: str, note: str) -> None:
        self._claim("UPDATE blocks SET note=? WHERE run_id=? AND key=?", [(note, run_id, key)])

    def checkpoints(self, run_id: int) -> dict[str, Checkpoint]:
        """key -> checkpoint, in the order the record committed them: the order a replay restores
        them in, which its read-ahead follows. A row whose path leaves the store, or that is
        otherwise not one flortrain writes, is refused (``FT018``)."""
        out: dict[str, Checkpoint] = {}
        for k, p, s, n in self.db.execute(
            "SELECT key, path, sha256, nbytes FROM checkpoints WHERE run_id=? ORDER BY rowid",
            (run_id,),
        ):
            try:
                out[k] = Checkpoint.from_row(k, p, s, n)
            except Damaged as e:
                raise refuse(self._db_path(), f"checkpoint {k!r} of run {run_id}", e) from None
        return out

    def read_blob(self, ck: Checkpoint) -> bytes | None:
        """The blob, or None when it is missing or does not match its recorded digest."""
        return self.reader.read_blob(ck)

    def read_object(self, sha: str) -> bytes | None:
        """A content-addressed tensor (see :mod:`flortrain.runtime.materializer`), verified."""
        return self.reader.read_object(sha)

    def read_ahead(self, order: list[Checkpoint], refs: Callable[[bytes], list[str]]) -> None:
        """Read ``order``'s checkpoints ahead of a replay (:class:`~flortrain.store.blobs.ReadAhead`)."""
        self.reader.read_ahead(order, refs)

    # -- files ---------------------------------------------------------------------------------
    @_writer
    def put_files(self, run_id: int, rows: Iterable[FileRow]) -> None:
        """A record's files as its script first found them (``runtime/files.py``). A resumed
        record sees them again: what the killed part found first is kept."""
        self._transaction(
            [
                (
                    "INSERT INTO files VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (run_id, path) DO UPDATE SET"
                    " written = max(written, excluded.written), reread = max(reread, excluded.reread),"
                    " object = coalesce(object, excluded.object)",
                    [(run_id, *r) for r in rows],
                )
            ]
        )

    def files(self, run_id: int) -> list[FileRow]:
        """(path, first, size, fingerprint, object, written, reread) of each file the record's
        script opened, in the order it first did."""
        return [
            (p, f, n, d, o, bool(w), bool(r))
            for p, f, n, d, o, w, r in self.db.execute(
                "SELECT path, first, size, fingerprint, object, written, reread FROM files WHERE run_id=?"
                " ORDER BY rowid",
                (run_id,),
            )
        ]

    @_writer
    def put_file_states(self, run_id: int, rows: Iterable[tuple[str, FileState]]) -> None:
        """The files checkpoints found (key, (path, size, fingerprint, object))."""
        self._transaction(
            [
                (
                    "INSERT OR REPLACE INTO file_states VALUES (?,?,?,?,?,?)",
                    [(run_id, k, *st) for k, st in rows],
                )
            ]
        )

    def file_states(self, run_id: int) -> dict[str, list[FileState]]:
        """Per checkpoint key, the files a replay that restores it puts back."""
        out: dict[str, list[FileState]] = {}
        for k, p, n, d, o in self.db.execute(
            "SELECT key, path, size, fingerprint, object FROM file_states WHERE run_id=? ORDER BY rowid",
            (run_id,),
        ):
            out.setdefault(k, []).append((p, n, d, o))
        return out

    # -- iterations ------------------------------------------------------------------------------
    @_writer
    def put_iterations(self, run_id: int, rows: Iterable[IterationRow]) -> None:
        self._transaction(
            [
                (
                    "INSERT OR REPLACE INTO iterations VALUES (?,?,?,?,?,?,?,?,?)",
                    [(run_id, *r) for r in rows],
                )
            ]
        )

    def iteration_times(self, run_id: int) -> dict[tuple[str, int], list[tuple[int, float]]]:
        """Per main-loop entry, (iteration, seconds since the session began at its start), in
        order: what the parallel replay planner divides into segments."""
        out: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for m, i, it, t in self.db.execute(
            "SELECT main_id, main_inst, iteration, t FROM iterations WHERE run_id=? AND t IS NOT NULL"
            " ORDER BY main_id, main_inst, iteration",
            (run_id,),
        ):
            out.setdefault((m, i), []).append((it, t))
        return out

    def last_iteration(self, run_id: int) -> tuple[str, int, int] | None:
        """The main-loop iteration a run reached last (main id, entry, iteration): where a killed
        record stopped, to within the commit interval."""
        row = self.db.execute(
            "SELECT main_id, main_inst, iteration FROM iterations WHERE run_id=? ORDER BY rowid DESC LIMIT 1",
            (run_id,),
        ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))

    # -- resuming a killed record ----------------------------------------------------------------
    def resume_point(self, run_id: int) -> tuple[str, int, int] | None:
        """The latest main-loop boundary of a run that a record can continue from: its checkpoint
        committed, and its iteration row too (that row was committed with every line printed
        before the iteration began, so the log up to it is whole)."""
        row = self.db.execute(
            "SELECT b.main_id, b.main_inst, b.iteration FROM blocks b"
            " JOIN checkpoints c ON c.run_id = b.run_id AND c.key = b.key"
            " JOIN iterations i ON i.run_id = b.run_id AND i.main_id = b.main_id"
            "  AND i.main_inst = b.main_inst AND i.iteration = b.iteration AND i.seq IS NOT NULL"
            " WHERE b.run_id = ? AND b.state = ? ORDER BY i.rowid DESC LIMIT 1",
            (run_id, BlockState.BOUNDARY),
        ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))

    def first_main_loop(self, run_id: int) -> tuple[str, int] | None:
        """The main loop and entry of a run's first committed iteration row."""
        row = self.db.execute(
            "SELECT main_id, main_inst FROM iterations WHERE run_id=? ORDER BY rowid LIMIT 1",
            (run_id,),
        ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def replayable_through(self, run_id: int, main_id: str, entry: int, boundary: int) -> int:
        """How far past its resume boundary (0: the loop's start) a killed record can be continued
        without computing:
        the first iteration ``k >= boundary`` that is not followed by a committed iteration row,
        or that has no block instance or one without a committed checkpoint. A resumed record
        runs ``boundary..k-1`` as a replay would (their blocks restored, the code between them
        executed, their output not printed again) and records from ``k`` on. ``k``'s row was
        committed with every line printed before it, so the log is whole up to it."""
        started = {
            int(it)
            for (it,) in self.db.execute(
                "SELECT iteration FROM iterations WHERE run_id=? AND main_id=? AND main_inst=?"
                " AND iteration >= ? AND seq IS NOT NULL",
                (run_id, main_id, entry, boundary),
            )
        }
        instances: dict[int, bool] = {}
        for it, restorable in self.db.execute(
            "SELECT b.iteration, c.key IS NOT NULL FROM blocks b LEFT JOIN checkpoints c"
            " ON c.run_id = b.run_id AND c.key = b.key WHERE b.run_id=? AND b.main_id=?"
            " AND b.main_inst=? AND b.iteration >= ? AND b.state != ?",
            (run_id, main_id, entry, boundary, BlockState.BOUNDARY),
        ):
            instances[int(it)] = instances.get(int(it), True) and bool(restorable)
        k = boundary
        while k + 1 in started and instances.get(k, False):
            k += 1
        return k

    def truncate_for_resume(
        self, run_id: int, main_id: str, entry: int, iteration: int, boundary: int
    ) -> tuple[int, float]:
        """Forget what a killed run recorded from the start of ``iteration`` on (a resumed record
        executes it again), keeping the checkpoint of the boundary it resumes from (at
        ``boundary <= iteration``), in one transaction. Returns how many captured lines are kept
        and the iteration's start time, where the resumed record's log and clock continue."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rowid, seq, t = self.db.execute(
                "SELECT rowid, seq, t FROM iterations WHERE run_id=? AND main_id=? AND main_inst=? AND iteration=?",
                (run_id, main_id, entry, iteration),
            ).fetchone()
            key = f"{main_id}@{main_id}.{entry}.{boundary}#0"
            self.db.execute("DELETE FROM iterations WHERE run_id=? AND rowid >= ?", (run_id, rowid))
            # the block instances of the iterations forgotten (rows are written out of iteration
            # order: a checkpointed instance's row waits for its checkpoint)
            self.db.execute(
                "DELETE FROM blocks WHERE run_id=? AND key != ? AND NOT EXISTS (SELECT 1 FROM"
                " iterations i WHERE i.run_id = blocks.run_id AND i.main_id = blocks.main_id"
                " AND i.main_inst = blocks.main_inst AND i.iteration = blocks.iteration)",
                (run_id, key),
            )
            self.db.execute(
                "DELETE FROM checkpoints WHERE run_id=? AND key NOT IN (SELECT key FROM blocks WHERE run_id=?)",
                (run_id, run_id),
            )
            self.db.execute("DELETE FROM logs WHERE run_id=? AND seq >= ?", (run_id, seq))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return int(seq), float(t or 0.0)

    def reopen_run(self, run_id: int, meta: dict[str, Any]) -> None:
        """A killed record continues: running again, in this process, under its lock."""
        self._take(run_id, records=True)
        self.db.execute(
            "UPDATE runs SET status=?, finished=NULL, exit_code=NULL, pid=?, host=?, meta=? WHERE id=?",
            (RunStatus.RUNNING, os.getpid(), socket.gethostname(), json.dumps(meta), run_id),
        )

    def iteration_scalars(self, run_id: int) -> dict[tuple[str, int, int], dict[str, Any] | None]:
        """Per main-loop iteration of a run, the carried scalars recorded at its start (None where
        none were recorded): every iteration the run reached is a key."""
        return {
            (m, i, it): None if sc is None else json.loads(sc)
            for m, i, it, sc in self.db.execute(
                "SELECT main_id, main_inst, iteration, scalars FROM iterations WHERE run_id=?",
                (run_id,),
            )
        }

    @_writer
    def put_jump(self, run_id: int, main_id: str, main_inst: int, first: int, resumed: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO jumps VALUES (?,?,?,?,?)",
            (run_id, main_id, main_inst, first, resumed),
        )

    def jumped(self, run_id: int) -> set[tuple[str, int, int]]:
        """The main-loop iterations a replay skipped over (restoring a later boundary instead)."""
        out: set[tuple[str, int, int]] = set()
        for m, i, first, resumed in self.db.execute(
            "SELECT main_id, main_inst, first, resumed FROM jumps WHERE run_id=?", (run_id,)
        ):
            out.update((m, i, it) for it in range(first, resumed))
        return out

    def iteration_hashes(self, run_id: int) -> dict[tuple[str, int, int], str]:
        return {
            (m, i, it): sha
            for m, i, it, sha in self.db.execute(
                "SELECT main_id, main_inst, iteration, rng_sha FROM iterations WHERE run_id=?",
                (run_id,),
            )
        }

    # -- logs ------------------------------------------------------------------------------------
    @_writer
    def put_logs(self, run_id: int, entries: Iterable[LogEntry]) -> None:
        rows = [
            (
                run_id,
                e.seq,
                e.text,
                e.main_id,
                e.main_inst,
                e.iteration,
                e.region,
                int(e.probe),
                None if e.segments is None else json.dumps(e.segments),
            )
            for e in entries
        ]
        self._transaction([("INSERT OR REPLACE INTO logs VALUES (?,?,?,?,?,?,?,?,?)", rows)])

    def logs(self, run_id: int) -> Iterator[LogEntry]:
        for seq, text, m, mi, it, region, probe, segs in self.db.execute(
            "SELECT seq, text, main_id, main_inst, iteration, region, probe, segments FROM logs"
            " WHERE run_id=? ORDER BY seq",
            (run_id,),
        ):
            pieces = (
                None if segs is None else tuple((t, r, bool(p)) for t, r, p in json.loads(segs))
            )
            yield LogEntry(seq, text, m, mi, it, region, bool(probe), pieces)


def object_path(blobs: Path, sha: str) -> Path:
    """A content-addressed object: ``objects/ab/abcdef...`` (the sha256 of its bytes)."""
    return blobs / object_rel(sha)


def write_durably(
    root: Path, rel: str, key: str, chunks: Iterable[Any], fsync: bool = False
) -> str:
    """Write checkpoint ``key``'s blob ``chunks`` to ``root/rel`` through a temporary file,
    hashing as they go (no copy of the data is made), rename into place; return the digest of
    the key and the bytes (:func:`~flortrain.store.blobs.digest`). On any failure the temporary
    file is removed and nothing is left at ``rel``; a symbolic link below ``root`` is refused
    (``store/confine.py``).

    A blob in the page cache survives the recording process being killed; only a power loss or
    kernel crash can drop it, and SQLite (WAL, ``synchronous=NORMAL``) may then lose its latest
    commits too. So by default there is no fsync: every read verifies the sha256, and a blob a
    power loss truncated is a missing checkpoint (its instance re-executes), never a wrong one.
    ``fsync`` is for callers that need more."""
    h = hasher(key)
    with confine.replacing(root, rel) as fd, os.fdopen(fd, "wb", closefd=False) as f:
        for c in chunks:
            h.update(c)
            f.write(c)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return str(h.hexdigest())


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)


#: the store does not exist (yet): the one failure a read-only command may report as "no runs"
NO_STORE = "FT013"


def open_store(explicit: str | None = None, create: bool = True, trust: bool = False) -> Store:
    """The store; commands that only read it (``runs``, ``diff``) never create one."""
    root = store_path(explicit)
    if not create:
        _require_existing(root)
    return Store(root, trust)


def _require_existing(root: Path) -> None:
    """Absent (no such path, or a directory without a database) is :data:`NO_STORE`; a path that
    exists but cannot be a store (a regular file, a file above it, no permission) is FT010, as
    ``record`` reports it, not an empty store."""
    try:
        if not stat.S_ISDIR(root.stat().st_mode):
            raise FlortrainError("cannot open store: not a directory", Located(str(root)), "FT010")
        (root / "flortrain.db").stat()
    except FileNotFoundError:
        raise FlortrainError(
            "no flortrain store here (record a run first)", Located(str(root)), NO_STORE
        ) from None
    except OSError as e:
        raise FlortrainError(f"cannot open store: {e}", Located(str(root)), "FT010") from None
