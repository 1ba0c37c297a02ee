"""A signal whose handler raises, arriving while a hook holds the training thread, reaches the
script as the hook returns (``flortrain/signals.py``): not swallowed by flortrain's
guards, not raised half-way through a checkpoint."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flortrain import signals
from tests.protocol import flortrain, plain


class Stop(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise Stop(signum)


@pytest.fixture
def stop_on_usr1() -> Iterator[None]:
    old = signal.signal(signal.SIGUSR1, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, old)


def _busy() -> int:
    """Bytecodes, function calls and backward jumps: where CPython runs pending handlers."""
    return sum(len(str(i)) for i in range(2000))


def test_a_handler_that_raises_in_a_hook_raises_as_it_returns(stop_on_usr1: None) -> None:
    d = signals.defer(os.getpid())
    assert d is not None
    done = False
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        try:
            _busy()
        except Exception:  # what flortrain's guards do with an exception
            pytest.fail("the handler ran inside the hook")
        done = True
        assert signal.getsignal(signal.SIGUSR1) is not _stop  # set aside meanwhile
    finally:
        with pytest.raises(Stop) as raised:
            signals.resume(d)
    assert done and raised.value.args == (signal.SIGUSR1,)
    assert signal.getsignal(signal.SIGUSR1) is _stop


def test_without_a_signal_the_handlers_are_only_put_back(stop_on_usr1: None) -> None:
    before = {s: signal.getsignal(s) for s in signal.valid_signals()}
    d = signals.defer(os.getpid())
    signals.resume(d)
    assert {s: signal.getsignal(s) for s in signal.valid_signals()} == before
    with pytest.raises(Stop):  # and the script's handler is live again
        os.kill(os.getpid(), signal.SIGUSR1)
        _busy()


def test_outside_the_main_thread_or_the_training_process_nothing_is_deferred(
    stop_on_usr1: None,
) -> None:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(signals.defer(os.getpid())))
    t.start()
    t.join()
    assert got == [None]
    assert signals.defer(os.getpid() + 1) is None  # a forked child (a DataLoader worker)
    assert signal.getsignal(signal.SIGUSR1) is _stop
    signals.resume(None)  # and resuming nothing is a no-op


def test_a_handler_that_runs_inside_defer_raises_from_it_and_leaves_no_note(
    stop_on_usr1: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting a handler runs pending ones first: a signal can reach the script's handler while
    :func:`defer` swaps them. A ``TimeoutError`` (an ``OSError``) from it must propagate, and no
    handler stay swapped; it must not be caught as a failure to swap."""

    def timeout(signum: int, frame: object) -> None:
        raise TimeoutError

    old = signal.signal(signal.SIGUSR2, timeout)
    real, sent = signals._setsignal, []

    def setsignal(s: int, h: object) -> object:
        if not sent:
            sent.append(s)
            os.kill(os.getpid(), signal.SIGUSR2)  # arrives between two swaps
        return real(s, h)

    monkeypatch.setattr(signals, "_setsignal", setsignal)
    try:
        with pytest.raises(TimeoutError):
            signals.defer(os.getpid())
        assert not any(
            isinstance(signal.getsignal(s), signals.Note) for s in signal.valid_signals()
        )
        assert (
            signal.getsignal(signal.SIGUSR1) is _stop
            and signal.getsignal(signal.SIGUSR2) is timeout
        )
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_every_signal_that_arrived_reaches_its_handler_and_the_first_exception_propagates(
    stop_on_usr1: None,
) -> None:
    seen: list[int] = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        d = signals.defer(os.getpid())
        assert d is not None
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
        _busy()
        assert seen == []
        with pytest.raises(Stop):
            signals.resume(d)
        assert seen == [signal.SIGUSR2]  # run although the first handler raised
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_a_note_an_interrupted_put_back_left_hands_the_signal_to_the_script(
    stop_on_usr1: None,
) -> None:
    d = signals.defer(os.getpid())
    assert d is not None
    d.open = False  # the hook is over, but its put-back did not get to SIGUSR1
    assert isinstance(signal.getsignal(signal.SIGUSR1), signals.Note)
    with pytest.raises(Stop):
        os.kill(os.getpid(), signal.SIGUSR1)
        _busy()
    assert signal.getsignal(signal.SIGUSR1) is _stop
    again = signals.defer(os.getpid())  # and a later hook sets the script's handler aside again
    signals.resume(again)
    assert signal.getsignal(signal.SIGUSR1) is _stop


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Python's own SIGINT handling, whatever the test runner gave this process."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_ctrl_c_in_a_hook_raises_as_it_returns(ctrl_c: None) -> None:
    """``KeyboardInterrupt`` passes every guard of flortrain's: raised half-way through a hook
    it left the hook's work half done. It is raised as the hook returns, as any handler's is."""
    d = signals.defer(os.getpid())
    assert d is not None
    done = False
    try:
        os.kill(os.getpid(), signal.SIGINT)
        _busy()
        done = True
    finally:
        with pytest.raises(KeyboardInterrupt):
            signals.resume(d)
    assert done
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_cuts_a_hooks_wait_short(ctrl_c: None) -> None:
    """A hook that waits (for the writer to free the staging buffer) is interrupted from the
    wait: by a Ctrl-C that arrives during it, and by one that arrived earlier in the hook."""
    for earlier in (False, True):
        d = signals.defer(os.getpid())
        assert d is not None
        waited = False
        try:
            if earlier:
                os.kill(os.getpid(), signal.SIGINT)
                _busy()
            with pytest.raises(KeyboardInterrupt), signals.waiting():
                waited = True
                os.kill(os.getpid(), signal.SIGINT)
                _busy()
                pytest.fail("the wait was not cut short")
        finally:
            signals.resume(d)  # the Ctrl-C was raised from the wait: nothing more to raise
        assert waited is not earlier and not signals.waiting_now  # earlier: raised as it began
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_scripts_own_ctrl_c_handler_waits_for_the_hooks_end(stop_on_usr1: None) -> None:
    """A script's own SIGINT handler may raise what flortrain's guards catch: it runs as the
    hook returns, even when the signal arrives during a wait."""
    old = signal.signal(signal.SIGINT, _stop)
    try:
        d = signals.defer(os.getpid())
        assert d is not None
        try:
            with signals.waiting():
                os.kill(os.getpid(), signal.SIGINT)
                _busy()
        finally:
            with pytest.raises(Stop):
                signals.resume(d)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_child_forked_during_a_hook_has_the_scripts_handlers(stop_on_usr1: None) -> None:
    """A writer forked again mid-run (its predecessor died) starts inside a hook."""
    d = signals.defer(os.getpid())
    assert d is not None
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if signal.getsignal(signal.SIGUSR1) is _stop else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    finally:
        signals.resume(d)


SCRIPT = """\
import os, signal, sys, torch

class Stop(Exception):
    pass

def stop(signum, frame):
    raise Stop()

signal.signal(signal.SIGUSR1, stop)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4)
try:
    for epoch in range(4):
        for i in range(8):
            loss = model(x[i * 8:(i + 1) * 8]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if sys.argv[1:] == ["send"] and epoch == 0:
            os.kill(os.getpid(), signal.SIGUSR1)  # the moment flortrain's first checkpoint ends
        print(f"epoch {epoch} {loss.item():.6f}", flush=True)
except Stop:
    print("stopped", flush=True)
"""


def test_a_signal_during_a_checkpoint_stops_the_script_as_under_python(tmp_path: Path) -> None:
    """The time-limit pattern (a handler that raises, caught around training): a signal that
    arrives while the first checkpoint is staged stops the script right after that block, as it
    would have stopped under ``python`` had it arrived as the block ended, and the checkpoint is
    complete. The checkpoint's guard must not take the exception for a failure of the
    checkpoint, warn, and let training run all four epochs."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    truth = plain(script, ["send"])
    assert truth.code == 0 and truth.out == "stopped\n", truth
    env = {
        "FLORTRAIN_INJECT": f"checkpoint-signal={int(signal.SIGUSR1)}",
        "FLORTRAIN_PERIOD": "every",
    }
    rec = flortrain(tmp_path, "record", "train.py", env=env)
    assert rec.code == 0, rec.err
    assert rec.out == truth.out, rec.err
    assert "not checkpointed" not in rec.err, rec.err
    assert "1 of 1 block instances checkpointed" in rec.err, rec.err


def test_once_the_script_is_over_a_ctrl_c_only_cuts_a_wait_short() -> None:
    """While the run is being finished a Ctrl-C must not unwind the finish (the run would be
    left unfinished, incomplete); it cuts a wait for the writer short, and is otherwise noted."""
    interrupt = signals.Interrupt()
    interrupt.over = True
    old = signal.signal(signal.SIGINT, interrupt)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        _busy()
        assert interrupt.noted
        interrupt.last = None  # a Ctrl-C of its own, not the same one forwarded
        with pytest.raises(KeyboardInterrupt), signals.waiting():
            os.kill(os.getpid(), signal.SIGINT)
            _busy()
    finally:
        signal.signal(signal.SIGINT, old)
