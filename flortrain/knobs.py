"""Every tunable in one place (torchsnapshot's lesson): defaults, and the environment variables
that override them.

A knob read from the environment is a :class:`Choice` (one of a few words, the first the
default) or a :class:`Number` (validated by a predicate that its error line puts in words). Each
is called to read it, so a value set after import (a test's ``monkeypatch.setenv``) counts, and
:func:`validate` reads them all before a run starts."""

from __future__ import annotations

import os
from collections.abc import Callable

from flortrain.errors import FlortrainError


class Choice:
    """A knob that is one of ``values``; unset, the first."""

    def __init__(self, env: str, *values: str) -> None:
        self.env, self.values = env, values

    def __call__(self) -> str:
        raw = os.environ.get(self.env, self.values[0])
        if raw not in self.values:
            raise FlortrainError(
                f"{self.env}={raw!r} must be one of {', '.join(self.values)}", code="FT050"
            )
        return raw


class Number:
    """A numeric knob: ``default`` when unset; a value ``ok`` refuses fails in one line that
    says it must be ``what``."""

    def __init__(self, env: str, default: float, ok: Callable[[float], bool], what: str) -> None:
        self.env, self.default, self.ok, self.what = env, default, ok, what

    def __call__(self) -> float:
        return _number(self.env, self.default, self.ok, self.what)


def _number(env: str, default: float, ok: Callable[[float], bool], what: str) -> float:
    raw = os.environ.get(env)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")  # fails every check below
    if not ok(value):
        raise FlortrainError(f"{env}={raw!r} must be {what}", code="FT050")
    return value


def _at_least_0(v: float) -> bool:
    return v >= 0


def _above_0(v: float) -> bool:
    return v > 0


#: Default store directory, relative to the working directory.
STORE_DIRNAME = ".flortrain"
STORE_ENV = "FLORTRAIN_STORE"

#: Overhead tolerance ε of the Joint Invariant (Flor Eq. 4). 1/15 as in the paper.
epsilon = Number("FLORTRAIN_EPSILON", 1.0 / 15.0, _above_0, "a positive number (default 1/15)")

#: Restore/materialize cost ratio c (Flor Eq. 3); 1.38 is the paper's measured average, refined
#: from observed restore times once a replay has run.
DEFAULT_RESTORE_RATIO = 1.38

#: How many first instances of each block are watched for state mutated through aliases the
#: changeset rules cannot see (live modules and optimizers outside the changeset).
ALIAS_WATCH_INSTANCES = 2

#: Captured stdout lines are committed to SQLite in batches of this many (and at exit).
LOG_BATCH = 256

#: Seconds between commits of main-loop boundaries (RNG digests, the lines printed since), 0:
#: every one. A step-based script (nanoGPT's ``while True``, thousands of millisecond
#: iterations) would otherwise pay a SQLite transaction per step. A killed run loses at most
#: this much.
commit_interval = Number(
    "FLORTRAIN_COMMIT_INTERVAL", 1.0, _at_least_0, "a number of seconds >= 0 (default 1)"
)

#: "adaptive" (Flor's Eq. 4, the default) or "every" (checkpoint every block instance).
period = Choice("FLORTRAIN_PERIOD", "adaptive", "every")

#: Seconds of training after which a main loop takes a boundary checkpoint even where Eq. 4
#: would not (its blocks' checkpoints cover the iterations), so ``record --resume`` has one.
boundary_interval = Number(
    "FLORTRAIN_BOUNDARY_INTERVAL", 60.0, _above_0, "a number of seconds > 0 (default 60)"
)

#: N > 0: a main loop takes boundary checkpoints only at iterations that are multiples of N (with
#: ``FLORTRAIN_PERIOD=every``: exactly those), so tests can space boundaries out without timing;
#: 0 (the default): the period decides.
_boundary_every = Number(
    "FLORTRAIN_BOUNDARY_EVERY",
    0,
    lambda v: v >= 0 and v == int(v),
    "a whole number of iterations >= 0 (default 0: the period decides)",
)

#: "background" (the forked writer, the default) or "sync" (write on the training thread).
materializer = Choice("FLORTRAIN_MATERIALIZER", "background", "sync")

#: The staging buffer the training thread copies checkpoints into for the writer, in MB. A
#: checkpoint larger than it is written on the training thread.
BUFFER_ENV = "FLORTRAIN_BUFFER_MB"
_buffer_mb = Number(BUFFER_ENV, 2048, _at_least_0, "a number of MB >= 0 (default 2048)")

#: The backlog, in MB staged and not yet written, at which the writer stops waiting for idle CPU
#: and competes with training (at a low priority) until it has written all it holds
#: (``pace.Pace``). At most half the staging buffer.
_writer_backlog_mb = Number(
    "FLORTRAIN_WRITER_BACKLOG_MB", 256, _at_least_0, "a number of MB >= 0 (default 256)"
)

#: How much of the staging buffer, in MB, is mapped before the script runs, so that staging a
#: checkpoint does not pay a page fault per 4 KB (``checkpoint/arena.py``). By default as much as
#: the writer's backlog: the buffer's ring seldom goes further. At most the buffer, and at most an
#: eighth of the memory available; 0 turns it off.
ARENA_WARM_ENV = "FLORTRAIN_ARENA_WARM_MB"

#: Whether ``flortrain record`` forks the training process from a launcher that waits for it
#: ("on", the default: the writer's last work then overlaps the training process's exit,
#: ``flortrain/process/launcher.py``) or runs the script in its own process ("off").
launcher = Choice("FLORTRAIN_LAUNCHER", "on", "off")

#: How long a finished run waits for the writer to write what it holds, in seconds.
FLUSH_TIMEOUT_ENV = "FLORTRAIN_FLUSH_TIMEOUT"
flush_timeout = Number(
    FLUSH_TIMEOUT_ENV, 600.0, _at_least_0, "a number of seconds >= 0 (default 600)"
)

#: How ``replay --jobs N`` divides the main loop: "estimated" (the default: by the record's
#: measured costs, and only when that beats a serial replay) or "even" (N segments of about
#: equal iteration counts, whatever the estimate says: for tests and benchmarks).
segments = Choice("FLORTRAIN_SEGMENTS", "estimated", "even")

#: How parallel-replay workers reach their segments: "direct" (the default: restore the
#: boundary checkpoint at the segment's start where there is one) or "pseudo" (Flor's
#: pseudoresume from the loop's start, blocks restored: the baseline benchmarks compare against).
resume = Choice("FLORTRAIN_RESUME", "direct", "pseudo")

#: Whether a pseudoresume (a parallel-replay worker before its segment, ``record --resume``
#: before the iteration it records from) leaves out the main loop's statements that nothing
#: later needs ("on", the default: :mod:`flortrain.static.fastforward`) or runs them all ("off":
#: the baseline the fast-forward benchmark compares against).
fast_forward = Choice("FLORTRAIN_FAST_FORWARD", "on", "off")

#: Whether ``replay --jobs N`` on local workers starts them before it plans ("on", the
#: default: their start-up overlaps planning) or once the plan is made ("off": for measuring
#: what prestarting saves).
prestart = Choice("FLORTRAIN_PRESTART", "on", "off")

#: Whether ``flortrain record`` and a serial ``replay`` run their static pass in a forked child
#: while they import torch ("on", the default, where that can save time:
#: :mod:`flortrain.process.static_child`) or in its own process first ("off": for measuring
#: what the overlap saves).
static_overlap = Choice("FLORTRAIN_STATIC_OVERLAP", "on", "off")

#: Whether ``flortrain record`` runs ``flortrain check`` on the script and warns of its findings
#: before training ("on", the default) or not ("off", as ``record --no-check``).
_check = Choice("FLORTRAIN_CHECK", "on", "off")

#: How long a store operation waits for another process's SQLite lock, in seconds, before it
#: gives up: a command then fails with a one-line error, a recording process stops recording.
db_timeout = Number(
    "FLORTRAIN_DB_TIMEOUT", 30.0, _at_least_0, "a number of seconds >= 0 (default 30)"
)

#: "steady" (the default: glibc malloc keeps large blocks and freed memory on its heap while a
#: replay re-executes training, ``runtime/allocator.py``) or "default" (leave malloc as it is).
replay_allocator = Choice("FLORTRAIN_REPLAY_ALLOCATOR", "steady", "default")


#: Fault injection for tests: ``name=value`` pairs, comma separated (``writer-delay=2``: the
#: writer sleeps that long before each checkpoint, a slow disk; ``writer-fail=1``: it fails
#: every checkpoint as on a full disk and writes nothing; ``launcher-fail=1``: the
#: launcher raises before it waits, a bug in it; ``checkpoint-signal=N``: the training process
#: sends itself signal N as it stages its first checkpoint, a signal arriving mid-hook).
INJECT_ENV = "FLORTRAIN_INJECT"


def buffer_bytes() -> int:
    return int(_buffer_mb() * 2**20)


def writer_backlog() -> int:
    return int(min(_writer_backlog_mb() * 2**20, buffer_bytes() / 2))


def arena_warm() -> int:
    """Bytes of the staging buffer to warm: by default as many as the writer's backlog threshold
    (:func:`writer_backlog`), at most the buffer."""
    default = writer_backlog() / 2**20
    mb = _number(
        ARENA_WARM_ENV,
        default,
        _at_least_0,
        f"a number of MB >= 0 (default {default:g}, the writer's backlog)",
    )
    return int(min(mb * 2**20, buffer_bytes()))


def boundary_every() -> int:
    """The stride of main-loop boundaries (0: the period decides)."""
    return int(_boundary_every())


def check() -> bool:
    """Whether record warns of ``flortrain check``'s findings (``FLORTRAIN_CHECK``)."""
    return _check() == "on"


def injected(name: str) -> float:
    """The value of an injected fault, 0 when it is not injected."""
    return _injections().get(name, 0.0)


def _injections() -> dict[str, float]:
    """Every injected fault by name; a value that is not a number fails in one line (checked up
    front by :func:`validate`, so a forked writer never meets it first)."""
    out: dict[str, float] = {}
    for pair in os.environ.get(INJECT_ENV, "").split(","):
        k, _, v = pair.partition("=")
        if not k.strip():
            continue
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise FlortrainError(f"{INJECT_ENV}: {pair!r} needs a number", code="FT050") from None
    return out


def validate() -> None:
    """Check every environment knob before a run starts, so a typo fails in one line up front."""
    for knob in (
        epsilon,
        period,
        commit_interval,
        boundary_interval,
        boundary_every,
        materializer,
        launcher,
        buffer_bytes,
        writer_backlog,
        arena_warm,
        flush_timeout,
        segments,
        resume,
        fast_forward,
        prestart,
        static_overlap,
        check,
        db_timeout,
        _injections,
    ):
        knob()
