"""Which probe statements change training state (replay/observation.py): refused up front with
FT025, because a replay would reproduce the record while ``python`` on the probed script would
train differently. Names used by the recorded script are the ones a probe may not change."""

from __future__ import annotations

import libcst as cst
import pytest

from flortrain.replay.observation import imported_names, mutation

SCRIPT = """\
import numpy as np
import torch
from torch import nn
model = nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
hist = []
x = torch.zeros(2)
a = np.zeros(3)
"""
USED = {"np", "torch", "nn", "model", "opt", "hist", "x", "a"}
MODULES = imported_names(cst.parse_module(SCRIPT))


def _mutation(stmt: str) -> str | None:
    return mutation(cst.parse_statement(stmt), USED, MODULES)


def test_imported_names_are_the_modules() -> None:
    assert {"np", "torch", "nn"} == MODULES


@pytest.mark.parametrize(
    ("stmt", "says"),
    [
        ("model.lr = 0", "assigns to `model.lr`"),
        ("opt.param_groups[0]['lr'] = 0.1", "assigns to `opt.param_groups[0]['lr']`"),
        ("x[0] += 1", "assigns to `x[0]`"),
        ("model.weight.data.mul_(2)", "calls `model.weight.data.mul_()`"),
        ("model.requires_grad_(False)", "calls `model.requires_grad_()`"),
        ("torch.nn.init.zeros_(model.weight)", "calls `torch.nn.init.zeros_()` on `model.weight`"),
        ("opt.step()", "calls `opt.step()`"),
        ("opt.zero_grad()", "calls `opt.zero_grad()`"),
        ("model.load_state_dict({})", "calls `model.load_state_dict()`"),
        ("hist.append(1)", "calls `hist.append()`"),
        ("np.random.shuffle(a)", "calls `np.random.shuffle()` on `a`"),
        ("setattr(model, 'lr', 0)", "calls `setattr()` on `model`"),
        ("print(model(x).sum().backward())", "calls `model(x).sum().backward()`"),
    ],
)
def test_changes_are_named(stmt: str, says: str) -> None:
    assert _mutation(stmt) == says


@pytest.mark.parametrize(
    "stmt",
    [
        "print(model.weight.grad.norm().item())",
        "g = [p.grad.norm().item() for p in model.parameters()]",
        "print(float(x.sum()), opt.param_groups[0]['lr'])",
        "model.eval()",  # replay restores train/eval mode after every probe
        "torch.manual_seed(0)",  # and the global RNG streams
        "print(torch.add(x, 1), np.sort(a))",  # module functions that return new values
        "mine = []; mine.append(len(hist))",  # the probe's own objects
        "def f():\n    model.lr = 0\n",  # a function the probe defines is not inspected
    ],
)
def test_observations_are_allowed(stmt: str) -> None:
    assert _mutation(stmt) is None
