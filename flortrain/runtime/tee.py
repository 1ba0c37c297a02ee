"""Captured stdout: every line the script prints, with the loop context it was printed in.

The script's stdout is unchanged (lines are written through at once); a copy of each complete
line goes to the store with its main-loop iteration, the block instance (region) it ran in, and
whether a probe printed it. ``flortrain diff`` compares these entries between record and replay.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any, TextIO

from flortrain import knobs
from flortrain.store.logs import LogEntry

Context = Callable[[], tuple[str | None, int | None, int | None, str | None, bool]]


class Tee(io.TextIOBase):
    def __init__(
        self, stream: TextIO, context: Context, sink: Callable[[list[LogEntry]], None]
    ) -> None:
        self.stream = stream
        self.context = context
        self.sink = sink
        self.pid = os.getpid()
        # the line being written, as pieces each tagged with the context it was written in
        self.partial: list[
            tuple[str, tuple[str | None, int | None, int | None, str | None, bool]]
        ] = []
        self.pending: list[LogEntry] = []
        self.seq = 0
        self.unterminated = False  # the output ended without a newline
        #: neither written through nor captured: a resumed record's re-run of what the killed
        #: run already printed (up to the iteration it resumes at)
        self.muted = False

    # the file protocol scripts and libraries use
    def write(self, s: str) -> int:
        if self.muted:
            return len(s)
        n = self.stream.write(s)
        if os.getpid() != self.pid or not s:
            return n  # a forked child (DataLoader worker) prints through, uncaptured
        ctx = self.context()
        *complete, rest = s.split("\n")
        for piece in complete:
            self.partial.append((piece, ctx))
            self._end_line()
        if rest:
            self.partial.append((rest, ctx))
        if len(self.pending) >= knobs.LOG_BATCH:
            self.flush_entries()
        return n

    def _end_line(self) -> None:
        pieces = [(t, c) for t, c in self.partial if t]
        last = self.partial[-1]
        if not pieces or (not last[0] and pieces[-1][1][3:] != last[1][3:]):
            pieces.append(last)  # the newline's own context: the line ends where it was written
        text = "".join(t for t, _ in pieces)
        m, mi, it, _, _ = pieces[0][1]
        _, _, _, region, probe = pieces[-1][1]
        tags = {(c[3], c[4]) for _, c in pieces}
        segments = None if len(tags) <= 1 else tuple((t, c[3], c[4]) for t, c in pieces)
        self.pending.append(LogEntry(self.seq, text, m, mi, it, region, probe, segments))
        self.seq += 1
        self.partial = []

    def flush(self) -> None:
        self.stream.flush()

    def flush_entries(self) -> None:
        if self.pending and os.getpid() == self.pid:
            self.sink(self.pending)
            self.pending = []

    def close_capture(self) -> None:
        if self.partial:  # a last line without a newline is still a line
            self.unterminated = True
            self._end_line()
        self.flush_entries()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
