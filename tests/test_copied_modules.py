"""Modules and optimizers made without ``__init__``: ``copy.deepcopy``, ``copy.copy``, unpickling.

The registry learns a module when it is constructed; deepcopy and pickle build the copy with
``__new__`` and ``__setstate__``. A copy the registry does not know is invisible to the watches
(an EMA updated in place by a helper in another file) and to batch norm's running-statistics
note (a fold's ``copy.deepcopy(template)``): its skipped instances restored nothing, and the
replay printed the prologue's values and said it matched.

The EMA and k-fold scripts train by hand (what is copied there is a module, not an optimizer):
torch.optim's first step imports torch._dynamo, about a CPU-second a process.
"""

from __future__ import annotations

from pathlib import Path

from tests.protocol import replay_matches_plain

EVERY = {"FLORTRAIN_PERIOD": "every"}

EMA_HELPER = """\
import torch


def update(ema, model, decay=0.9):
    with torch.no_grad():
        for p_ema, p in zip(ema.parameters(), model.parameters()):
            p_ema.mul_(decay).add_(p, alpha=1 - decay)
"""

EMA = """\
import copy

import torch

import ema_utils

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
ema = copy.deepcopy(model)
train = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
for epoch in range(4):
    for x, y in train:
        model.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.05)
        ema_utils.update(ema, model)
    #PROBE
    print(epoch, f"{loss.item():.6f}")
"""


def test_an_ema_made_by_deepcopy_and_updated_by_a_helper_is_restored(tmp_path: Path) -> None:
    (tmp_path / "ema_utils.py").write_text(EMA_HELPER)
    probe = (
        'print("PROBE", epoch, f"{ema[0].weight.sum().item():.8f}", f"{ema[2].bias.item():.8f}")'
    )
    rep = replay_matches_plain(tmp_path, EMA, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


KFOLD = """\
import copy

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


torch.manual_seed(0)
template = Net()
data = [(torch.randn(8, 4) + 1, torch.randn(8, 1)) for _ in range(3)]
for fold in range(3):
    model = copy.deepcopy(template)
    for epoch in range(2):
        for x, y in data:
            model.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.05)
            last = loss.item()
    #PROBE
    print(fold, f"{last:.6f}")
"""


def test_batch_norm_statistics_of_a_deepcopied_template_are_restored(tmp_path: Path) -> None:
    probe = 'print("PROBE", fold, f"{model.bn.running_mean.sum().item():.8f}", f"{model.out.weight.sum().item():.8f}")'
    rep = replay_matches_plain(tmp_path, KFOLD, probe, EVERY)
    assert "3 block instances skipped, 0 executed" in rep.err, rep.err


UNPICKLED = """\
import torch

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
torch.save(net, "whole.pt")
model = torch.load("whole.pt", weights_only=False)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = [(torch.randn(8, 4) + 1, torch.randn(8, 1)) for _ in range(3)]
for epoch in range(3):
    for x, y in data:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        last = loss.item()
    #PROBE
    print(epoch, f"{last:.6f}")
"""


def test_a_whole_module_saved_and_loaded_with_torch_is_trained_and_restored(tmp_path: Path) -> None:
    """``torch.save(net, ..)`` pickles the module (a batch-norm watch that pickled with it failed
    the record), and ``torch.load`` makes the model trained from then on by unpickling it."""
    probe = 'print("PROBE", epoch, f"{model[1].running_var.sum().item():.8f}", f"{model[3].weight.sum().item():.8f}")'
    rep = replay_matches_plain(tmp_path, UNPICKLED, probe, EVERY)
    assert "3 block instances skipped, 0 executed" in rep.err, rep.err
