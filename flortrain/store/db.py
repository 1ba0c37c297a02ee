"""A store: SQLite metadata and the blob directory beside it, one :class:`Store` per process
(forked children, DataLoader workers and the checkpoint writer, never touch the parent's
connection). The tables are in their own modules; :class:`Store` is all of them over one
connection, opened and verified here."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
from pathlib import Path

from flortrain import knobs
from flortrain.errors import FlortrainError, Located
from flortrain.store import confine, schema
from flortrain.store.blobs import BlobReader
from flortrain.store.blocks import Blocks
from flortrain.store.checkpoints import Checkpoints
from flortrain.store.confine import DIR_MODE, private_dir
from flortrain.store.iterations import Iterations
from flortrain.store.logs import Logs
from flortrain.store.resume import Resumption
from flortrain.store.runs import Runs
from flortrain.store.scriptfiles import ScriptFiles
from flortrain.store.trust import MANIFEST, verify, write_manifest


def store_path(explicit: str | None = None) -> Path:
    raw = explicit or os.environ.get(knobs.STORE_ENV) or knobs.STORE_DIRNAME
    return Path(raw).resolve()


class Store(Runs, Blocks, Checkpoints, Iterations, Resumption, Logs, ScriptFiles):
    """One store. Opening an existing store verifies it is the user's own
    (:func:`~flortrain.store.trust.verify`) unless ``trust``; a new one is created private and
    signed."""

    def __init__(self, root: Path, trust: bool = False) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.pid = os.getpid()
        self.reader = BlobReader(self.blobs)
        self.lock = None
        #: writes no longer raise (see :func:`~flortrain.store.tables.guarded_write`); set while the user's script runs
        self.guarded = False
        #: why the store stopped taking writes, once it has
        self.failed = None
        #: block rows and checkpoint claims held for one transaction (:meth:`hold_claims`)
        self._held = None
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
            self.db = schema.connect(db_path, root)
        except (OSError, sqlite3.Error) as e:
            raise FlortrainError(f"cannot open store: {e}", Located(str(root)), "FT010") from None

    def close(self) -> None:
        if self.owned():
            self.write_held()
            self.db.close()
            if self.lock is not None:
                self.lock.release()
                self.lock = None


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


__all__ = ["NO_STORE", "Store", "open_store", "store_path"]
