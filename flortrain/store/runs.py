"""The ``runs`` and ``sources`` tables: a record or replay, from its start to how it ended, and
the source text it ran."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from typing import Any

from flortrain.errors import FlortrainError, Located
from flortrain.store import confine
from flortrain.store.records import Damaged, Run, RunStatus, refuse
from flortrain.store.tables import Tables, guarded_write
from flortrain.store.trust import RunLock, held


class Runs(Tables):
    def put_source(self, text: str) -> str:
        sha = hashlib.sha256(text.encode()).hexdigest()
        self._put_source(sha, text)
        return sha

    @guarded_write
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

    @guarded_write
    def set_meta(self, run_id: int, meta: dict[str, Any]) -> None:
        """Replace a run's meta: what a run learns while it runs (the project modules a record
        instrumented, as they are imported)."""
        self.db.execute("UPDATE runs SET meta=? WHERE id=?", (json.dumps(meta), run_id))

    @guarded_write
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

    def reopen_run(self, run_id: int, meta: dict[str, Any]) -> None:
        """A killed record continues: running again, in this process, under its lock."""
        self._take(run_id, records=True)
        self.db.execute(
            "UPDATE runs SET status=?, finished=NULL, exit_code=NULL, pid=?, host=?, meta=? WHERE id=?",
            (RunStatus.RUNNING, os.getpid(), socket.gethostname(), json.dumps(meta), run_id),
        )


__all__ = ["Runs"]
