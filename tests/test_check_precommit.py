"""The pre-commit hook, with the real pre-commit: installed from this repository into a project,
it refuses a commit whose script has an error-level finding, showing the finding, and lets the
fixed script through; ``pre-commit try-repo`` runs it too. pre-commit builds the hook's
environment from this package alone (pip, from the package registry), so the hook runs with no
torch installed. One environment is built for the file (``pre-commit try-repo`` builds its own
in a temporary store, which pre-commit gives it)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.packaged import clean_env, package_repo, sh

#: a script that does not parse: CHK001, an error
BROKEN = "import random\nfor i in range(3)\n    print(random.random())\n"
FIXED = "import random\nrandom.seed(0)\nfor i in range(3):\n    print(random.random())\n"
#: an unsorted listing: DET101, a warning, which does not stop a commit
WARNED = "import os\nfor name in os.listdir('.'):\n    print(name)\n"


class Project:
    def __init__(self, path: Path, env: dict[str, str], hooks_repo: Path) -> None:
        self.path, self.env, self.hooks_repo = path, env, hooks_repo

    def git(self, *args: str) -> tuple[int, str]:
        done = sh(["git", *args], self.path, self.env)
        return done.returncode, done.stdout

    def pre_commit(self, *args: str) -> tuple[int, str]:
        done = sh([sys.executable, "-m", "pre_commit", *args], self.path, self.env)
        return done.returncode, done.stdout

    def commit(self, name: str, text: str) -> tuple[int, str]:
        (self.path / name).write_text(text)
        code, out = self.git("add", name)
        assert code == 0, out
        return self.git("commit", "-qm", f"{name}")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    base = tmp_path_factory.mktemp("precommit")
    hooks_repo, rev = package_repo(base / "flortrain")
    env = clean_env(PRE_COMMIT_HOME=str(base / "cache"))
    path = base / "project"
    path.mkdir()
    (path / ".pre-commit-config.yaml").write_text(
        textwrap.dedent(f"""\
            repos:
              - repo: {hooks_repo}
                rev: {rev}
                hooks:
                  - id: flortrain-check
        """)
    )
    p = Project(path, env, hooks_repo)
    assert p.git("init", "-q")[0] == 0
    code, out = p.pre_commit("install", "--install-hooks")  # builds the hook's environment
    assert code == 0, out
    yield p


def test_the_hook_environment_has_no_torch(project: Project) -> None:
    pythons = list(Path(project.env["PRE_COMMIT_HOME"]).glob("repo*/py_env-*/bin/python"))
    assert len(pythons) == 1, pythons
    done = sh(
        [str(pythons[0]), "-c", "import flortrain.check.runner, torch"], project.path, project.env
    )
    assert done.returncode == 1 and "No module named 'torch'" in done.stdout, done.stdout


def test_a_commit_with_an_error_is_refused_and_its_fix_passes(project: Project) -> None:
    code, out = project.commit("train.py", BROKEN)
    assert code == 1, out
    assert "flortrain check" in out and "Failed" in out, out
    assert "train.py:2:" in out and "CHK001" in out, out
    assert project.git("rev-list", "--all")[1] == "", "the refused commit was made"
    code, out = project.commit("train.py", FIXED)
    assert code == 0, out
    assert project.git("log", "--format=%s")[1].split() == ["train.py"]
    # a warning is printed by `flortrain check` but does not stop the commit
    code, out = project.commit("listing.py", WARNED)
    assert code == 0, out
    # the project's excludes hold for the files pre-commit names (--force-exclude)
    project.commit("pyproject.toml", '[tool.flortrain.check]\nexclude = ["vendor"]\n')
    (project.path / "vendor").mkdir()
    code, out = project.commit("vendor/broken.py", BROKEN)
    assert code == 0, out


def test_try_repo_runs_the_hook(project: Project) -> None:
    (project.path / "broken.py").write_text(BROKEN)
    (project.path / "fixed.py").write_text(FIXED)
    code, out = project.pre_commit(
        "try-repo", str(project.hooks_repo), "flortrain-check", "--files", "broken.py", "fixed.py"
    )
    assert code == 1 and "broken.py:2:" in out and "CHK001" in out, out
    assert "fixed.py:" not in out, out  # the fixed script has no finding
