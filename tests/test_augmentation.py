"""Flor's library augmentation, resolved at run time against live objects (in-process, real torch):
an optimizer brings the modules whose parameters it updates, a scheduler brings its optimizer,
an optimizer that stepped joins even if unnamed, and probe-built modules are not registered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flortrain.runtime.probe import isolated  # noqa: E402
from flortrain.runtime.recording import RecordSession  # noqa: E402
from flortrain.store.db import Store  # noqa: E402


@pytest.fixture
def session(tmp_path: Path) -> Iterator[RecordSession]:
    s = RecordSession(Store(tmp_path / "store"), 1)
    s.registry.install()
    try:
        yield s
    finally:
        s.registry.uninstall()


def kinds(aug: list[tuple[str, int, object]]) -> list[tuple[str, object]]:
    return [(k, o) for k, _, o in aug]


def test_optimizer_brings_its_root_module_not_others(session: RecordSession) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    other = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    aug = kinds(session.augmentation("L1", [opt]))
    assert aug == [("module", net)]  # the root, not its submodules; not the unrelated module
    assert ("module", other) not in aug


def test_scheduler_brings_optimizer_and_its_modules(session: RecordSession) -> None:
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    opt = torch.optim.Adam([*a.parameters(), *b.parameters()])
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    aug = kinds(session.augmentation("L1", [sched]))
    assert aug[0] == ("optimizer", opt)
    assert {id(o) for _, o in aug[1:]} == {id(a), id(b)}


def test_stepped_optimizer_joins_unnamed(session: RecordSession) -> None:
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    session.registry.reset_block()
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    aug = kinds(session.augmentation("L1", []))
    assert ("optimizer", opt) in aug and ("module", net) in aug


def test_every_optimizer_that_steps_is_noted_again_after_each_reset(session: RecordSession) -> None:
    """The step hook tells the optimizer that stepped last by identity alone; a block's reset
    must make it note that optimizer again."""
    reg = session.registry
    nets = [torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)]
    a, b = (torch.optim.SGD(n.parameters(), lr=0.1) for n in nets)
    for n in nets:
        n(torch.ones(1, 3)).sum().backward()
    reg.reset_block()
    for opt in (a, a, b, a):
        opt.step()
    assert reg.stepped == {reg.id_of(a), reg.id_of(b)}
    for _ in range(2):  # the optimizer that stepped last before the reset steps first after it
        reg.reset_block()
        a.step()
        assert reg.stepped == {reg.id_of(a)}


def test_named_objects_are_not_duplicated(session: RecordSession) -> None:
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    assert session.augmentation("L1", [net, opt]) == []


def test_probe_built_modules_are_not_registered(session: RecordSession) -> None:
    before = len(list(session.registry.live()))
    keep = []
    with isolated(session):
        keep.append(torch.nn.Linear(2, 2))
    assert len(list(session.registry.live())) == before
    after = torch.nn.Linear(2, 2)
    assert session.registry.id_of(after) == before  # ids stay aligned with the record


def test_probe_restores_rng_mode_and_grad(session: RecordSession) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with isolated(session):
        net.eval()
        torch.set_grad_enabled(False)
        torch.rand(100)
    assert net.training and net[1].training
    assert torch.is_grad_enabled()
    assert torch.equal(torch.rand(3), expected)
