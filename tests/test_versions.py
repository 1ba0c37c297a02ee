"""Kernels that write tensors behind their version counters (checkpoint/versions.py): a fused
optimizer's step and batch norm's running statistics. Each shortcut that trusts the counters
must treat what they wrote as changed, and training must not notice anything was done. The
batch-norm script trains its head by hand (the optimizer is not what it is about): torch.optim's
first step imports torch._dynamo, about a CPU-second a process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flortrain.checkpoint import versions
from flortrain.checkpoint.fingerprint import fingerprint, snapshot_equal
from flortrain.checkpoint.staging import ChangeTracker
from flortrain.runtime.registry import Registry
from tests.protocol import replay_matches_plain

#: Two parameters of 128 KB (large enough to be skipped when unchanged), one stepped by a fused
#: Adam, the other by a fused SGD with momentum: each kernel writes its parameter and its state.
FUSED = """\
import torch
torch.manual_seed(0)
a = torch.nn.Parameter(torch.randn(128, 256) * 0.01)
s = torch.nn.Parameter(torch.randn(128, 256) * 0.01)
adam = torch.optim.Adam([a], lr=1e-2, fused=True)
sgd = torch.optim.SGD([s], lr=1e-2, momentum=0.9, fused=True)
x = torch.randn(64, 128)
y = torch.randint(0, 256, (64,))
for epoch in range(6):
    for step in range(5):
        loss_a = torch.nn.functional.cross_entropy(x @ a, y)
        adam.zero_grad()
        loss_a.backward()
        adam.step()
        loss_s = torch.nn.functional.cross_entropy(x @ s, y)
        sgd.zero_grad()
        loss_s.backward()
        sgd.step()
    #PROBE
    print(f"epoch {epoch} loss {loss_a.item():.6f} {loss_s.item():.6f}", flush=True)
"""


def test_fused_optimizers_parameters_are_checkpointed_at_every_epoch(tmp_path: Path) -> None:
    """The fused kernels leave the parameters' versions where they were: trusted, every
    checkpoint named the first epoch's weights, and the replay printed them at every epoch and
    still said it matched the record. Adam and SGD in one run: the probe prints both."""
    env = {"FLORTRAIN_PERIOD": "every"}
    rep = replay_matches_plain(
        tmp_path, FUSED, 'print(f"PROBE {epoch} {a.sum().item():.6f} {s.sum().item():.6f}")', env
    )
    assert "6 block instances skipped, 0 executed" in rep.err, rep.err


BATCHNORM = """\
import torch
torch.manual_seed(0)
bn = torch.nn.BatchNorm1d(16384)          # running statistics of 64 KB each
head = torch.nn.Linear(16384, 4)
y = torch.randint(0, 4, (32,))
for epoch in range(6):
    bn.train(epoch >= 1)                  # a first epoch that leaves the statistics as they were
    for step in range(3):
        x = torch.randn(32, 16384) + epoch
        loss = torch.nn.functional.cross_entropy(head(bn(x)), y)
        head.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in head.parameters():
                p.add_(p.grad, alpha=-0.01)
    #PROBE
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
"""


def test_batch_norms_running_statistics_are_checkpointed_as_they_move(tmp_path: Path) -> None:
    """Unchanged by epoch 0 and at their loop-entry version ever after, the statistics were named
    by the entry's hash in every checkpoint: the replay restored zeros at every epoch."""
    env = {"FLORTRAIN_PERIOD": "every"}
    rep = replay_matches_plain(
        tmp_path, BATCHNORM, 'print(f"PROBE {epoch} {bn.running_mean.sum().item():.4f}")', env
    )
    assert "6 block instances skipped, 0 executed" in rep.err, rep.err


@pytest.fixture(autouse=True)
def _nothing_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no address noted (memory of another test's tensors is reused)."""
    monkeypatch.setattr(versions, "_unversioned", set())


def test_what_those_kernels_write_is_noted_and_every_shortcut_distrusts_it() -> None:
    """The premise (these kernels leave the counter alone) and the remedy, in-process: after a
    registry is installed, a fused step and a training-mode batch norm forward mark what they
    wrote, and the change tracker, the loop-entry names and the alias watch's fingerprints all
    see those tensors as changed. Nothing is bumped: a backward through the batch norm after
    its forward (which saved the statistics at their version) still works."""
    reg = Registry()
    reg.install()
    try:
        w = torch.nn.Parameter(torch.randn(20000))
        opt = torch.optim.Adam([w], lr=0.1, fused=True)
        bn = torch.nn.BatchNorm1d(16384)
        tracker = ChangeTracker(enabled=True)
        tracker.enter([w, bn.running_mean])
        tracker.update([(w, 1), (bn.running_mean, 2)])
        before_w, before_bn = fingerprint(w), fingerprint(bn)
        assert tracker.unchanged(w) == 1 and tracker.since_entry(bn.running_mean) is not None

        w.grad = torch.randn(20000)
        version = w._version
        opt.step()
        assert w._version == version  # the fused kernel wrote w without a bump
        out = bn(torch.randn(8, 16384)).sum()
        out.backward()  # would fail had the statistics been bumped after the forward

        assert versions.untrusted(w) and versions.untrusted(bn.running_mean)
        assert tracker.unchanged(w) is None and tracker.since_entry(w) is None
        assert tracker.since_entry(bn.running_mean) is None
        assert not snapshot_equal(fingerprint(bn), before_bn)
        assert not snapshot_equal(fingerprint(w), before_w)
        assert snapshot_equal(fingerprint(bn), fingerprint(bn))  # compared by bytes from now on
        with torch.no_grad():
            bn.running_var.mul_(1.0)  # same bytes
        assert snapshot_equal(fingerprint(bn), fingerprint(bn))
    finally:
        reg.uninstall()


def test_an_optimizer_without_fused_groups_is_not_noted() -> None:
    reg = Registry()
    reg.install()
    try:
        w = torch.nn.Parameter(torch.randn(1000))
        w.grad = torch.randn(1000)
        torch.optim.Adam([w], lr=0.1).step()
        assert not versions.untrusted(w)
    finally:
        reg.uninstall()
