"""The session: everything one record or replay process knows at run time.

Instrumented code calls the functions in :mod:`flortrain.runtime`; they act on the one active
session (none when instrumented code runs under plain ``python``: then every hook is a no-op and
every loop runs as written). :class:`Session` holds what both kinds of run share: the main
loop's position, block keys, the open blocks, the registry, the rows, the hooks' timing. What a
record does is :class:`~flortrain.runtime.recording.RecordSession`'s, what a replay does
:class:`~flortrain.runtime.replaying.ReplaySession`'s; the blocks see either through
:class:`~flortrain.runtime.host.BlockHost`.

Above 500 lines: it is the state every hook reads (position, keys, open blocks, rows, timing,
fast-forward), which the three session classes share; split further, they would reach into it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from flortrain import knobs, signals
from flortrain.checkpoint.key import CheckpointKey
from flortrain.checkpoint.period import AdaptivePeriod
from flortrain.runtime import audit, fastforward, rng
from flortrain.runtime.audit import Image
from flortrain.runtime.augmentation import Augmented, augmentation
from flortrain.runtime.boundaries import MainBoundary
from flortrain.runtime.checkpointable import Getters
from flortrain.runtime.files import Watch, put_back
from flortrain.runtime.host import Instance, Outcome, State
from flortrain.runtime.jumps import SpanReplay
from flortrain.runtime.live_tensors import LiveTensors
from flortrain.runtime.registry import Registry
from flortrain.runtime.tee import Tee
from flortrain.store.iterations import IterationRow
from flortrain.store.records import BlockRow, BlockState, Checkpoint
from flortrain.store.rows import RecordSink, RunSink
from flortrain.store.scriptfiles import FileState


@dataclass(frozen=True, slots=True)
class IterationStart:
    """What the main-loop hook hands the record or the replay as iteration ``i`` starts: the
    boundary state's getters (None: the loop has none), its detachable names, the loop's frame."""

    main_id: str
    i: int
    objects: Getters | None
    names: Getters | None
    values: tuple[str, ...]
    frame: FrameType | None


#: What a main-loop iteration's start decided: the boundary the generated code gets, the
#: iteration's recorded scalars, and whether the iteration has a row (a resumed record keeps the
#: killed run's)
Step = tuple[MainBoundary | None, str | None, bool]


@dataclass
class ReplaySource:
    """What a replay reads from the record it replays."""

    run_id: int
    execute: frozenset[str]  # block ids that must run (probed)
    checkpoints: dict[str, Checkpoint]
    spans: SpanReplay | None = None  # jumping over main-loop iterations no probe needs
    #: per checkpoint key, the files the record had written as it found them (``file_states``)
    files: dict[str, list[FileState]] = field(default_factory=dict)


@dataclass
class Session:
    """What a record and a replay process share; never run as it is (``_iteration``)."""

    store: RunSink  # the SQLite store, or a parallel-replay worker's rows (flortrain.store.rows)
    run_id: int
    replay: ReplaySource | None = None
    registry: Registry = field(default_factory=Registry)
    adaptive: AdaptivePeriod = field(default_factory=AdaptivePeriod)
    main: list[Any] | None = None  # [main id, entry, iteration]
    main_entries: dict[str, int] = field(default_factory=dict)
    occurrences: dict[str, int] = field(default_factory=dict)
    frames: list[Instance] = field(default_factory=list)
    probe_depth: int = 0
    learned: dict[str, set[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    tee: Tee | None = None
    _warned: set[str] = field(default_factory=set)
    _iterations: list[IterationRow] = field(default_factory=list)
    _blocks: list[BlockRow] = field(default_factory=list)  # block instances without a checkpoint
    #: a jump the main loop's generator decided (main id, iteration, boundary)
    _jump_pending: tuple[str, int, MainBoundary] | None = None
    _driven: set[str] = field(default_factory=set)  # main loops whose iterator the runtime wraps
    _hold_t0: float | None = None  # when the hook in progress began (:meth:`holding`)
    background: float = 0.0  # the writer's estimated seconds for the latest checkpoint
    #: loop id -> why it is not checkpointed: the side-effect audit saw it change state in place
    #: that its changeset does not name (``audit``)
    unnamed_effects: dict[str, str] = field(default_factory=dict)
    _initial_digests: dict[str, str] = field(default_factory=dict)
    _digest_memo: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # ``rng.digest_map``'s
    _live: LiveTensors = field(default_factory=LiveTensors)  # hashed by :meth:`live_object`
    _last_commit: float = 0.0
    commit_interval: float = field(default_factory=knobs.commit_interval)
    track_versions: bool = True  # False when the script writes tensors through `.data`
    started: float = field(default_factory=time.perf_counter)
    #: ``record --resume``: the (main id, entry, iteration) to continue a killed run at
    resume: tuple[str, int, int] | None = None
    resume_seq: int = 0  # the killed run's captured lines kept: the resumed log continues there
    _pid: int = field(default_factory=os.getpid)  # the training process's (``signals.defer``)
    #: record: the files the script reads and writes (``runtime/files.py``)
    files: Watch | None = None
    #: whether a pseudoresume leaves out what the static pass found nothing later needs
    fast_forward: bool = field(default_factory=lambda: knobs.fast_forward() == "on")
    #: statement line -> how many times a pseudoresume left it out
    forwarded: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replay is not None and self.replay.spans is not None:
            self.replay.spans.warn = lambda msg: self.warn_once(msg, msg)

    # -- main loop ---------------------------------------------------------------------------------

    def main_enter(self, main_id: str) -> None:
        if self.probe_depth:
            return  # a probe that runs the main loop's function is the probe's business
        self.abort_frames()
        entry = self.main_entries.get(main_id, 0)
        self.main_entries[main_id] = entry + 1
        self.main = [main_id, entry, -1]
        self._entered(main_id, entry)

    def main_iteration(
        self,
        main_id: str,
        objects: Getters | None = None,
        names: Getters | None = None,
        values: tuple[str, ...] = (),
        frame: FrameType | None = None,
    ) -> MainBoundary | None:
        """The start of a main-loop iteration. With a boundary state (``objects`` given: the
        static pass found the loop's changeset), a record writes its scalars and maybe checkpoints
        it, a replay jumps over the iterations no probe needs (:mod:`flortrain.runtime.jumps`)."""
        if self.probe_depth:
            return None
        if self.main is None or self.main[0] != main_id:
            self.main_enter(main_id)  # closes any block left open
        else:
            self.abort_frames()
        assert self.main is not None
        i = self.main[2] + 1
        self._before_iteration(main_id, self.main[1], i)
        self.main[2] = i
        self.occurrences.clear()
        at = IterationStart(main_id, i, objects, names, values, frame)
        boundary, scalars, row = self._iteration(at)
        if not row:
            return boundary
        state = rng.capture()
        key = (main_id, self.main[1], self.main[2])
        t = time.perf_counter() - self.started
        seq = self.tee.seq if self.tee is not None else None
        self._iterations.append((*key, self._boundary_digests(state), None, scalars, t, seq))
        # Commit what was printed and the boundary states, at most once per commit interval: a
        # killed run loses at most that much, and a step-based main loop does not pay a
        # transaction per step.
        now = time.monotonic()
        if now - self._last_commit >= self.commit_interval:
            self._last_commit = now
            if self.tee is not None:
                self.tee.flush_entries()
            self._put_rows()
        return boundary

    def main_exit(self, main_id: str) -> None:
        if self.probe_depth:
            return
        self.abort_frames()
        self._exited(main_id)
        self.main = None

    # -- what a record and a replay do differently ------------------------------------------------
    def _entered(self, main_id: str, entry: int) -> None:
        """The main loop was entered (``entry`` times before)."""

    def _before_iteration(self, main_id: str, entry: int, i: int) -> None:
        """Iteration ``i`` of the main loop is about to start."""

    def _iteration(self, at: IterationStart) -> Step:
        """An iteration starts: what the record or the replay does with its boundary."""
        raise NotImplementedError

    def _exited(self, main_id: str) -> None:
        """The main loop was left."""

    def before_segment(self) -> bool:
        """In a parallel-replay worker, whether the current iteration precedes its segment."""
        return False

    def restores_probed_blocks(self) -> bool:
        """In a worker, whether this iteration restores even the blocks probes make execute."""
        return False

    def main_items(self, main_id: str, iterable: Iterable[Any], frame: FrameType) -> Iterable[Any]:
        """A main ``for`` loop's iterable, run in ``frame`` (a replay may skip items)."""
        return iterable

    def fast_forwarding(self, main_id: str) -> bool:
        """Whether the current iteration of main loop ``main_id`` is one a pseudoresume runs only
        to reach a later one (a worker before its segment, a resumed record before the
        iteration it records from), with fast-forward on."""
        return (
            self.fast_forward
            and not self.probe_depth
            and self.main is not None
            and self.main[0] == main_id
            and (self.before_segment() or self.replaying_here())
        )

    def leave_out(
        self, line: int, modules: tuple[str, ...], containers: tuple[str, ...], frame: FrameType
    ) -> bool:
        """Whether the statement at ``line`` is left out: what its static verdict assumed holds
        in ``frame`` (``runtime/fastforward``)."""
        if not fastforward.skippable(frame, modules, containers):
            return False
        self.forwarded[line] = self.forwarded.get(line, 0) + 1
        return True

    def replaying_here(self) -> bool:
        """Whether the current iteration is one a resumed record runs as a replay (its rows kept)."""
        return False

    def iteration_elapsed(self) -> float:
        """Seconds of training since the current main-loop iteration began (a record times them)."""
        return 0.0

    def _persistent_loader(self, block_id: str, registry_id: int, loader: Any) -> None:
        """A block iterated a data loader (a record warns about persistent workers)."""

    def _drain_writer(self) -> None:
        """The script ended: what the record's writer still holds is handed off or waited for."""

    # -- what only a record does; a replay's blocks never record ---------------------------------
    def checkpoint(self, key: str, block_id: str, payload: Callable[[], dict[str, Any]]) -> Outcome:
        raise NotImplementedError("only a record checkpoints")

    def put_checkpointed(
        self, key: str, block_id: str, state: BlockState, outcome: Outcome, **costs: Any
    ) -> None:
        raise NotImplementedError("only a record checkpoints")

    def audit_image(self, loop_id: str, frame: FrameType) -> audit.Image | None:
        raise NotImplementedError("only a record audits")

    def audit_loop(
        self, loop_id: str, before: Image, frame: FrameType | None, objects: Getters, names: Getters
    ) -> None:
        raise NotImplementedError("only a record audits")

    def unnamed_effect(self, loop_id: str, why: str) -> None:
        raise NotImplementedError("only a record audits")

    def _put_rows(self) -> None:
        """Write the iteration and block rows held since the last commit."""
        self.store.put_blocks(self.run_id, self._blocks)
        self.store.put_iterations(self.run_id, self._iterations)
        self._blocks, self._iterations = [], []
        if isinstance(self.store, RecordSink):
            if self.files is not None and self.files.dirty:
                self.store.put_files(self.run_id, self.files.rows())
            if self.files is not None and self.files.pending:
                self.store.put_file_states(self.run_id, self.files.take_states())
            self.store.write_held()  # the checkpoints' rows and claims (`Store.hold_claims`)

    def restore_files(self, key: str) -> None:
        """A replay restored checkpoint ``key``: the files the record had written are put back as
        that checkpoint found them (``runtime/files.py``)."""
        if self.replay is not None and self.replay.files:
            try:
                put_back(self.replay.files.get(key, ()), self.store.read_object)
            except OSError as e:
                self.warn_once(
                    f"files:{key}", f"files not put back as checkpoint {key} found them: {e}"
                )

    def _load_boundary(self, main_id: str, entry: int, j: int, i: int) -> MainBoundary | None:
        """Boundary ``j`` of the main loop, loaded for a jump from iteration ``i``."""
        assert self.replay is not None
        key = str(CheckpointKey.boundary(main_id, entry, j))
        ck = self.replay.checkpoints.get(key)
        data = self.store.read_blob(ck) if ck is not None else None
        if data is None:
            self.warn_once(
                f"corrupt:{key}", f"boundary checkpoint {key} is missing or corrupt; running on"
            )
            return None
        b = MainBoundary(self, main_id, ())
        b.at = i
        problem = b.load(self, data)
        if problem is not None:
            self.warn_once(
                f"unusable:{main_id}", f"boundary checkpoint {key} {problem}; running on"
            )
            return None
        return b

    def note_initial_streams(self) -> None:
        """Remember each global stream's state before the script runs: it comes from OS entropy
        (torch's, numpy's and ``random``'s unseeded state differ in every process)."""
        self._initial_digests = rng.digest_map(rng.capture())

    def note_streams_before_restore(self) -> None:
        """A jump restores the record's streams. A stream this process has not captured yet (a
        worker's numpy, imported since its session began) takes its own state as its initial one
        first: the record's would otherwise count as this process's start (``untouched``), and
        the boundary jumped to would differ from the record's in ``diff``."""
        for stream, digest in rng.digest_map(rng.capture()).items():
            self._initial_digests.setdefault(stream, digest)

    def _boundary_digests(self, state: dict[str, Any]) -> str:
        """Per-stream digests at a main-loop boundary, with a stream the script has not touched
        since the process started marked ``untouched``: its entropy-derived state differs between
        any two processes, so it is not evidence of anything (``diff`` does not compare it). A
        stream first seen here (imported during the run) counts its first state as initial."""
        out = {}
        for stream, digest in rng.digest_map(state, self._digest_memo).items():
            initial = self._initial_digests.setdefault(stream, digest)
            out[stream] = rng.UNTOUCHED if digest == initial else digest
        return rng.dumps_digests(out)

    # -- blocks an exception left ----------------------------------------------------------------

    def close_left_frames(self) -> None:
        """Close the open blocks whose loop control has left without ``end()`` (an exception
        caught outside the loop), so what is printed next is not charged to them. Checked when a
        block opens and at every write; only the thread running the loops can tell."""
        if not self.frames or self.frames[0].thread != threading.get_ident():
            return
        on_stack: set[int] = set()
        f: FrameType | None = sys._getframe()
        while f is not None:
            on_stack.add(id(f))
            f = f.f_back
        for i, frame in enumerate(self.frames):
            if frame.left(on_stack):
                for gone in reversed(self.frames[i:]):
                    gone.abort(self)
                del self.frames[i:]
                return

    def abort_frames(self) -> None:
        """A main-loop boundary: any block still open was left by an exception."""
        for gone in reversed(self.frames):
            gone.abort(self)
        self.frames.clear()

    def next_key(self, block_id: str) -> str:
        assert self.main is not None
        occ = self.occurrences.get(block_id, 0)
        self.occurrences[block_id] = occ + 1
        m, entry, it = self.main
        return str(CheckpointKey(block_id, m, entry, it, occ))

    # -- blocks ------------------------------------------------------------------------------------

    def open_block(self, block: Instance) -> State:
        """A loop instance opens: nested in another, outside the main loop or run by a probe it
        is plain code; otherwise it takes the next key of its block in this iteration, and its
        state (``initial_state``)."""
        self.close_left_frames()
        passthrough = self.main is None or self.frames or self.probe_depth
        if not passthrough:
            block.key = self.next_key(block.id)
            block.state = self.initial_state(block)
        self.frames.append(block)
        return State.PASSTHROUGH if passthrough else block.state

    def close_block(self, block: Instance) -> None:
        if self.frames and self.frames[-1] is block:
            self.frames.pop()

    def recorded(self, key: str) -> bool:
        return self.replay is not None and key in self.replay.checkpoints

    def read_object(self, sha: str) -> bytes | None:
        return self.store.read_object(sha)

    def initial_state(self, block: Instance) -> State:
        """A replayed instance's state: restored from its checkpoint (SKIP) unless it is probed
        or its checkpoint cannot be used (EXECUTE)."""
        assert self.replay is not None
        if block.id in self.replay.execute and not self.restores_probed_blocks():
            return State.EXECUTE
        ck = self.replay.checkpoints.get(block.key)
        if ck is None:
            return State.EXECUTE
        data = self.store.read_blob(ck)
        if data is None:
            self.warn_once(
                f"corrupt:{block.key}",
                f"checkpoint {block.key} is missing or corrupt; re-executing it",
            )
            return State.EXECUTE
        problem = block.load(self, data)
        if problem is not None:
            self.warn_once(
                f"unusable:{block.id}", f"checkpoint {block.key} {problem}; re-executing it"
            )
            return State.EXECUTE
        return State.SKIP

    def block_done(
        self,
        block: Instance,
        state: BlockState,
        digests: dict[str, str] | None = None,
        **costs: Any,
    ) -> None:
        self.counts[state] = self.counts.get(state, 0) + 1
        if self.replaying_here():
            return  # the killed run's row of the instance is kept
        assert self.main is not None
        m, entry, it = self.main
        occ = CheckpointKey.parse(block.key).occurrence
        # written with the iterations, once per commit interval: the row describes the run, and
        # no checkpoint hangs on it
        self._blocks.append(
            BlockRow(
                block.key,
                block.id,
                m,
                entry,
                it,
                occ,
                state,
                state_sha=digests,
                **costs,
            )
        )

    def region(self) -> str | None:
        for f in self.frames:
            if f.state is not State.PASSTHROUGH:
                return f.key
        return None

    def context(self) -> tuple[str | None, int | None, int | None, str | None, bool]:
        self.close_left_frames()
        if self.main is None:
            return None, None, None, None, self.probe_depth > 0
        return self.main[0], self.main[1], self.main[2], self.region(), self.probe_depth > 0

    # -- library augmentation and the registry -----------------------------------------------------

    def module_tensors(self) -> list[Any]:
        """The parameters and buffers of every live module."""
        return [t for _, m in self.registry.root_modules() for t in (*m.parameters(), *m.buffers())]

    def live_object(self, sha: str, nbytes: int) -> memoryview | None:
        """A checkpoint's tensor the store names only by its hash: a live module's (``live_tensors``)."""
        return self._live.find(self.module_tensors(), sha, nbytes)

    def watchable(self) -> Iterator[tuple[int, Any]]:
        yield from self.registry.root_modules()
        yield from self.registry.optimizers()

    def augmentation(self, block_id: str, objs: list[Any]) -> Augmented:
        """Objects a block changes beyond its named changeset (``augmentation``)."""
        return augmentation(
            self.registry,
            objs,
            self.learned.get(block_id, ()),
            lambda i, loader: self._persistent_loader(block_id, i, loader),
        )

    def learn(self, block_id: str, registry_id: int, type_name: str) -> None:
        if registry_id not in self.learned.setdefault(block_id, set()):
            self.learned[block_id].add(registry_id)
            self.warn(
                f"block {block_id} changed a {type_name} (registry #{registry_id}) that its changeset"
                " does not name; it is checkpointed with the block from now on"
            )

    # -- messages and shutdown ---------------------------------------------------------------------

    def warn(self, msg: str) -> None:
        print(f"flortrain: {msg}", file=sys.__stderr__, flush=True)

    def warn_once(self, tag: str, msg: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            self.warn(msg)

    @property
    def held(self) -> float:
        """Seconds flortrain's own code held the training thread: block entries and exits (staging
        checkpoints included), iteration boundaries, the wait for the writer at the end."""
        return self.adaptive.held

    def _held_at(self, now: float) -> float:
        """:attr:`held` at ``now``, the hook in progress included."""
        return self.adaptive.held + (now - self._hold_t0 if self._hold_t0 is not None else 0.0)

    @contextlib.contextmanager
    def holding(self, defer_signals: bool = True) -> Iterator[None]:
        """Time flortrain's own code on the training thread (:attr:`held`), with garbage
        collection deferred until it returns. A full collection is the cost of the script's heap,
        plain or recorded (0.2 s each in a nanoGPT-shaped script); one that fell into a
        checkpoint would be charged to it as M, and Eq. 4 and the run's budget would then refuse
        checkpoints for the rest of the run. It runs at the script's next allocation instead.
        The script's signal handlers are deferred too (:mod:`~flortrain.signals`): what
        one raises reaches the script as the hook returns, not flortrain's code half-way."""
        if self._hold_t0 is not None:  # within a hook already: its time is counted there
            yield
            return
        collecting = gc.isenabled()
        gc.disable()
        self._hold_t0 = time.perf_counter()
        deferred = None
        try:
            deferred = signals.defer(self._pid) if defer_signals else None
            yield
        finally:
            self.adaptive.hold(time.perf_counter() - self._hold_t0)
            self._hold_t0 = None
            if collecting:
                gc.enable()
            signals.resume(deferred)  # last: a handler that raises leaves nothing undone here

    def flush(self) -> None:
        """The script ended: hand the writer's backlog to the launcher where there is one (the
        wait then overlaps this process's exit, ``flortrain/process/launcher.py``), else wait for it.
        Signals are not deferred here: a Ctrl-C during a long wait for the writer stops it."""
        with self.holding(defer_signals=False):
            self._drain_writer()
        if self.tee is not None:
            self.tee.close_capture()
        self._put_rows()


#: The active session of this process, set by the runner.

current: Session | None = None
