"""The ``iterations`` and ``jumps`` tables: per main-loop iteration its RNG digests, carried
scalars, start time and output position; per replay, the iterations it jumped over."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from flortrain.store.records import Damaged, count, refuse
from flortrain.store.tables import Tables, guarded_write

#: the most iterations one jump may skip (a jump's row is expanded to each iteration it skipped)
MAX_JUMP = 1 << 22

#: One main-loop iteration's row: main id, entry, iteration, RNG digests, encoded RNG state (None:
#: no longer written), carried scalars (JSON), start time in seconds since the session began,
#: captured lines before it.
IterationRow = tuple[str, int, int, str, bytes | None, str | None, float | None, int | None]


class Iterations(Tables):
    @guarded_write
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

    def iteration_hashes(self, run_id: int) -> dict[tuple[str, int, int], str]:
        return {
            (m, i, it): sha
            for m, i, it, sha in self.db.execute(
                "SELECT main_id, main_inst, iteration, rng_sha FROM iterations WHERE run_id=?",
                (run_id,),
            )
        }

    @guarded_write
    def put_jump(self, run_id: int, main_id: str, main_inst: int, first: int, resumed: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO jumps VALUES (?,?,?,?,?)",
            (run_id, main_id, main_inst, first, resumed),
        )

    def jumped(self, run_id: int) -> set[tuple[str, int, int]]:
        """The main-loop iterations a replay skipped over (restoring a later boundary instead).
        A row's span sizes the set: one out of range is refused (``FT018``)."""
        out: set[tuple[str, int, int]] = set()
        for m, i, first, resumed in self.db.execute(
            "SELECT main_id, main_inst, first, resumed FROM jumps WHERE run_id=?", (run_id,)
        ):
            try:
                start = count(first, "first")
                end = count(resumed, "resumed", start, start + MAX_JUMP)
            except Damaged as e:
                raise refuse(self._db_path(), f"jump of run {run_id}", e) from None
            out.update((m, i, it) for it in range(start, end))
        return out


__all__ = ["IterationRow", "Iterations"]
