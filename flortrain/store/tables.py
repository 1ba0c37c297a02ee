"""What every table of a store shares: the connection, who may write through it, and how writes
are batched into transactions. Each table's module (runs, blocks, checkpoints, iterations,
resume, logs, scriptfiles) adds its rows' reads and writes to :class:`Tables`;
:class:`~flortrain.store.db.Store` is all of them over one connection."""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from flortrain.store.blobs import BlobReader
from flortrain.store.trust import RunLock

W = TypeVar("W", bound=Callable[..., None])


def guarded_write(method: W) -> W:
    """A write the running script must survive. Only the process that opened the store writes
    (a forked child must not use its parent's connection). Once the store is ``guarded`` (a record
    or replay is executing the user's script), a failing write (disk full, a read-only store, a
    lock held past the timeout, a damaged database) does not raise into the script: the store
    warns once and stops writing, the run stays ``running`` in the database and so reads as
    incomplete once its process is gone, and the command reports it at the end."""

    @functools.wraps(method)
    def wrapper(self: Tables, *args: Any, **kwargs: Any) -> None:
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


class Tables:
    """A store's connection and write discipline; :class:`~flortrain.store.db.Store` opens it."""

    root: Path
    blobs: Path
    db: sqlite3.Connection
    pid: int
    reader: BlobReader
    lock: RunLock | None
    #: writes no longer raise (see :func:`guarded_write`); set while the user's script runs
    guarded: bool
    #: why the store stopped taking writes, once it has
    failed: str | None
    #: block rows and checkpoint claims held for one transaction (:meth:`hold_claims`)
    _held: list[tuple[str, list[tuple[Any, ...]]]] | None

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

    @guarded_write
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
