"""The ``logs`` table: every stdout line a run printed, where it was printed, and whether a probe
printed it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from flortrain.store.tables import Tables, guarded_write


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


class Logs(Tables):
    @guarded_write
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


__all__ = ["LogEntry", "Logs"]
