"""A signal whose handler raises, arriving while a hook holds the training thread, reaches the
script as the hook returns (``flortrain/runtime/signals.py``): not swallowed by flortrain's
guards, not raised half-way through a checkpoint."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flortrain.runtime import signals
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
    d = signals.defer()
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
    d = signals.defer()
    signals.resume(d)
    assert {s: signal.getsignal(s) for s in signal.valid_signals()} == before
    with pytest.raises(Stop):  # and the script's handler is live again
        os.kill(os.getpid(), signal.SIGUSR1)
        _busy()


def test_outside_the_main_thread_nothing_is_deferred() -> None:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(signals.defer()))
    t.start()
    t.join()
    assert got == [None]
    signals.resume(None)  # and resuming nothing is a no-op


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
    complete. Before stop 41 the checkpoint's guard took the exception for a failure of the
    checkpoint, warned, and training ran all four epochs."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    truth = plain(script, ["send"])
    assert truth.code == 0 and truth.out == "stopped\n", truth
    env = {"FLORTRAIN_INJECT": f"checkpoint-signal={int(signal.SIGUSR1)}", "FLORTRAIN_PERIOD": "every"}
    rec = flortrain(tmp_path, "record", "train.py", env=env)
    assert rec.code == 0, rec.err
    assert rec.out == truth.out, rec.err
    assert "not checkpointed" not in rec.err, rec.err
    assert "1 of 1 block instances checkpointed" in rec.err, rec.err
