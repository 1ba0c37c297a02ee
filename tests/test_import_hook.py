"""Project modules are instrumented at import time (flortrain/runtime/importhook.py).

A minGPT-shaped project (``from mingpt.trainer import Trainer``, the training loop in
``Trainer.run()``) goes through the correctness protocol with real torch; smaller torch-free
projects check the import semantics: relative imports, one module per name, the module's
attributes, tracebacks, files outside the project, and the replay's refusal of a changed module.
The trainer steps its model by hand: a torch.optim optimizer imports torch._dynamo, about a
CPU-second a process.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from tests.protocol import Result, block_states, flortrain, latest_run, plain, probe_lines, run

EVERY = {"FLORTRAIN_PERIOD": "every"}

MODEL = """\
import torch
from torch import nn


class GPT(nn.Module):
    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(torch.tanh(self.emb(x)))
"""

TRAINER = """\
import torch
from torch.nn import functional as F

from .model import GPT


class Trainer:
    def __init__(self, model: GPT, loader, epochs: int = 3) -> None:
        self.model = model
        self.loader = loader
        self.epochs = epochs
        self.lr = 0.1

    def run(self) -> None:
        for epoch in range(self.epochs):
            total = 0.0
            for x, y in self.loader:
                logits = self.model(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
                loss.backward()
                with torch.no_grad():
                    for p in self.model.parameters():
                        p -= self.lr * p.grad
                self.model.zero_grad()
                total += loss.item()
            print(f"epoch {epoch} loss {total:.6f}")
"""

TRAIN = """\
import torch

from mingpt.model import GPT
from mingpt.trainer import Trainer

torch.manual_seed(0)
data = torch.randint(0, 16, (32, 5))
dataset = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)
model = GPT()
trainer = Trainer(model, loader)
trainer.run()
#PROBE
print(f"final {sum(p.sum().item() for p in model.parameters()):.6f}")
"""

PROBE = 'print("PROBE", [round(p.sum().item(), 6) for p in model.parameters()])'

#: A torch-free package: a main loop in a module reached through relative imports.
LOOPS = """\
from . import helpers


def run(epochs):
    state = {"total": 0}
    for epoch in range(epochs):
        for i in range(4):
            state["total"] = helpers.step(state["total"], i)
        print("epoch", epoch, state["total"])
    return state
"""

HELPERS = """\
def step(total, i):
    if total > 1000:
        raise ValueError(f"diverged at {total}")
    return total * 3 + i
"""


def write_project(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def mingpt(root: Path) -> Path:
    write_project(
        root,
        {
            "mingpt/__init__.py": '"""A tiny minGPT."""\n',
            "mingpt/model.py": MODEL,
            "mingpt/trainer.py": TRAINER,
            "train.py": TRAIN,
        },
    )
    return root / "train.py"


def package(root: Path, script: str) -> Path:
    write_project(
        root,
        {
            "pkg/__init__.py": "from .loops import run\n",
            "pkg/loops.py": LOOPS,
            "pkg/helpers.py": HELPERS,
            "train.py": script,
        },
    )
    return root / "train.py"


def run_meta(store: Path, run_id: int) -> dict[str, object]:
    db = sqlite3.connect(store / "flortrain.db")
    try:
        (meta,) = db.execute("SELECT meta FROM runs WHERE id=?", (run_id,)).fetchone()
        return dict(json.loads(meta))
    finally:
        db.close()


def block_ids(store: Path, run_id: int) -> set[str]:
    db = sqlite3.connect(store / "flortrain.db")
    try:
        return {
            b
            for (b,) in db.execute(
                "SELECT DISTINCT block_id FROM blocks WHERE run_id=? AND state != 'boundary'",
                (run_id,),
            )
        }
    finally:
        db.close()


def record_matches_plain(root: Path, env: dict[str, str] | None = None) -> tuple[Result, int]:
    truth = plain(root / "train.py")
    rec = flortrain(root, "record", "train.py", env=env)
    assert (rec.out, rec.code) == (truth.out, truth.code), rec.err
    return rec, int(str(latest_run(root)["id"]))


def test_mingpt_trainer_is_recorded_and_skipped_on_replay(tmp_path: Path) -> None:
    script = mingpt(tmp_path)
    store = tmp_path / ".flortrain"
    _, record_id = record_matches_plain(tmp_path, EVERY)
    # the trainer's loops were checkpointed, under ids that name their module
    assert block_ids(store, record_id) == {"mingpt.trainer:L17"}
    assert block_states(store, record_id).get("checkpointed", 0) == 3
    modules = run_meta(store, record_id)["modules"]
    assert modules.keys() == {str(tmp_path / "mingpt" / "trainer.py")}, modules
    # an outer probe in the script, after trainer.run(), sees the restored parameters
    script.write_text(TRAIN.replace("#PROBE", PROBE))
    want = probe_lines(plain(script).out)
    assert want
    rep = flortrain(tmp_path, "replay", "train.py", env=EVERY)
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want
    states = block_states(store, int(str(latest_run(tmp_path)["id"])))
    assert states.get("skipped", 0) == 3 and states.get("executed", 0) == 0, states
    d = flortrain(tmp_path, "diff")
    assert d.code == 0, d.out + d.err


def test_changed_module_is_refused(tmp_path: Path) -> None:
    package(tmp_path, "from pkg import run\n\nrun(2)\n")
    record_matches_plain(tmp_path)
    loops = tmp_path / "pkg" / "loops.py"
    loops.write_text(
        LOOPS.replace(
            '        print("epoch"', '        print("PROBE", epoch)\n        print("epoch"'
        )
    )
    rep = flortrain(tmp_path, "replay", "train.py")
    assert rep.code == 2
    assert rep.err.count("\n") == 1 and "Traceback" not in rep.err, rep.err
    assert rep.err.startswith("pkg/loops.py: FT032 ") and "only in the script" in rep.err, rep.err


def test_module_attributes_and_relative_imports_are_pythons(tmp_path: Path) -> None:
    script = """\
        import sys
        import xxsubtype  # built in (and imported by nothing else): a project file does not shadow it
        import pkg
        import pkg.loops as a
        from pkg import loops as b

        for m in (pkg, a):
            spec = m.__spec__
            print(m.__name__, m.__file__, m.__package__, m.__cached__, spec.name, spec.origin)
            print(getattr(m, "__path__", None), spec.submodule_search_locations, spec.parent)
        print(a is b is sys.modules["pkg.loops"], pkg.run is a.run)
        print(a.run(2), xxsubtype.__name__, hasattr(xxsubtype, "bench"))
        """
    package(tmp_path, script)
    (tmp_path / "xxsubtype.py").write_text(
        LOOPS.replace("from . import helpers", "from pkg import helpers")
    )
    rec, record_id = record_matches_plain(tmp_path)
    assert "module pkg.loops (pkg/loops.py): 1 main loop(s), 1 memoized loop(s)" in rec.err, rec.err
    assert block_ids(tmp_path / ".flortrain", record_id) == {"pkg.loops:L7"}


def test_traceback_inside_a_module_shows_its_file_and_lines(tmp_path: Path) -> None:
    package(tmp_path, "from pkg import run\n\nrun(9)\n")
    truth = plain(tmp_path / "train.py")
    assert truth.code == 1 and "ValueError: diverged" in truth.err
    rec = flortrain(tmp_path, "record", "train.py")
    assert rec.code == 1
    assert truth.err in rec.err, rec.err  # the whole traceback, caret lines included


def test_modules_outside_the_project_are_not_instrumented(tmp_path: Path) -> None:
    project = tmp_path / "project"
    outside = tmp_path / "outside"
    vendored = project / "vendor" / "site-packages"
    loops = LOOPS.replace("from . import helpers", "from pkg import helpers")
    extra = "print(__name__, type(__loader__).__name__)\n"
    write_project(outside, {"extlib.py": extra + loops})
    write_project(vendored, {"vendlib.py": extra + loops})
    package(project, "import extlib\nimport vendlib\n\nextlib.run(2)\nvendlib.run(2)\n")
    env = {
        "PYTHONPATH": os.pathsep.join(
            [str(outside), str(vendored), os.environ.get("PYTHONPATH", "")]
        )
    }
    truth = run([sys.executable, "train.py"], project, env)
    assert "extlib SourceFileLoader" in truth.out and "vendlib SourceFileLoader" in truth.out
    rec = flortrain(project, "record", "train.py", env=env)
    assert (rec.out, rec.code) == (truth.out, 0), rec.err
    record_id = int(str(latest_run(project)["id"]))
    assert block_ids(project / ".flortrain", record_id) == set()
    # pkg.loops (imported by both for its helpers) is the project's; their own loops are not
    modules = run_meta(project / ".flortrain", record_id)["modules"]
    assert set(modules) == {str(project / "pkg" / "loops.py")}, modules  # type: ignore[arg-type]
    assert "extlib" not in rec.err and "vendlib" not in rec.err, rec.err


def test_explain_lists_directly_imported_project_modules(tmp_path: Path) -> None:
    mingpt(tmp_path)
    r = flortrain(tmp_path, "instrument", "--explain", "train.py")
    assert r.code == 0, r.err
    assert "mingpt/model.py: module mingpt.model: no main loop; imported plainly" in r.out
    assert "mingpt/trainer.py:15:9 main loop mingpt.trainer:M15 (for) in Trainer.run" in r.out
    assert "mingpt/trainer.py:17:13 memoized for loop mingpt.trainer:L17 in Trainer.run" in r.out


def test_explain_names_modules_imported_from_outside_the_project(tmp_path: Path) -> None:
    """minGPT's layout: the script in ``projects/chargpt``, the ``mingpt`` package at the
    repository's root on ``PYTHONPATH`` (or an editable install's tree). Its trainer is not
    instrumented, and ``--explain`` says so for each module the script imports from there, with
    the directory; an installed package (under ``site-packages``) is not listed."""
    outside = tmp_path / "repo"
    mingpt(outside)
    vendored = tmp_path / "venv" / "site-packages"
    write_project(vendored, {"vendlib.py": "def f():\n    return 1\n"})
    project = outside / "projects" / "chargpt"
    project.mkdir(parents=True)
    (outside / "train.py").rename(project / "train.py")
    script = project / "train.py"
    script.write_text("import vendlib\n" + script.read_text())
    env = {
        "PYTHONPATH": os.pathsep.join(
            [str(outside), str(vendored), os.environ.get("PYTHONPATH", "")]
        )
    }
    r = flortrain(project, "instrument", "--explain", "train.py", env=env)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "train.py: no main loop (no loop contains another loop); nothing is memoized"
    said = [ln for ln in lines if "outside the project" in ln]
    assert said == [
        f"{outside / 'mingpt' / m}.py: module mingpt.{m} is imported from {outside}, outside the"
        " project (the script's directory and the working directory): not instrumented, so none"
        f" of its loops is memoized; modules under the working directory are the project's (run"
        f" from {outside})"
        for m in ("model", "trainer")
    ], r.out
    # run from there, the trainer is the project's
    r = flortrain(outside, "instrument", "--explain", "projects/chargpt/train.py", env=env)
    assert "outside the project" not in r.out, r.out
    assert "mingpt/trainer.py:15:9 main loop mingpt.trainer:M15 (for) in Trainer.run" in r.out


def test_installed_code_reached_through_a_symlink_is_passed_over_by_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A virtualenv reached through a symlink: modules' ``__file__`` carry the unresolved path.
    The side-effect audit must pass them over by prefix, not resolve each of torch's ~1,500
    modules in the first audited iteration."""
    import sysconfig
    import types

    from flortrain.runtime import audit
    from flortrain.static import project_files

    real = tmp_path / "real"
    (real / "site").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(link / "site")})
    roots = project_files._excluded_roots()
    assert str(link / "site") in roots and str(real / "site") in roots
    files = project_files.ProjectFiles([str(tmp_path)], str(tmp_path / "train.py"))
    asked: list[str] = []
    monkeypatch.setattr(files, "contains", lambda path: asked.append(path) or False)
    module = types.ModuleType("flortrain_test_installed")
    module.__file__ = str(link / "site" / "flortrain_test_installed.py")
    monkeypatch.setitem(sys.modules, "flortrain_test_installed", module)
    monkeypatch.delitem(audit._PROJECT, "flortrain_test_installed", raising=False)
    assert "flortrain_test_installed" not in audit.project_modules(files)
    assert module.__file__ not in asked


def test_the_audits_project_modules_follow_every_change_to_sys_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``project_modules`` answers again from its last answer while ``sys.modules`` is as it was
    then; a project module imported, removed or replaced under its name since must show."""
    import types

    from flortrain.runtime import audit
    from flortrain.static import project_files

    files = project_files.ProjectFiles([str(tmp_path)], str(tmp_path / "train.py"))

    def project_module(name: str) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__file__ = str(tmp_path / f"{name}.py")
        return m

    first = project_module("flortrain_test_helpers")
    monkeypatch.setitem(sys.modules, "flortrain_test_helpers", first)
    assert audit.project_modules(files)["flortrain_test_helpers"] is first
    assert audit.project_modules(files)["flortrain_test_helpers"] is first  # the last answer again
    assert "flortrain_test_more" not in audit.project_modules(files)
    monkeypatch.setitem(sys.modules, "flortrain_test_more", project_module("flortrain_test_more"))
    assert "flortrain_test_more" in audit.project_modules(files)  # imported since
    again = project_module("flortrain_test_helpers")
    sys.modules["flortrain_test_helpers"] = again  # re-imported: a new module under the old name
    assert audit.project_modules(files)["flortrain_test_helpers"] is again
    del sys.modules["flortrain_test_more"]
    assert "flortrain_test_more" not in audit.project_modules(files)
    answer = audit.project_modules(files)
    answer.clear()  # a caller's copy: the next answer is whole
    assert "flortrain_test_helpers" in audit.project_modules(files)
    other = project_files.ProjectFiles([str(tmp_path / "elsewhere")], str(tmp_path / "train.py"))
    monkeypatch.setattr(audit, "_PROJECT", {})  # judged afresh for another project
    assert "flortrain_test_helpers" not in audit.project_modules(other)
