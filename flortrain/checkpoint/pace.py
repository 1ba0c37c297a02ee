"""When the writer works: at its own pace behind training, and at full speed on cores training
leaves idle."""

from __future__ import annotations

import os
import time

#: The writer's priority when it competes for the CPU (its busy thread and busy lane).
NICE = 10


class Pace:
    """When the writer may take CPU from training.

    A parallel torch op waits for its slowest thread, so a writer that preempts one of them
    stalls the whole op: with a small backlog it writes only on idle CPU (SCHED_IDLE). But where
    training saturates the cores, such a writer is starved: each checkpoint is then staged on
    fresh pages of the buffer (page faults cost more than the copy), everything is written after
    training ends while the run waits, and in a run long enough to fill the buffer the training
    thread ends up waiting for the writer at every checkpoint. So once the backlog (bytes
    staged, not yet written) reaches ``threshold``, the writer competes at nice :data:`NICE`
    until it has written everything it holds; the next checkpoint is then staged at the
    buffer's start, on pages already faulted in. Neither always idle nor always niced wins on
    every shape (docs/materializer.md)."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.busy = False

    def update(self, holding: int, stopping: bool) -> bool:
        """Whether the writer should be busy now, holding ``holding`` staged bytes (the item
        in hand and those queued); ``stopping``: training is over, nothing is left to spare."""
        if stopping or holding >= self.threshold:
            self.busy = True
        elif self.busy and holding == 0:
            self.busy = False
        return self.busy


class IdleCores:
    """How many cores sat idle lately, from ``/proc/stat`` (idle and iowait time), counting the
    writer's own CPU time as idle: it is what the writer would take. Before the writer starts
    an item on idle CPU it looks: an item started while training keeps every core busy gets
    none (``SCHED_IDLE``) and would hold the head of the buffer while the backlog grew past the
    threshold that should make the writer compete (the pace is decided when an item is taken).
    Left queued, the item waits for the threshold, or for a core to come free. Where
    ``/proc/stat`` cannot be read, every look says idle."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self.cores = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK")
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float, float] | None:
        """(when, idle seconds of all cores, all seconds of all cores, this process's CPU)."""
        try:
            with open(self.path) as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        own = os.times()
        return (
            time.monotonic(),
            sum(fields[3:5]) / self.tick,
            sum(fields[:8]) / self.tick,
            own.user + own.system,
        )

    def idle(self, window: float) -> float:
        """Cores idle on average since the previous look; 0 (look again) if that was more than
        ``window`` seconds ago, as the average would reach back past what matters now."""
        now, last = self._sample(), self._last
        self._last = now
        if now is None:
            return float(self.cores)
        if last is None or now[0] - last[0] > window or now[2] <= last[2]:
            return 0.0
        idle = now[1] - last[1] + now[3] - last[3]
        return min(float(self.cores), self.cores * idle / (now[2] - last[2]))


#: Idle cores that let the writer start an item on idle CPU (:class:`IdleCores`).
IDLE_ENOUGH = 0.5


#: Staged bytes of an item the writer starts on idle CPU however busy the cores are: what a
#: ``SCHED_IDLE`` thread still gets on saturated cores (a few per mille) finishes it in a second
#: or two. Small checkpoints (a fine-tuned head) are such items; held back, they would cost the
#: run more than they take from training.
SMALL_ITEM = 4 << 20


#: How often a writer holding items it has not started looks at the CPU again, in seconds.
IDLE_LOOK = 0.2


def may_start_idle(staged: int, cpu: IdleCores) -> bool:
    """Whether an item of ``staged`` bytes may start on idle CPU now (:class:`IdleCores`)."""
    return staged <= SMALL_ITEM or cpu.idle(2 * IDLE_LOOK) >= IDLE_ENOUGH
