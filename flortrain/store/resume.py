"""Where a killed record can be continued from (``record --resume``), and forgetting what it
recorded past that point: queries across the blocks, checkpoints, iterations and logs tables."""

from __future__ import annotations

from flortrain.store.records import BlockState
from flortrain.store.tables import Tables


class Resumption(Tables):
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
        self, run_id: int, main_id: str, entry: int, iteration: int, keep: str
    ) -> tuple[int, float]:
        """Forget what a killed run recorded from the start of ``iteration`` on (a resumed record
        executes it again), keeping ``keep``, the key of the boundary checkpoint it resumes from
        (at or before ``iteration``), in one transaction. Returns how many captured lines are kept
        and the iteration's start time, where the resumed record's log and clock continue."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rowid, seq, t = self.db.execute(
                "SELECT rowid, seq, t FROM iterations WHERE run_id=? AND main_id=? AND main_inst=? AND iteration=?",
                (run_id, main_id, entry, iteration),
            ).fetchone()
            self.db.execute("DELETE FROM iterations WHERE run_id=? AND rowid >= ?", (run_id, rowid))
            # the block instances of the iterations forgotten (rows are written out of iteration
            # order: a checkpointed instance's row waits for its checkpoint)
            self.db.execute(
                "DELETE FROM blocks WHERE run_id=? AND key != ? AND NOT EXISTS (SELECT 1 FROM"
                " iterations i WHERE i.run_id = blocks.run_id AND i.main_id = blocks.main_id"
                " AND i.main_inst = blocks.main_inst AND i.iteration = blocks.iteration)",
                (run_id, keep),
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


__all__ = ["Resumption"]
