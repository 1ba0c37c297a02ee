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
from flortrain.store.db import LogEntry

Context = Callable[[], tuple[str | None, int | None, int | None, str | None, bool]]


class Tee(io.TextIOBase):
    def __init__(self, stream: TextIO, context: Context, sink: Callable[[list[LogEntry]], None]) -> None:
        self.stream = stream
        self.context = context
        self.sink = sink
        self.pid = os.getpid()
        self.partial = ""
        self.pending: list[LogEntry] = []
        self.seq = 0

    # the file protocol scripts and libraries use
    def write(self, s: str) -> int:
        n = self.stream.write(s)
        if os.getpid() != self.pid:
            return n  # a forked child (DataLoader worker) prints through, uncaptured
        text = self.partial + s
        *lines, self.partial = text.split("\n")
        if lines:
            m, mi, it, region, probe = self.context()
            for line in lines:
                self.pending.append(LogEntry(self.seq, line, m, mi, it, region, probe))
                self.seq += 1
            if len(self.pending) >= knobs.LOG_BATCH:
                self.flush_entries()
        return n

    def flush(self) -> None:
        self.stream.flush()

    def flush_entries(self) -> None:
        if self.pending and os.getpid() == self.pid:
            self.sink(self.pending)
            self.pending = []

    def close_capture(self) -> None:
        if self.partial:
            # a last line without a newline is still a line
            m, mi, it, region, probe = self.context()
            self.pending.append(LogEntry(self.seq, self.partial, m, mi, it, region, probe))
            self.seq += 1
            self.partial = ""
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
