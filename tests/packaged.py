"""This package as its users get it: a copy of what it ships (no tests, no fixtures, no torch),
as a git repository pre-commit can clone, and as a built wheel. Copied from the tree under test,
so uncommitted changes are what is tested, from a clone or an unpacked sdist alike."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("pyproject.toml", "README.md", "LICENSE", ".pre-commit-hooks.yaml")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a tool run as a user would: no PYTHONPATH (which would import this tree
    instead of what was installed), no user or system git configuration, a fixed git identity."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    env.update(extra)
    return env


def sh(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``cmd`` in ``cwd``, stdout and stderr together in ``.stdout``."""
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def package_copy(into: Path) -> Path:
    """What the package ships, copied into ``into``."""
    into.mkdir(parents=True)
    for name in SHIPPED:
        shutil.copy(ROOT / name, into / name)
    shutil.copytree(
        ROOT / "flortrain",
        into / "flortrain",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return into


def package_repo(into: Path) -> tuple[Path, str]:
    """A git repository of the package's shipped files, committed; and its commit."""
    env = clean_env()
    repo = package_copy(into)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "flortrain"]):
        done = sh(cmd, repo, env)
        assert done.returncode == 0, done.stdout
    head = sh(["git", "rev-parse", "HEAD"], repo, env).stdout.strip()
    return repo, head


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def make_venv(venv: Path) -> Path:
    """A fresh virtual environment (no system site-packages: no torch), its python returned."""
    done = sh([sys.executable, "-m", "venv", str(venv)], venv.parent, clean_env())
    assert done.returncode == 0, done.stdout
    return venv_python(venv)
