"""The database's tables and their version: what a store of this flortrain holds, how a new
one is made, and how one of another version is refused (or, for an additive change, migrated)
when it is opened."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from flortrain import knobs
from flortrain.errors import FlortrainError, Located

#: Bumped whenever a table changes, or what its rows name does. ``CREATE TABLE IF NOT EXISTS``
#: never migrates, so a store written by another version must be refused when it is opened, not
#: fail in the middle of a run. 8: tensor objects and the part digests are named by XXH3-128
#: instead of sha256 (``store/content.py``). 9: the ``files`` a record's script read and wrote
#: and their states at each checkpoint. 10: a checkpoint's ``sha256`` covers its key as well
#: as its blob's bytes (``store/blobs.py``: :func:`~flortrain.store.blobs.digest`), so a store of
#: 9 or earlier, whose rows hold the bytes' digest alone, is refused. 11: a blob's skeletons
#: pickle the checkpoint package's classes (``flortrain.checkpoint.skeleton``), which a store of
#: 10 or earlier names by the modules they lived in then; each part also has a digest per tensor.
SCHEMA_VERSION = 11

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
#: None since 10: no older store can be brought to 10 or 11 (its checkpoint digests would have to be
#: trusted to compute the new ones).
MIGRATIONS: dict[int, str] = {}


def _migrates(version: int) -> bool:
    """Whether :data:`MIGRATIONS` bring a store of ``version`` to :data:`SCHEMA_VERSION`."""
    if version not in MIGRATIONS:
        return False
    while version in MIGRATIONS:
        version += 1
    return version == SCHEMA_VERSION


def connect(db_path: Path, root: Path) -> sqlite3.Connection:
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
            if not _check_version(db, root):
                _create(db, root)
            return db
        except sqlite3.OperationalError as e:
            db.close()
            if "locked" not in str(e) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _create(db: sqlite3.Connection, root: Path) -> None:
    """Tables and version in one write transaction: two records creating a store at once must
    not see each other's tables without their version (``executescript`` would commit each)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if not _check_version(db, root):
            _run_statements(db, SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _run_statements(db: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _check_version(db: sqlite3.Connection, root: Path) -> bool:
    """Whether the store has this version's schema (False: an empty database); a store of
    another version is refused."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    (tables,) = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()
    if tables and _migrates(version):
        _migrate(db)
        return True
    if tables and version != SCHEMA_VERSION:
        raise FlortrainError(
            f"store was written by another version of flortrain (schema {version}, this one"
            f" reads {SCHEMA_VERSION}); record into a new store (--store DIR)",
            Located(str(root)),
            "FT014",
        )
    return bool(tables)


def _migrate(db: sqlite3.Connection) -> None:
    """Bring an older store to this schema, in one write transaction (two processes opening
    it at once: the second finds it migrated)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        while version in MIGRATIONS:
            _run_statements(db, MIGRATIONS[version])
            version += 1
        db.execute(f"PRAGMA user_version={version}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION", "connect"]
