"""The built wheel, installed into a fresh virtual environment with nothing but its own
dependencies (libcst, click, xxhash, from the package registry): ``flortrain check`` runs there,
with no torch or numpy to import, and finds what it finds in this tree. One wheel and one
environment for the file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.packaged import ROOT, clean_env, make_venv, package_copy, sh

WARNED = "import os\nfor name in os.listdir('.'):\n    print(name)\n"
BROKEN = "import random\nfor i in range(3)\n    print(random.random())\n"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    src = package_copy(base / "src")
    env = clean_env()
    built = sh(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(base / "dist"), str(src)],
        base,
        env,
    )
    assert built.returncode == 0, built.stdout
    (wheel,) = (base / "dist").glob("flortrain-*.whl")
    python = make_venv(base / "venv")
    done = sh([str(python), "-m", "pip", "install", "-q", str(wheel)], base, env)
    assert done.returncode == 0, done.stdout
    return python.parent


def _check(venv: Path, cwd: Path, *args: str) -> tuple[int, str]:
    done = sh([str(venv / "flortrain"), "check", *args], cwd, clean_env())
    return done.returncode, done.stdout


def test_neither_torch_nor_numpy_is_installed(venv: Path, tmp_path: Path) -> None:
    for name in ("torch", "numpy"):
        done = sh([str(venv / "python"), "-c", f"import {name}"], tmp_path, clean_env())
        assert done.returncode == 1 and f"No module named '{name}'" in done.stdout, done.stdout
    done = sh(
        [str(venv / "python"), "-c", "import flortrain; print(flortrain.__file__)"],
        tmp_path,
        clean_env(),
    )
    assert done.stdout.startswith(str(venv.parent)), (
        done.stdout
    )  # the installed copy, not this tree


def test_the_installed_check_finds_what_this_tree_finds(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "listing.py").write_text(WARNED)
    (tmp_path / "broken.py").write_text(BROKEN)
    code, out = _check(venv, tmp_path, "listing.py")
    assert code == 0 and "listing.py:2:13: DET101 " in out, out
    code, out = _check(venv, tmp_path)  # the directory: both files, one of them an error
    assert code == 1 and "broken.py:2:" in out and "CHK001" in out and "DET101" in out, out
    # every rule, on a real training script, with no torch to lean on
    code, out = _check(venv, tmp_path, str(ROOT / "fixtures" / "realcode" / "nanogpt.py"))
    assert code in (0, 1) and "Traceback" not in out, out
