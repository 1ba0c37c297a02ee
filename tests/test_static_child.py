"""The static pass forked off beside torch's import (``flortrain/process/static_child.py``): a record
whose pass ran in a child prints what ``python`` prints and replays exactly; an error the child
finds is the same located line; a child that dies leaves the pass to the parent, with a note;
where there is nothing to gain (one CPU, the knob off) the pass runs in the process.

Whether the parent imported libcst tells which path ran: the pass needs it, the runtime does
not. The scripts print ``"libcst" in sys.modules`` at their end. They import torch (the child
is forked only for a script that uses it) and train by hand: torch.optim's first step imports
torch._dynamo, about a CPU-second a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.protocol import flortrain, plain, probe_lines, record, replay_matches_plain

#: the training loop of the one-file scripts here: ``model``, ``lr`` and ``data`` made before it
LOOP = textwrap.dedent("""\
    for epoch in range(3):
        for i in range(0, 32, 8):
            loss = model(data[i:i + 8]).pow(2).mean()
            model.zero_grad()
            loss.backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
        #PROBE
        print(f"epoch {epoch} loss {loss.item():.6f}")
""")
SCRIPT = (
    textwrap.dedent("""\
    import sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    lr = 0.1
    data = torch.randn(32, 4)
""")
    + LOOP
)
#: the script, telling whether the training process imported libcst
TELLS = SCRIPT + 'print("libcst imported:", "libcst" in sys.modules)\n'

FELL_BACK = "the static pass ran in this process instead"

#: the child path needs a second CPU (on one, the pass runs inline: tested below)
two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the static pass forks only with two CPUs"
)


def _record_line(err: str) -> str:
    return next(ln for ln in err.splitlines() if ln.startswith("flortrain: record run 1:"))


def _script_in(tmp: Path, text: str = TELLS) -> Path:
    """``train.py`` in ``tmp``, its ``#PROBE`` marker left a comment: the text
    :func:`replay_matches_plain` records, so that the records of it here are one record's copies."""
    script = tmp / "train.py"
    script.write_text(text)
    return script


@two_cpus
def test_a_pass_in_a_child_records_and_replays_what_python_prints(tmp_path: Path) -> None:
    """The default path on this 2-CPU machine, for record and for replay: the plans the children
    sent back drive a faithful record and replay, and neither training process imports libcst
    (a plain run prints False; the record's last line and the replay's probe must too)."""
    rep = replay_matches_plain(
        tmp_path, TELLS, 'print("PROBE", "libcst" in sys.modules, model.weight.norm().item())'
    )
    assert "PROBE False" in rep.out
    assert "libcst imported: False" in plain(tmp_path / "train.py").out
    assert FELL_BACK not in rep.err


def test_with_the_knob_off_the_pass_runs_in_the_process(tmp_path: Path) -> None:
    """The control for the test above: the same script, the pass run inline, does import libcst
    in the training process, so the check above can tell the two paths apart."""
    _script_in(tmp_path)
    rec = flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_STATIC_OVERLAP": "off"})
    assert rec.code == 0, rec.err
    assert rec.out.endswith("libcst imported: True\n"), rec.out


def test_one_cpu_runs_the_pass_in_the_process(tmp_path: Path) -> None:
    """On one CPU a child would only take turns with torch's import: no fork."""
    _script_in(tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("libcst imported: True\n"), p.stdout


@two_cpus
def test_a_killed_child_leaves_the_pass_to_the_parent(tmp_path: Path) -> None:
    """A child killed before it sent anything: record says so in one line, runs the pass itself
    and records the same plan, printing what python prints (but for libcst, now imported)."""
    script = _script_in(tmp_path)
    truth = plain(script)
    (tmp_path / "normal").mkdir()
    _script_in(tmp_path / "normal")
    normal = record(tmp_path / "normal", "train.py")
    assert normal.code == 0 and FELL_BACK not in normal.err, normal.err
    rec = flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_INJECT": "static-child-kill=1"})
    assert rec.code == 0, rec.err
    assert (
        f"flortrain: the static pass's child was killed by signal 9; {FELL_BACK}"
        in rec.err.splitlines()
    )
    assert rec.out == truth.out.replace("libcst imported: False", "libcst imported: True")
    assert _record_line(rec.err) == _record_line(normal.err)  # the same main loops and blocks
    script.write_text(TELLS.replace("#PROBE", 'print("PROBE", model.weight.norm().item())'))
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py")
    # the script tells where the pass ran, and the replay's ran in a child: its check finds the
    # record's last line differs, which is true, and exits 1
    assert rep.code == 1 and want and probe_lines(rep.out) == want, rep.err
    assert (
        "record: libcst imported: True\nflortrain:     replay: libcst imported: False" in rep.err
    ), rep.err


@two_cpus
def test_a_killed_replay_child_leaves_the_plan_to_the_parent(tmp_path: Path) -> None:
    script = _script_in(tmp_path)
    assert record(tmp_path, "train.py").code == 0
    script.write_text(TELLS.replace("#PROBE", 'print("PROBE", model.weight.norm().item())'))
    want = probe_lines(plain(script).out)
    rep = flortrain(tmp_path, "replay", "train.py", env={"FLORTRAIN_INJECT": "static-child-kill=1"})
    # the replay's pass ran in its own process, which the script tells: the last line truly
    # differs from the record's, and the replay says so with exit 1
    assert rep.code == 1 and want and probe_lines(rep.out) == want, rep.err
    assert (
        "record: libcst imported: False\nflortrain:     replay: libcst imported: True" in rep.err
    ), rep.err
    assert (
        f"flortrain: the static pass's child was killed by signal 9; {FELL_BACK}"
        in rep.err.splitlines()
    )


@two_cpus
def test_a_probe_error_the_child_finds_is_one_located_line(tmp_path: Path) -> None:
    """A replay of an edited recorded line is refused in the child: the same line as inline."""
    script = _script_in(tmp_path)
    assert record(tmp_path, "train.py").code == 0
    script.write_text(script.read_text().replace("lr = 0.1", "lr = 0.2"))
    lines = []
    for overlap in ("on", "off"):
        r = flortrain(tmp_path, "replay", "train.py", env={"FLORTRAIN_STATIC_OVERLAP": overlap})
        assert r.code == 2 and r.out == "" and "Traceback" not in r.err, r.err
        lines.append(r.err.strip().splitlines()[-1])
    assert lines[0] == lines[1] and lines[0].startswith("train.py:5:"), lines


@two_cpus
def test_an_error_the_child_finds_is_one_located_line(tmp_path: Path) -> None:
    """A syntax error in a torch script is found in the child: the parent reports it exactly as
    the pass run inline does (one line, path:line:col, exit 2) and creates no store."""
    (tmp_path / "train.py").write_text("import torch\nfor i in range(3)\n    print(i)\n")
    lines = []
    for overlap in ("on", "off"):
        r = flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_STATIC_OVERLAP": overlap})
        assert r.code == 2 and r.out == "" and "Traceback" not in r.err, r.err
        lines.append(r.err.strip())
    assert lines[0] == lines[1] == "train.py:2:18: FT002 syntax error: expected ':'"
    assert not (tmp_path / ".flortrain").exists()


def test_a_bad_knob_value_is_refused_before_anything_runs(tmp_path: Path) -> None:
    _script_in(tmp_path)
    r = flortrain(tmp_path, "record", "train.py", env={"FLORTRAIN_STATIC_OVERLAP": "maybe"})
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == "FT050 FLORTRAIN_STATIC_OVERLAP='maybe' must be one of on, off"


TRAINER = textwrap.dedent("""\
    def fit(model, lr, data, epochs):
        for epoch in range(epochs):
            for i in range(0, len(data), 8):
                loss = model(data[i:i + 8]).pow(2).mean()
                model.zero_grad()
                loss.backward()
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
            print(f"epoch {epoch} loss {loss.item():.6f}")
        return loss.item()
""")

MODULE_SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    EDIT
    from trainer import fit
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    fit(model, 0.1, torch.randn(32, 4), 3)
    #PROBE
    print("libcst imported:", "libcst" in sys.modules)
""")


@two_cpus
def test_a_project_modules_pass_is_done_in_the_child_too(tmp_path: Path) -> None:
    """minGPT's shape, the epoch loop in an imported module: the child instruments the module
    the script imports, the import hook uses that, and neither record nor replay imports libcst
    in the training process; record and replay print what python prints."""
    (tmp_path / "trainer.py").write_text(TRAINER)
    rep = replay_matches_plain(
        tmp_path,
        MODULE_SCRIPT.replace("EDIT\n", ""),
        'print("PROBE", model.weight.sum().item())',
        env={"FLORTRAIN_PERIOD": "every"},
    )
    assert "libcst imported: False" in rep.out
    assert "trainer:L3: skip 3 of 3 instance(s)" in rep.err  # the module's blocks were restored
    assert "3 block instances skipped" in rep.err


@two_cpus
def test_a_module_changed_after_its_pass_is_instrumented_as_it_is_imported(tmp_path: Path) -> None:
    """The script rewrites its module before importing it (the pass done ahead read the old
    text): the hook sees the text differ and runs the pass on what is imported, so the record
    still prints what python prints, with the module's loop memoized."""
    (tmp_path / "trainer.py").write_text(TRAINER)
    edit = 'open("trainer.py", "a").write("# edited\\\\n")'
    script = _script_in(tmp_path, MODULE_SCRIPT.replace("EDIT", edit))
    rec = flortrain(tmp_path, "record", "train.py")
    assert rec.code == 0, rec.err
    assert (
        "flortrain: module trainer (trainer.py): 1 main loop(s), 1 memoized loop(s), 0 refused"
        in rec.err
    )
    assert rec.out.endswith("libcst imported: True\n")  # the pass ran here, on the edited text
    (tmp_path / "trainer.py").write_text(TRAINER)
    truth = plain(script)
    assert rec.out == truth.out.replace("libcst imported: False", "libcst imported: True")


@two_cpus
def test_a_record_started_with_sigchld_ignored_uses_the_childs_result(tmp_path: Path) -> None:
    """SIGCHLD ignored survives ``exec`` (some supervisors leave it so): the kernel reaps the
    child, ``waitpid`` finds nothing, and the result it sent is used all the same."""
    script = _script_in(tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "flortrain", "record", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN),
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == plain(script).out and FELL_BACK not in p.stderr, p.stderr


MYLIB = textwrap.dedent("""\
    import torch

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        return model, 0.1, torch.randn(32, 4)
""")

NAMES_NO_TORCH = "from mylib import make\nmodel, lr, data = make()\n" + LOOP.replace(
    "    #PROBE\n", ""
)


def test_a_cli_probe_keeps_torch_found_in_an_imported_module(tmp_path: Path) -> None:
    """The script names torch only through a module it imports; a ``--probe`` spec is not Python
    on its own, so it must not hide that module: the replay registers the model and restores
    the blocks' checkpoints rather than re-executing them."""
    (tmp_path / "mylib.py").write_text(MYLIB)
    (tmp_path / "train.py").write_text(NAMES_NO_TORCH)
    every = {"FLORTRAIN_PERIOD": "every"}
    assert flortrain(tmp_path, "record", "train.py", env=every).code == 0
    rep = flortrain(
        tmp_path, "replay", "--probe", "10:model.weight.sum().item()", "train.py", env=every
    )
    assert rep.code == 0, rep.err
    assert "3 block instances skipped" in rep.err, rep.err


DEEP = (
    "def f():\n    for i in range(2):\n        for j in range(2):\n            pass\n\nx = "
    + " + ".join(["1"] * 3000)
    + "\n"
)


@two_cpus
def test_a_module_the_child_cannot_analyse_is_left_to_the_import_hook(tmp_path: Path) -> None:
    """A module imported only inside a function never called, whose pass fails with something
    other than a refusal (an expression too deep for the parser's recursion): the child skips
    it, and the record prints what python prints, as it does with the pass inline."""
    (tmp_path / "deep.py").write_text(DEEP)
    text = TELLS.replace("    #PROBE\n", "").replace(
        "import sys\n", "import sys\n\n\ndef never():\n    import deep\n\n\n", 1
    )
    script = tmp_path / "train.py"
    script.write_text(text)
    truth = plain(script)
    rec = flortrain(tmp_path, "record", "train.py")
    assert rec.code == 0, rec.err
    assert rec.out == truth.out and FELL_BACK not in rec.err, rec.err


def test_no_fork_while_another_thread_runs(tmp_path: Path) -> None:
    """A child forked while another thread holds a lock could inherit it held: with a second
    thread alive, the pass runs in the process (the CLI itself starts none before it forks)."""
    code = textwrap.dedent("""\
        import threading
        from flortrain.process import static_child
        print(static_child._threads(), static_child.worth_overlapping(True))
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        print(static_child._threads(), static_child.worth_overlapping(True))
        stop.set()
        t.join()
    """)
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    assert first == f"1 {len(os.sched_getaffinity(0)) >= 2}" and second == "2 False", p.stdout
