"""Where the checker finds a script's project modules (one resolver, three questions) and how it
reads a ``[tool.flortrain.check]`` table: real files in a temporary tree, no rule involved."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flortrain.check.config import CheckConfig
from flortrain.check.project import Found, hook_module, module_path, script_module, unit_at
from flortrain.check.pyproject import KEYS, load
from flortrain.check.unit import Unit
from flortrain.errors import FlortrainError


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _unit(path: Path) -> Unit:
    unit = unit_at(str(path), CheckConfig())
    assert unit is not None
    return unit


def test_module_path_beside_the_importer_its_package_or_relative(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "train.py": "import aug\n",
            "aug.py": "",
            "pcdet/__init__.py": "",
            "pcdet/utils.py": "",
            "pcdet/datasets/__init__.py": "from pcdet.utils import x\nfrom ..utils import y\n",
            "pcdet/datasets/kitti.py": "",
        },
    )
    train = _unit(tmp_path / "train.py")
    inner = _unit(tmp_path / "pcdet/datasets/__init__.py")
    assert module_path(train, "aug") == str(tmp_path / "aug.py")
    assert module_path(train, "pcdet.utils") == str(tmp_path / "pcdet/utils.py")
    # inside a package: beside the package, one directory per enclosing package
    assert module_path(inner, "pcdet.utils") == str(tmp_path / "pcdet/utils.py")
    assert module_path(inner, "kitti") == str(tmp_path / "pcdet/datasets/kitti.py")
    assert module_path(inner, "..utils") == str(tmp_path / "pcdet/utils.py")
    assert module_path(inner, ".kitti") == str(tmp_path / "pcdet/datasets/kitti.py")
    assert module_path(train, "numpy") is None
    assert module_path(train, ".") is None


def test_module_path_stops_at_the_first_directory_that_is_not_a_package(tmp_path: Path) -> None:
    _tree(tmp_path, {"aug.py": "", "src/lib/__init__.py": "", "src/lib/core.py": "import aug\n"})
    core = _unit(tmp_path / "src/lib/core.py")
    # src/ has no __init__.py: the search ends there, and aug.py above it is not the project's
    assert module_path(core, "aug") is None


def test_script_module_is_found_from_the_scripts_directory_also_inside_a_module(
    tmp_path: Path,
) -> None:
    _tree(
        tmp_path,
        {
            "train.py": "import lib.a\n",
            "lib/a.py": "import b\n",
            "b.py": "X = 1\n",
            "lib/c.py": "",
        },
    )
    train = _unit(tmp_path / "train.py")
    a = script_module(train, "lib.a")
    assert a is not None and a.path == str(tmp_path / "lib/a.py")
    # lib/a.py's `import b` finds b.py beside the script, as sys.path[0] would
    b = script_module(a, "b")
    assert b is not None and b.path == str(tmp_path / "b.py")
    assert script_module(a, "c") is None  # beside lib/a.py but not on the script's path
    assert script_module(train, "train") is None  # the script itself is not its own module
    assert script_module(train, "missing") is None


def test_hook_module_beside_the_script_or_a_few_directories_above(tmp_path: Path) -> None:
    deep = tmp_path / "a/b/c/d"
    _tree(
        tmp_path,
        {
            "a/b/c/d/train.py": "",
            "a/b/c/d/here.py": "",
            "a/b/up.py": "",
            "a/far.py": "",
            "top.py": "",
        },
    )
    script = str(deep / "train.py")
    assert hook_module(script, "here") == Found(str(deep / "here.py"), True)
    assert hook_module(script, "up") == Found(str(tmp_path / "a/b/up.py"), False)
    assert hook_module(script, "far") == Found(str(tmp_path / "a/far.py"), False)
    assert hook_module(script, "top") is None  # four directories above: out of reach
    assert hook_module(script, "numpy") is None


def test_unit_at_parses_a_file_once_while_it_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("x = 1\n")
    first = unit_at(str(path), CheckConfig())
    assert first is not None and unit_at(str(path), CheckConfig()) is first
    path.write_text("x = 1000\n")
    second = unit_at(str(path), CheckConfig())
    assert second is not None and second is not first and "1000" in second.text
    path.write_text("def (:\n")
    assert unit_at(str(path), CheckConfig()) is None  # does not parse: no unit
    os.remove(path)
    assert unit_at(str(path), CheckConfig()) is None


def test_load_reads_every_key() -> None:
    table = {
        "select": ["RNG", "DET1"],
        "extend-select": ["RPL001"],
        "ignore": ["DET101"],
        "exclude": ["build"],
        "extend-exclude": ["legacy/*"],
        "per-file-ignores": {"tests/*": ["RNG"]},
        "severity": {"DET": "error"},
        "torch-version": "2.4",
        "force-exclude": True,
    }
    assert set(table) == KEYS
    c = load("/proj/pyproject.toml", table)
    assert (c.select, c.extend_select, c.ignore) == (("RNG", "DET1"), ("RPL001",), ("DET101",))
    assert (c.exclude, c.extend_exclude) == (("build",), ("legacy/*",))  # globs, not codes
    assert c.per_file_ignores == (("tests/*", ("RNG",)),)
    assert c.severity == {"DET": "error"} and c.torch_version == "2.4" and c.force_exclude
    assert (c.root, c.source) == ("/proj", "/proj/pyproject.toml")


@pytest.mark.parametrize(
    ("table", "says"),
    [
        # every key is wrong: the first in the table's reading order is the one reported
        ({"force-exclude": 1, "torch-version": 2, "select": "RNG"}, "select must be a list"),
        ({"force-exclude": 1, "torch-version": "2"}, "torch-version must be a"),
        ({"force-exclude": "yes"}, "force-exclude must be true or false"),
        ({"exclude": [1]}, "exclude must be a list of strings"),
        ({"per-file-ignores": ["a"]}, "per-file-ignores must be a table"),
        ({"per-file-ignores": {"a.py": ["XYZ9"]}}, "per-file-ignores 'a.py': unknown rule"),
        ({"severity": {"XYZ9": "error"}}, "severity: unknown rule code or prefix 'XYZ9'"),
        ({"select": ["RNG"], "colour": 1}, "unknown key 'colour'"),
    ],
)
def test_load_refuses_in_one_line_naming_the_file(table: dict[str, object], says: str) -> None:
    with pytest.raises(FlortrainError) as e:
        load("pyproject.toml", table)
    line = e.value.one_line()
    assert "\n" not in line and line.startswith("pyproject.toml") and "FT070" in line
    assert says in line, line
