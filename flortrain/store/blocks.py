"""The ``blocks`` table: one row per block instance (or main-loop boundary) of a run, with what
became of it and what it cost."""

from __future__ import annotations

import json
from collections.abc import Iterable

from flortrain.store.records import BlockRow, BlockState, Damaged, refuse
from flortrain.store.tables import Tables, guarded_write


class Blocks(Tables):
    @guarded_write
    def put_block(self, run_id: int, row: BlockRow) -> None:
        self.put_blocks(run_id, [row])

    @guarded_write
    def put_blocks(self, run_id: int, rows: Iterable[BlockRow]) -> None:
        """Block rows in one transaction: a session batches the rows of instances without a
        checkpoint (they only describe the run) and writes them with its iterations, not one
        transaction per instance (0.2 ms each on the training thread)."""
        self._claim(
            "INSERT OR REPLACE INTO blocks VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [r.values(run_id) for r in rows],
        )

    @guarded_write
    def mark_checkpointed(self, run_id: int, key: str, digests: dict[str, str]) -> None:
        """A block instance's checkpoint committed (a main-loop boundary stays ``boundary``)."""
        self._claim(
            "UPDATE blocks SET state=CASE WHEN state=? THEN state ELSE ? END,"
            " state_sha=?, note=NULL WHERE run_id=? AND key=?",
            [(BlockState.BOUNDARY, BlockState.CHECKPOINTED, json.dumps(digests), run_id, key)],
        )

    @guarded_write
    def note_block(self, run_id: int, key: str, note: str) -> None:
        self._claim("UPDATE blocks SET note=? WHERE run_id=? AND key=?", [(note, run_id, key)])

    def blocks(self, run_id: int) -> list[BlockRow]:
        """A run's block instances, in the order their rows were written, validated."""
        out = []
        for row in self.db.execute("SELECT * FROM blocks WHERE run_id=? ORDER BY rowid", (run_id,)):
            try:
                out.append(BlockRow.from_row(row[1:]))
            except Damaged as e:
                raise refuse(self._db_path(), f"block {row[1]!r} of run {run_id}", e) from None
        return out

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


__all__ = ["Blocks"]
