"""The correctness protocol and a memoization report over real public training scripts.

Each script comes from a fetched snapshot of its public repository (a bare git directory under
``--mirrors``, as the search tool's ``fetch`` leaves it); nothing of theirs is kept here. At run
time the harness exports the files a script needs into a temporary directory and shrinks the
script to a tiny offline configuration: command-line arguments where the script has them, small
textual substitutions where it has none (each must match, so a changed upstream is noticed),
synthetic data files, and ``benchmarks/corpus_shim`` on PYTHONPATH for the torchvision pieces
the scripts use. Then, one script at a time:

1. ``python S`` twice: the ground truth, which must be byte-identical (else the script is left
   out as nondeterministic, with the first differing line);
2. ``flortrain record S``: its stdout and exit code against python's;
3. an outer probe (a parameter sum at full precision, appended to the main loop's body) and an
   inner probe (first in the body of the batch loop), placed by a locator that reads
   ``flortrain instrument --explain``: ``python S'`` in a fresh copy against ``flortrain replay
   S'`` (and ``--jobs 2`` with ``--jobs-too``), probe lines and exit code, then ``flortrain diff``;
4. every loop of the plan, memoized or not and why (``--explain``), with how many of its
   instances the record checkpointed and the notes the store keeps for those it did not.

A failure is one of: ``wrong`` (the replay exits 0 but its probe lines or exit code differ
from python's: the worst), ``refused`` (a one-line reason, exit non-zero), ``traceback`` (from
flortrain, not from the script), ``nondeterministic`` (ground truth differs between two runs).

    python benchmarks/corpus.py [--quick] [--only NAME ...] [--jobs-too] [--python PY]
                                [--mirrors DIR] [--site DIR]

``--site DIR``: a directory of extra packages for the scripts that need them (makemore imports
``torch.utils.tensorboard``): ``pip install --target DIR tensorboard``. Writes
benchmarks/results/corpus.json and corpus.png (``corpus-quick`` with --quick or --only).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pickle
import platform
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "benchmarks" / "corpus_shim"
OUT = ROOT / "benchmarks" / "results"
TIMEOUT_S = 300.0

#: the probe statement; MODEL is the module in scope where the probe goes
PROBE = "print('PROBE', {kind!r}, repr(sum(float(p.detach().double().sum()) for p in {model}.parameters())))"

Writer = Callable[[Path], None]


@dataclass(frozen=True)
class Script:
    """One corpus script and how it is shrunk."""

    name: str
    repo: str  # owner/name
    path: str  # the script, relative to the repository's root
    export: tuple[str, ...]  # path prefixes to export (the script's own directory, project modules)
    args: tuple[str, ...] = ()
    #: (file relative to the repository, old, new): each ``old`` must occur in the file
    subs: tuple[tuple[str, str, str], ...] = ()
    data: Writer | None = None  # writes synthetic inputs into the script's directory
    model: str = "model"  # the probe's module at the outer probe
    inner_model: str | None = None  # at the inner probe, if another name
    #: (anchor, kind): insert the probe after the first line whose stripped text is ``anchor``
    #: (overrides the locator, for loops the plan does not show in the script)
    anchors: tuple[tuple[str, str], ...] = ()
    pythonpath: tuple[str, ...] = ()  # relative to the export root
    needs: tuple[str, ...] = ()  # modules that must import (else the script is skipped)
    prepare: tuple[str, ...] = ()  # a data-making script of the repository, run first (python)
    #: seed torch after its import (a script that seeds nothing has no ground truth to compare with)
    seed: bool = False
    quick: bool = False
    skip: str = ""  # why the script is not run at all


# -- synthetic data ----------------------------------------------------------------------------

WORDS = [f"w{i}" for i in range(400)]


def _text(seed: int, lines: int) -> str:
    r = random.Random(seed)
    return "".join(
        " ".join(r.choice(WORDS[: r.randint(40, 400)]) for _ in range(r.randint(5, 15))) + "\n"
        for _ in range(lines)
    )


def _wikitext(d: Path) -> None:
    root = d / "data" / "wikitext-2"
    root.mkdir(parents=True, exist_ok=True)
    for name, seed, lines in (("train.txt", 1, 300), ("valid.txt", 2, 40), ("test.txt", 3, 40)):
        (root / name).write_text(_text(seed, lines))


def _tutorial_text(d: Path) -> None:
    (d / "data").mkdir(exist_ok=True)
    (d / "data" / "train.txt").write_text(_text(4, 250))


def _shakespeare_bins(d: Path) -> None:
    import numpy as np

    root = d / "data" / "shakespeare_char"
    root.mkdir(parents=True, exist_ok=True)
    chars = sorted(set("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", 20000), ("val.bin", 4000)):
        rng.integers(0, len(chars), n).astype(np.uint16).tofile(root / name)
    meta = {
        "vocab_size": len(chars),
        "itos": dict(enumerate(chars)),
        "stoi": {c: i for i, c in enumerate(chars)},
    }
    with open(root / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def _chargpt_input(d: Path) -> None:
    r = random.Random(5)
    # with the characters of the prompt chargpt samples from ("O God, O God!")
    (d / "input.txt").write_text("".join(r.choice("abcdefgh ijkl\nOGod,!") for _ in range(3000)))


def _names(d: Path) -> None:
    r = random.Random(6)
    names = {
        "".join(r.choice("aeiou" if i % 2 else "bcdfgklmnprst") for i in range(r.randint(3, 8)))
        for _ in range(400)
    }
    (d / "names.txt").write_text("\n".join(sorted(names)) + "\n")


# -- the corpus --------------------------------------------------------------------------------

EX = "pytorch/examples"
TUT = "yunjey/pytorch-tutorial"
T1 = "tutorials/01-basics"
T2 = "tutorials/02-intermediate"
T3 = "tutorials/03-advanced"


CORPUS: list[Script] = [
    Script(
        "examples-mnist",
        EX,
        "mnist/main.py",
        ("mnist",),
        quick=True,
        args=(
            "--epochs",
            "3",
            "--batch-size",
            "64",
            "--test-batch-size",
            "128",
            "--log-interval",
            "4",
        ),
    ),
    Script(
        "examples-mnist_rnn",
        EX,
        "mnist_rnn/main.py",
        ("mnist_rnn",),
        args=(
            "--epochs",
            "3",
            "--batch-size",
            "64",
            "--test-batch-size",
            "128",
            "--log-interval",
            "4",
        ),
    ),
    Script(
        "examples-vae",
        EX,
        "vae/main.py",
        ("vae",),
        args=("--epochs", "3", "--batch-size", "64", "--log-interval", "4"),
    ),
    Script(
        "examples-word_language_model",
        EX,
        "word_language_model/main.py",
        ("word_language_model",),
        quick=True,
        args=(
            "--epochs",
            "3",
            "--emsize",
            "32",
            "--nhid",
            "32",
            "--bptt",
            "20",
            "--batch_size",
            "10",
            "--log-interval",
            "10",
        ),
        subs=(
            ("word_language_model/main.py", "elapsed * 1000 / args.log_interval", "0 * elapsed"),
            (
                "word_language_model/main.py",
                "(time.time() - epoch_start_time)",
                "0 * (time.time() - epoch_start_time)",
            ),
        ),
        data=_wikitext,
    ),
    Script(
        "examples-dcgan",
        EX,
        "dcgan/main.py",
        ("dcgan",),
        model="netD",
        args=(
            "--dataset",
            "fake",
            "--manualSeed",
            "1",
            "--workers",
            "0",
            "--batchSize",
            "8",
            "--ngf",
            "8",
            "--ndf",
            "8",
            "--nz",
            "16",
            "--niter",
            "3",
        ),
    ),
    # seeds nothing
    Script("examples-regression", EX, "regression/main.py", ("regression",), model="fc", seed=True),
    Script(
        "examples-time_sequence_prediction",
        EX,
        "time_sequence_prediction/train.py",
        ("time_sequence_prediction",),
        model="seq",
        args=("--steps", "3"),
        subs=(
            ("time_sequence_prediction/generate_sine_wave.py", "L = 1000", "L = 60"),
            ("time_sequence_prediction/generate_sine_wave.py", "N = 100", "N = 12"),
            ("time_sequence_prediction/train.py", "future = 1000", "future = 20"),
            # a NumPy array, which torch.load no longer unpickles by default
            (
                "time_sequence_prediction/train.py",
                "torch.load('traindata.pt')",
                "torch.load('traindata.pt', weights_only=False)",
            ),
        ),
        prepare=("time_sequence_prediction/generate_sine_wave.py",),
    ),
    Script(
        "examples-mnist_forward_forward",
        EX,
        "mnist_forward_forward/main.py",
        ("mnist_forward_forward",),
        model="self",
        seed=True,  # parses --seed, never seeds
        args=("--epochs", "20", "--train_size", "256", "--test_size", "128", "--log-interval", "5"),
    ),
    Script(
        "examples-siamese_network",
        EX,
        "siamese_network/main.py",
        ("siamese_network",),
        skip="builds torchvision.models.resnet18, which the shim does not provide",
    ),
    Script(
        "examples-reinforcement_learning",
        EX,
        "reinforcement_learning/reinforce.py",
        ("reinforcement_learning",),
        skip="needs gym (CartPole), not installed",
    ),
    Script(
        "examples-fast_neural_style",
        EX,
        "fast_neural_style/neural_style/neural_style.py",
        ("fast_neural_style",),
        skip="needs pretrained VGG16 weights, which cannot be downloaded",
    ),
    Script(
        "nanogpt-shakespeare_char",
        "karpathy/nanoGPT",
        "train.py",
        ("train.py", "model.py", "configurator.py", "config"),
        quick=True,
        args=(
            "config/train_shakespeare_char.py",
            "--device=cpu",
            "--compile=False",
            "--dtype=float32",
            "--eval_iters=2",
            "--eval_interval=10",
            "--log_interval=2",
            "--block_size=16",
            "--batch_size=4",
            "--n_layer=2",
            "--n_head=2",
            "--n_embd=32",
            "--max_iters=30",
            "--lr_decay_iters=30",
            "--warmup_iters=5",
            "--dropout=0.0",
        ),
        subs=(
            ("train.py", "dt*1000:.2f", "0*dt:.2f"),
            ("train.py", "running_mfu*100:.2f", "0*running_mfu:.2f"),
        ),
        data=_shakespeare_bins,
    ),
    Script(
        "mingpt-chargpt",
        "karpathy/minGPT",
        "projects/chargpt/chargpt.py",
        ("projects/chargpt", "mingpt"),
        args=(
            "--trainer.max_iters=40",
            "--trainer.num_workers=0",
            "--trainer.batch_size=8",
            "--model.model_type=None",
            "--model.n_layer=2",
            "--model.n_head=2",
            "--model.n_embd=32",
            "--data.block_size=32",
        ),
        subs=(
            (
                "projects/chargpt/chargpt.py",
                "trainer.iter_dt * 1000:.2f",
                "0 * trainer.iter_dt:.2f",
            ),
            ("projects/chargpt/chargpt.py", "model.generate(x, 500,", "model.generate(x, 20,"),
        ),
        # the training loop is minGPT's Trainer.run, in the library: the user's probe goes in the
        # script's per-batch callback
        anchors=(("def batch_end_callback(trainer):", "inner"),),
        pythonpath=(".",),
        data=_chargpt_input,
    ),
    Script(
        "makemore-names",
        "karpathy/makemore",
        "makemore.py",
        ("makemore.py",),
        quick=True,
        args=(
            "--max-steps",
            "60",
            "--num-workers",
            "0",
            "--n-layer",
            "2",
            "--n-head",
            "2",
            "--n-embd",
            "32",
            "--n-embd2",
            "32",
            "--batch-size",
            "16",
        ),
        subs=(
            ("makemore.py", "(t1-t0)*1000:.2f", "0*(t1-t0):.2f"),
            ("makemore.py", "step % 500 == 0", "step % 20 == 0"),
            ("makemore.py", "step > 0 and step % 200 == 0", "step > 0 and step % 50 == 0"),
        ),
        needs=("tensorboard",),
        data=_names,
    ),
]

_TUTORIALS: list[tuple[str, str, tuple[tuple[str, str], ...], Writer | None, bool]] = [
    (
        "feedforward_neural_network",
        T1,
        (("num_epochs = 5", "num_epochs = 3"), ("hidden_size = 500", "hidden_size = 64")),
        None,
        True,
    ),
    ("linear_regression", T1, (("num_epochs = 60", "num_epochs = 20"),), None, False),
    ("logistic_regression", T1, (("num_epochs = 5", "num_epochs = 3"),), None, False),
    (
        "bidirectional_recurrent_neural_network",
        T2,
        (("num_epochs = 2", "num_epochs = 3"), ("hidden_size = 128", "hidden_size = 16")),
        None,
        False,
    ),
    ("convolutional_neural_network", T2, (("num_epochs = 5", "num_epochs = 3"),), None, True),
    ("deep_residual_network", T2, (("num_epochs = 80", "num_epochs = 3"),), None, False),
    (
        "language_model",
        T2,
        (
            ("num_epochs = 5", "num_epochs = 3"),
            ("hidden_size = 1024", "hidden_size = 32"),
            ("num_samples = 1000", "num_samples = 50"),
        ),
        _tutorial_text,
        False,
    ),
    (
        "recurrent_neural_network",
        T2,
        (("num_epochs = 2", "num_epochs = 3"), ("hidden_size = 128", "hidden_size = 16")),
        None,
        False,
    ),
    (
        "generative_adversarial_network",
        T3,
        (
            ("num_epochs = 200", "num_epochs = 3"),
            ("hidden_size = 256", "hidden_size = 32"),
            # it reshapes every batch to batch_size rows: the synthetic set holds 256 images
            ("batch_size = 100", "batch_size = 64"),
        ),
        None,
        False,
    ),
    ("variational_autoencoder", T3, (("num_epochs = 15", "num_epochs = 3"),), None, False),
]
for _name, _sub, _extra, _data, _quick in _TUTORIALS:
    _path = f"{_sub}/{_name}/main.py"
    CORPUS.append(
        Script(
            f"tutorial-{_name}",
            TUT,
            _path,
            (f"{_sub}/{_name}",),
            subs=tuple((_path, a, b) for a, b in _extra),
            seed=True,
            data=_data,
            quick=_quick,
            model={"generative_adversarial_network": "D", "variational_autoencoder": "model"}.get(
                _name, "model"
            ),
        )
    )


# -- export and shrink ---------------------------------------------------------------------------


def mirror(mirrors: Path, repo: str) -> Path:
    return mirrors / repo.replace("/", "+") / "repo"


def git(gitdir: Path, *args: str) -> bytes:
    return subprocess.run(
        ["git", f"--git-dir={gitdir}", *args], check=True, capture_output=True
    ).stdout


def export(gitdir: Path, prefixes: tuple[str, ...], dest: Path) -> tuple[str, list[str]]:
    """The files under ``prefixes`` at HEAD, written under ``dest``; the commit, and the files
    the snapshot lacks (large files are left out of snapshots: the harness writes data instead)."""
    commit = git(gitdir, "rev-parse", "HEAD").decode().strip()
    missing = []
    for line in git(gitdir, "ls-tree", "-r", "-z", "HEAD", "--", *prefixes).split(b"\0"):
        if not line:
            continue
        meta, path = line.decode().split("\t", 1)
        _, kind, sha = meta.split()
        if kind != "blob":
            continue
        p = subprocess.run(
            ["git", f"--git-dir={gitdir}", "cat-file", "blob", sha], capture_output=True
        )
        if p.returncode != 0:
            missing.append(path)
            continue
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(p.stdout)
    return commit, missing


def shrink(s: Script, root: Path) -> None:
    for rel, old, new in s.subs:
        f = root / rel
        text = f.read_text()
        if old not in text:
            raise ValueError(f"{rel}: substitution anchor not found: {old!r}")
        f.write_text(text.replace(old, new))
    if s.seed:
        f = root / s.path
        lines = f.read_text().splitlines(keepends=True)
        i = next(i for i, ln in enumerate(lines) if re.match(r"import torch\b", ln))
        lines.insert(i + 1, "torch.manual_seed(0)\n")
        f.write_text("".join(lines))
    if s.data is not None:
        s.data((root / s.path).parent)


# -- running -------------------------------------------------------------------------------------


@dataclass
class Proc:
    code: int
    out: str
    err: str
    wall_s: float

    def brief(self) -> dict[str, Any]:
        return {"code": self.code, "wall_s": round(self.wall_s, 3), "stderr_tail": tail(self.err)}


def tail(text: str, n: int = 6) -> list[str]:
    return [ln[:300] for ln in text.strip().splitlines()[-n:]]


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> Proc:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        return Proc(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return Proc(
            -9, out, err + f"\n(timed out after {TIMEOUT_S:.0f} s)", time.perf_counter() - t0
        )


def probe_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("PROBE")]


def first_difference(a: str, b: str) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"line {i + 1}: {x[:160]!r} vs {y[:160]!r}"
    return f"lengths {len(la)} vs {len(lb)} lines"


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def flortrain_traceback(err: str, plain_err: str) -> str | None:
    """A traceback the plain run did not print: its last frame (flortrain's, or the script's
    when flortrain made the script fail), else None."""
    if (
        "Traceback (most recent call last)" not in err
        or "Traceback (most recent call last)" in plain_err
    ):
        return None
    frames = [m for ln in err.splitlines() if (m := _FRAME.match(ln))]
    last = err.strip().splitlines()[-1][:300]
    ours = [m for m in frames if "/flortrain/" in m.group("file")]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    at = f"{where.group('file')}:{where.group('line')}" if where else "?"
    return f"{last} (at {at}{'' if ours else ', no flortrain frame'})"


# -- the plan and where the probes go ----------------------------------------------------------

_MAIN = re.compile(
    r"^(?P<path>\S+):(?P<line>\d+):(?P<col>\d+) main loop (?P<id>\S+) \((?P<kind>\w+)\) in (?P<fn>\S+)(?:: (?P<why>.*))?$"
)
_BLOCK = re.compile(
    r"^\s+(?P<path>\S+):(?P<line>\d+):(?P<col>\d+) memoized (?P<kind>\w+) loop (?P<id>\S+) in (?P<fn>\S+)$"
)
_REFUSED = re.compile(
    r"^\s+(?P<path>\S+):(?P<line>\d+):(?P<col>\d+) refused loop in (?P<fn>\S+): (?P<why>.*)$"
)
_OTHER = re.compile(
    r"^(?P<path>\S+):(?P<line>\d+):(?P<col>\d+) loop in (?P<fn>\S+) not memoized: (?P<why>.*)$"
)
_NOSPAN = re.compile(r"^\s+no iteration spans: (?P<why>.*)$")
_CHANGE = re.compile(r"^\s+changeset: (?P<c>.*)$")


def parse_plan(text: str) -> list[dict[str, Any]]:
    """``--explain`` as a list of loops: kind main | memoized | refused | plain, with the reason."""
    loops: list[dict[str, Any]] = []
    for ln in text.splitlines():
        if m := _MAIN.match(ln):
            loops.append(
                {
                    "kind": "main",
                    "path": m["path"],
                    "line": int(m["line"]),
                    "id": m["id"],
                    "function": m["fn"],
                    "why": m["why"] or "",
                    "spans": True,
                }
            )
        elif m := _BLOCK.match(ln):
            loops.append(
                {
                    "kind": "memoized",
                    "path": m["path"],
                    "line": int(m["line"]),
                    "id": m["id"],
                    "function": m["fn"],
                    "changeset": [],
                }
            )
        elif m := _REFUSED.match(ln):
            loops.append(
                {
                    "kind": "refused",
                    "path": m["path"],
                    "line": int(m["line"]),
                    "function": m["fn"],
                    "why": m["why"],
                }
            )
        elif m := _OTHER.match(ln):
            loops.append(
                {
                    "kind": "plain",
                    "path": m["path"],
                    "line": int(m["line"]),
                    "function": m["fn"],
                    "why": m["why"],
                }
            )
        elif (m := _NOSPAN.match(ln)) and loops:
            main = next(lp for lp in reversed(loops) if lp["kind"] == "main")
            main["spans"] = False
            main["why_no_spans"] = m["why"]
        elif (m := _CHANGE.match(ln)) and loops and loops[-1]["kind"] == "memoized":
            loops[-1]["changeset"].append(m["c"])
    return loops


def _loop_at(tree: ast.AST, line: int) -> ast.For | ast.While | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.While) and node.lineno == line:
            return node
    return None


def _trains(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr in {"backward", "step"} for n in ast.walk(node)
    )


def locate(text: str, script: str, loops: list[dict[str, Any]]) -> dict[str, tuple[int, int, bool]]:
    """Where each probe goes in ``text``: kind -> (line, column, after), ``after`` meaning after
    that line's statement (else before it). The outer probe ends the script's main loop's body
    (before a closing ``break``/``continue``); the inner one starts the body of the memoized loop
    that trains (else the first memoized loop) inside it."""
    tree = ast.parse(text)
    mine = [lp for lp in loops if Path(lp["path"]).name == Path(script).name]
    where: dict[str, tuple[int, int, bool]] = {}
    main = next((lp for lp in mine if lp["kind"] == "main"), None)
    if main is not None and (node := _loop_at(tree, main["line"])) is not None:
        last = node.body[-1]
        if isinstance(last, ast.Break | ast.Continue | ast.Return | ast.Raise):
            where["outer"] = (last.lineno, last.col_offset, False)
        else:
            where["outer"] = (last.end_lineno or last.lineno, node.body[0].col_offset, True)
    blocks = [
        n
        for lp in mine
        if lp["kind"] == "memoized" and (n := _loop_at(tree, lp["line"])) is not None
    ]
    if not blocks and main is not None and (node := _loop_at(tree, main["line"])) is not None:
        blocks = [n for n in ast.walk(node) if isinstance(n, ast.For | ast.While) and n is not node]
    if blocks:
        inner = next((b for b in blocks if _trains(b)), blocks[0])
        first = inner.body[0]
        if first.lineno > inner.lineno:
            where["inner"] = (first.lineno, first.col_offset, False)
    return where


def anchored(text: str, anchor: str) -> tuple[int, int, bool] | None:
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip() == anchor:
            nxt = next((x for x in lines[i + 1 :] if x.strip()), "")
            indent = (
                len(nxt) - len(nxt.lstrip())
                if ln.rstrip().endswith(":")
                else len(ln) - len(ln.lstrip())
            )
            return i + 1, indent, True
    return None


def with_probe(text: str, at: tuple[int, int, bool], stmt: str) -> str:
    lines = text.splitlines(keepends=True)
    line, col, after = at
    i = line if after else line - 1
    if i > 0 and not lines[i - 1].endswith("\n"):  # a file without a final newline
        lines[i - 1] += "\n"
    lines.insert(i, " " * col + stmt + "\n")
    return "".join(lines)


# -- the store -----------------------------------------------------------------------------------


def store_report(store: Path, run_id: int) -> dict[str, Any]:
    """Per block id of the run: instances by state, and the notes of those not checkpointed."""
    db = sqlite3.connect(store / "flortrain.db")
    try:
        blocks: dict[str, dict[str, Any]] = {}
        for block_id, state, note, n in db.execute(
            "SELECT block_id, state, COALESCE(note, ''), COUNT(*) FROM blocks WHERE run_id=? GROUP BY block_id, state, note",
            (run_id,),
        ):
            b = blocks.setdefault(block_id, {"states": {}, "notes": {}})
            b["states"][state] = b["states"].get(state, 0) + n
            if note:
                b["notes"][note[:300]] = b["notes"].get(note[:300], 0) + n
        iterations = dict(
            db.execute(
                "SELECT main_id, COUNT(*) FROM iterations WHERE run_id=? GROUP BY main_id",
                (run_id,),
            ).fetchall()
        )
        (meta,) = db.execute("SELECT meta FROM runs WHERE id=?", (run_id,)).fetchone()
        return {"blocks": blocks, "iterations": iterations, "meta_keys": sorted(json.loads(meta))}
    finally:
        db.close()


def latest_run(store: Path, kind: str) -> int | None:
    if not (store / "flortrain.db").exists():
        return None
    db = sqlite3.connect(store / "flortrain.db")
    try:
        row = db.execute("SELECT MAX(id) FROM runs WHERE kind=?", (kind,)).fetchone()
        return int(row[0]) if row and row[0] is not None else None
    finally:
        db.close()


def memo_report(
    loops: list[dict[str, Any]], store: dict[str, Any] | None, record_err: str
) -> list[dict[str, Any]]:
    """Every loop of the plan: memoized (some instance checkpointed) or not, and why not."""
    warnings = [
        ln.strip()
        for ln in record_err.splitlines()
        if "not checkpointed" in ln or "unavailable" in ln or ln.startswith("flortrain: main loop ")
    ]
    out = []
    blocks = (store or {}).get("blocks", {})
    for lp in loops:
        row = {k: lp[k] for k in ("kind", "path", "line", "function") if k in lp} | {
            "id": lp.get("id", "")
        }
        if lp["kind"] == "main":
            # a main loop is memoized when its iterations can be jumped: boundary checkpoints
            seen = blocks.get(lp["id"], {}).get("states", {})
            said = [
                w.split(": ", 2)[-1]
                for w in warnings
                if w.startswith(f"flortrain: main loop {lp['id']}: ")
            ]
            n = seen.get("boundary", 0)
            why = ""
            if not lp["spans"]:
                why = lp.get("why_no_spans", "")
            elif n == 0:
                why = said[0] if said else "the adaptive period took no boundary checkpoint"
            row |= {
                "boundaries": n,
                "iterations": (store or {}).get("iterations", {}).get(lp["id"], 0),
                "memoized": n > 0,
                "why": why,
            }
        elif lp["kind"] == "memoized":
            seen = blocks.get(lp["id"], {}).get("states", {})
            notes = blocks.get(lp["id"], {}).get("notes", {})
            ck = seen.get("checkpointed", 0)
            why = ""
            if ck == 0:
                mine = [w for w in warnings if f"block {lp['id']} " in w]
                if notes:
                    why = "; ".join(f"{n} (x{c})" for n, c in notes.items())
                elif mine:
                    why = mine[0]
                elif sum(seen.values()) == 0:
                    why = "no instance ran"
                else:
                    why = "the adaptive period checkpointed no instance"
            row |= {
                "instances": sum(seen.values()),
                "checkpointed": ck,
                "memoized": ck > 0,
                "why": why,
                "changeset": lp["changeset"],
                "notes": notes,
            }
        else:
            row |= {"memoized": False, "why": lp["why"]}
        out.append(row)
    return out


# -- the protocol --------------------------------------------------------------------------------


@dataclass
class Env:
    python: str
    mirrors: Path
    site: list[str]
    jobs_too: bool
    base_env: dict[str, str] = field(default_factory=dict)


def script_env(env: Env, s: Script, root: Path) -> dict[str, str]:
    parts = [
        str(SHIM),
        *(str(root / p) for p in s.pythonpath),
        os.environ.get("PYTHONPATH", ""),
        *env.site,
    ]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in parts if p),
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TQDM_DISABLE": "1",
    }


def replay_verdict(truth: Proc, rep: Proc, diff: Proc | None) -> dict[str, Any]:
    """exact | wrong | refused | traceback, and what the replay's and diff's exits said."""
    tb = flortrain_traceback(rep.err, truth.err)
    want, got = probe_lines(truth.out), probe_lines(rep.out)
    same = want == got and rep.code == truth.code
    if tb:
        verdict = "traceback"
    elif same:
        verdict = "exact"
    elif rep.code == 0 or rep.code == truth.code:
        verdict = "wrong"
    else:
        verdict = "refused"
    v: dict[str, Any] = {
        "verdict": verdict,
        "probe_lines": len(want),
        "replay": rep.brief(),
        "stdout_equal": rep.out == truth.out,
    }
    if not same:
        v["symptom"] = (
            f"exit {rep.code} vs python's {truth.code}; probe lines {len(got)} vs {len(want)}"
            + (
                ""
                if want == got
                else f"; first difference {first_difference(chr(10).join(got), chr(10).join(want))}"
            )
        )
    if tb:
        v["traceback"] = tb
    if verdict == "refused":
        v["reason"] = tail(rep.err, 1)[0] if rep.err.strip() else f"exit {rep.code}"
    warned = [
        ln
        for ln in rep.err.splitlines()
        if re.search(r"differ|unfaithful|not faithful|mismatch", ln, re.I)
    ]
    if warned:
        v["warnings"] = warned[:5]
    if diff is not None:
        v["diff"] = diff.brief() | {"stdout_tail": tail(diff.out)}
        v["diff_agrees"] = (diff.code == 0) == same
    return v


def run_script(s: Script, env: Env, keep: Path | None) -> dict[str, Any]:
    res: dict[str, Any] = {"name": s.name, "repo": s.repo, "path": s.path, "args": list(s.args)}
    if s.skip:
        return res | {"status": "skipped", "reason": s.skip}
    gitdir = mirror(env.mirrors, s.repo)
    if not gitdir.exists():
        return res | {
            "status": "skipped",
            "reason": f"no snapshot at {gitdir} (fetch github:{s.repo})",
        }
    tmp = Path(tempfile.mkdtemp(prefix=f"corpus-{s.name}-"))
    try:
        base = tmp / "base"
        base.mkdir()
        commit, missing = export(gitdir, s.export, base)
        res |= {"commit": commit, "missing_in_snapshot": missing}
        shrink(s, base)
        e = script_env(env, s, base)
        for mod in s.needs:
            if run([env.python, "-c", f"import {mod}"], base, e).code != 0:
                return res | {
                    "status": "skipped",
                    "reason": f"needs {mod} (give --site DIR holding it)",
                }
        for prep in s.prepare:
            p = run([env.python, Path(prep).name], (base / prep).parent, e)
            if p.code != 0:
                return res | {"status": "error", "reason": f"{prep} failed: {tail(p.err, 1)}"}
        return res | protocol(s, env, tmp, base, e, keep)
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def fresh(tmp: Path, base: Path, name: str) -> Path:
    d = tmp / name
    shutil.copytree(base, d, symlinks=True)
    return d


def protocol(
    s: Script, env: Env, tmp: Path, base: Path, e: dict[str, str], keep: Path | None
) -> dict[str, Any]:
    rel = Path(s.path)
    py, ft = [env.python], [env.python, "-m", "flortrain"]
    times: dict[str, float] = {}
    out: dict[str, Any] = {"times": times}

    def plain(tag: str, text: str | None = None) -> Proc:
        d = fresh(tmp, base, tag)
        if text is not None:
            (d / rel).write_text(text)
        p = run([*py, rel.name, *s.args], (d / rel).parent, e)
        times[tag] = p.wall_s
        return p

    truth = plain("plain")
    again = plain("plain2")
    out["plain"] = truth.brief()
    if (truth.out, truth.code) != (again.out, again.code):
        return out | {
            "status": "nondeterministic",
            "reason": f"two plain runs differ: {first_difference(truth.out, again.out)} (exit {truth.code}, {again.code})",
        }
    if truth.code != 0:  # the harness's shrinking is wrong, or the script needs what is not here
        return out | {
            "status": "error",
            "reason": f"the plain run exits {truth.code}: {tail(truth.err, 1)}",
        }
    work = fresh(tmp, base, "work")
    wd = (work / rel).parent
    store = wd / ".flortrain"
    explain = run([*ft, "instrument", "--explain", rel.name], wd, e)
    loops = parse_plan(explain.out)
    out["explain"] = explain.out.splitlines() + tail(explain.err, 3)
    rec = run([*ft, "record", rel.name, *s.args], wd, e)
    times["record"] = rec.wall_s
    record: dict[str, Any] = rec.brief() | {
        "stdout_equal": rec.out == truth.out,
        "exit_equal": rec.code == truth.code,
    }
    if rec.out != truth.out:
        record["symptom"] = first_difference(rec.out, truth.out)
    if tb := flortrain_traceback(rec.err, truth.err):
        record["traceback"] = tb
    record["warnings"] = [ln for ln in rec.err.splitlines() if ln.startswith("flortrain")][:40]
    out["record"] = record
    rid = latest_run(store, "record")
    st = store_report(store, rid) if rid is not None else None
    out["store"] = st
    out["loops"] = memo_report(loops, st, rec.err)
    if rec.code != truth.code or rid is None:
        return out | {"status": "record-failed"}
    original = (work / rel).read_text()
    where = locate(original, s.path, loops)
    for anchor, kind in s.anchors:
        if (at := anchored(original, anchor)) is not None:
            where[kind] = at
    out["probes"] = {}
    for kind in ("outer", "inner"):
        if kind not in where:
            out["probes"][kind] = {
                "verdict": "none",
                "reason": "no place for this probe (no main loop in the script)",
            }
            continue
        model = (s.inner_model or s.model) if kind == "inner" else s.model
        probed = with_probe(original, where[kind], PROBE.format(kind=kind, model=model))
        gt = plain(f"plain-{kind}", probed)
        pk: dict[str, Any] = {
            "at_line": where[kind][0],
            "plain": gt.brief(),
            "probe_lines": len(probe_lines(gt.out)),
        }
        if gt.code != truth.code or not probe_lines(gt.out):
            pk |= {
                "verdict": "bad-probe",
                "reason": f"python S' exits {gt.code}, {len(probe_lines(gt.out))} probe lines: {tail(gt.err, 1)}",
            }
            out["probes"][kind] = pk
            continue
        (work / rel).write_text(probed)
        variants: list[tuple[str, list[str]]] = [("serial", [])] + (
            [("jobs2", ["--jobs", "2"])] if env.jobs_too else []
        )
        for tag, extra in variants:
            rep = run([*ft, "replay", *extra, rel.name], wd, e)
            times[f"replay-{kind}-{tag}"] = rep.wall_s
            dif = run([*ft, "diff"], wd, e) if rep.code == 0 else None
            pk[tag] = replay_verdict(gt, rep, dif)
            pk[tag]["plan"] = [ln for ln in rep.err.splitlines() if ln.startswith("flortrain:")][
                :30
            ]
        (work / rel).write_text(original)
        out["probes"][kind] = pk
    if keep is not None:
        shutil.copytree(tmp, keep / s.name, dirs_exist_ok=True)
    return out | {"status": "ran"}


# -- the report ----------------------------------------------------------------------------------


def failures(r: dict[str, Any]) -> list[str]:
    """The script's failures, worst first, one line each."""
    out = []
    rec = r.get("record", {})
    if r.get("status") == "nondeterministic":
        out.append(f"nondeterministic ground truth: {r['reason']}")
    if rec.get("traceback"):
        out.append(f"traceback (record): {rec['traceback']}")
    if rec and not rec.get("stdout_equal", True):
        out.append(f"wrong (record stdout): {rec.get('symptom')}")
    for kind, pk in r.get("probes", {}).items():
        for tag in ("serial", "jobs2"):
            v = pk.get(tag)
            if not v:
                continue
            if v["verdict"] != "exact":
                detail = v.get("traceback") or v.get("reason") or v.get("symptom", "")
                out.append(f"{v['verdict']} ({kind} {tag}): {detail}")
            elif v.get("diff") and v["diff"]["code"] != 0:
                out.append(
                    f"false alarm ({kind} {tag}): diff exits {v['diff']['code']}: {(v['diff']['stderr_tail'] or v['diff'].get('stdout_tail') or [''])[-1]}"
                )
            elif v.get("warnings"):
                out.append(f"false alarm ({kind} {tag}): {v['warnings'][0][:200]}")
    return out


def ratio(r: dict[str, Any], kind: str, tag: str) -> float | None:
    t = r.get("times", {})
    a, b = t.get(f"replay-{kind}-{tag}"), t.get(f"plain-{kind}")
    return a / b if a and b else None


def table(results: list[dict[str, Any]]) -> str:
    head = f"{'script':40} {'status':16} {'plain':>6} {'rec':>6} {'memo':>6} {'outer':>12} {'inner':>12}  failures"
    rows = [head, "-" * len(head)]
    for r in results:
        t = r.get("times", {})
        blocks = [lp for lp in r.get("loops", []) if lp["kind"] in ("memoized", "refused")]
        memo = f"{sum(lp['memoized'] for lp in blocks)}/{len(blocks)}" if blocks else "-"
        cells = []
        for kind in ("outer", "inner"):
            pk = r.get("probes", {}).get(kind, {})
            v = pk.get("serial")
            rt = ratio(r, kind, "serial")
            cells.append(
                f"{v['verdict'][:5]} {rt:.2f}x" if v and rt else pk.get("verdict", "-")[:12]
            )
        status = r.get("status", "")
        if status == "ran":
            status = "ok" if not failures(r) else "FAIL"
        f = failures(r)
        rows.append(
            f"{r['name']:40} {status:16} {t.get('plain', 0):6.1f} {t.get('record', 0):6.1f} {memo:>6} {cells[0]:>12} {cells[1]:>12}  "
            + (f[0][:120] if f else r.get("reason", "")[:120])
        )
    return "\n".join(rows)


def memo_lines(results: list[dict[str, Any]]) -> str:
    """Every loop not memoized, with its reason: loops the plan memoizes that no instance was
    checkpointed of, loops it refused, main loops without iteration spans, and plain loops."""
    out = []
    for r in results:
        for lp in r.get("loops", []):
            if lp["memoized"]:
                continue
            what = {
                "main": "main loop, no boundary checkpoint",
                "memoized": "memoized, 0 checkpointed",
                "refused": "refused",
                "plain": "plain",
            }[lp["kind"]]
            out.append(
                f"{r['name']}: {lp['path']}:{lp['line']} {lp.get('id', '')} ({lp['function']}) {what}: {lp['why']}"
            )
    return "\n".join(out)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in results if r.get("status") == "ran"]
    if not ran:
        return
    series = [
        (k, t)
        for k in ("outer", "inner")
        for t in ("serial", "jobs2")
        if any(ratio(r, k, t) for r in ran)
    ]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.55 * len(ran) + 3), 5))
    width = 0.8 / max(1, len(series))
    colors = {
        "outer-serial": "#2a7ab0",
        "outer-jobs2": "#86c0e8",
        "inner-serial": "#c0602a",
        "inner-jobs2": "#eab48c",
    }
    for i, (kind, tag) in enumerate(series):
        xs, ys, bad = [], [], []
        for j, r in enumerate(ran):
            rt = ratio(r, kind, tag)
            if rt is None:
                continue
            x = j + (i - (len(series) - 1) / 2) * width
            xs.append(x)
            ys.append(rt)
            v = r["probes"][kind][tag]
            if v["verdict"] != "exact":
                bad.append((x, rt, v["verdict"]))
            elif v.get("diff", {}).get("code", 0) != 0:
                bad.append((x, rt, "false-alarm"))
        ax.bar(
            xs,
            ys,
            width,
            label=f"{kind} probe, {'--jobs 2' if tag == 'jobs2' else 'serial'}",
            color=colors[f"{kind}-{tag}"],
        )
        for x, y, verdict in bad:
            marker, color = {"wrong": ("x", "red"), "false-alarm": ("^", "darkorange")}.get(
                verdict, ("o", "black")
            )
            ax.plot([x], [y + 0.05], marker=marker, color=color, ms=8)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(ran)))
    ax.set_xticklabels(
        [r["name"].replace("tutorial-", "t-").replace("examples-", "ex-") for r in ran],
        rotation=60,
        ha="right",
        fontsize=8,
    )
    ax.set_ylabel("replay wall time / python S' wall time")
    ax.set_title(
        "replay / plain run of the probed script (x: wrong answer; o: refused or traceback; ^: diff exits 1 on a right answer)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a handful of scripts")
    ap.add_argument(
        "--only", nargs="+", metavar="NAME", help="these scripts (names, or parts of them)"
    )
    ap.add_argument(
        "--jobs-too", action="store_true", help="replay each probe with --jobs 2 as well"
    )
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter for python S and python -m flortrain",
    )
    ap.add_argument(
        "--mirrors",
        type=Path,
        default=Path("/work/.mirror"),
        help="where the fetched snapshots are",
    )
    ap.add_argument(
        "--site",
        action="append",
        default=[],
        help="a directory of extra packages, last on PYTHONPATH",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="replace these scripts' entries in corpus.json instead of writing corpus-quick.json",
    )
    ap.add_argument("--keep", type=Path, help="keep each script's directories here (for debugging)")
    ap.add_argument(
        "--report",
        action="store_true",
        help="recompute the table, the loops' report and the figure from corpus.json, running nothing",
    )
    ap.add_argument("--list", action="store_true", help="list the corpus and exit")
    a = ap.parse_args()
    if a.list:
        for s in CORPUS:
            print(
                f"{s.name:45} {s.repo}:{s.path}"
                + (f"  (skipped: {s.skip})" if s.skip else "")
                + ("  [quick]" if s.quick else "")
            )
        return
    if a.report:
        doc = json.loads((OUT / "corpus.json").read_text())
        for r in doc["results"]:
            if "explain" in r and "record" in r:
                loops = parse_plan("\n".join(r["explain"]))
                r["loops"] = memo_report(loops, r.get("store"), "\n".join(r["record"]["warnings"]))
        text = table(doc["results"])
        doc["table"] = text.splitlines()
        doc["not_memoized"] = memo_lines(doc["results"]).splitlines()
        print(text + "\n\nloops not memoized:\n" + memo_lines(doc["results"]))
        (OUT / "corpus.json").write_text(json.dumps(doc, indent=1) + "\n")
        plot(doc["results"], OUT / "corpus.png")
        return
    chosen = [
        s
        for s in CORPUS
        if (not a.quick or s.quick) and (not a.only or any(o in s.name for o in a.only))
    ]
    env = Env(a.python, a.mirrors, [str(Path(p).resolve()) for p in a.site], a.jobs_too)
    results = []
    for s in chosen:
        t0 = time.perf_counter()
        print(f"-- {s.name}", file=sys.stderr, flush=True)
        try:
            r = run_script(s, env, a.keep)
        except Exception as e:  # the harness's own failure on one script must not lose the others
            r = {
                "name": s.name,
                "repo": s.repo,
                "path": s.path,
                "status": "error",
                "reason": f"{type(e).__name__}: {e}",
            }
        r["harness_s"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        print(table([r]).splitlines()[-1], file=sys.stderr, flush=True)
    suffix = "-quick" if (a.quick or a.only) and not a.merge else ""
    if a.merge and (OUT / "corpus.json").exists():
        earlier = {r["name"]: r for r in json.loads((OUT / "corpus.json").read_text())["results"]}
        earlier |= {r["name"]: r for r in results}
        order = [s.name for s in CORPUS]
        results = sorted(
            earlier.values(),
            key=lambda r: order.index(r["name"]) if r["name"] in order else len(order),
        )
    text = table(results)
    print(text)
    print("\nloops not memoized:")
    print(memo_lines(results))
    OUT.mkdir(parents=True, exist_ok=True)
    versions = subprocess.run(
        [
            a.python,
            "-c",
            "import torch, flortrain, sys; print(torch.__version__, sys.version.split()[0])",
        ],
        capture_output=True,
        text=True,
    ).stdout.split()
    flortrain_commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": versions[:1],
        "python": versions[1:],
        "flortrain_commit": flortrain_commit,
        "jobs_too": a.jobs_too,
        "results": results,
        "table": text.splitlines(),
        "not_memoized": memo_lines(results).splitlines(),
    }
    (OUT / f"corpus{suffix}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(results, OUT / f"corpus{suffix}.png")
    print(f"wrote {OUT / f'corpus{suffix}.json'} and .png", file=sys.stderr)


if __name__ == "__main__":
    main()
