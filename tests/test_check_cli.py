"""``flortrain check`` end to end through click's runner: discovery and excludes, a syntax error
beside files that still get checked, ``# noqa``, configuration, every output format parsed,
exit codes, ``--fix``/``--diff``; and that checking never imports torch or numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from flortrain.cli import cli

LISTING = "import os\nfor f in os.listdir('data'):\n    print(f)\n"  # DET101 at 2:10, fixable
CLEAN = "import os\nfor f in sorted(os.listdir('data')):\n    print(f)\n"
SYNTAX = "x = 1\nfor x in range(3)\n    print(x)\n"  # CHK001 at 2:18


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _check(root: Path, *args: str) -> Result:
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(cli, ["check", *args])
    finally:
        os.chdir(cwd)


def _where(out: str, code: str = "DET101") -> list[str]:
    """``path:line`` of each finding of ``code`` in concise output."""
    return [ln.split(": ")[0].rsplit(":", 1)[0] for ln in out.splitlines() if f": {code} " in ln]


def test_directories_recursed_with_excludes(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "pyproject.toml": '[tool.flortrain.check]\nextend-exclude = ["vendor", "gen/*.py"]\n',
            "a.py": LISTING,
            "sub/deep/b.py": LISTING,
            "vendor/c.py": LISTING,
            "gen/d.py": LISTING,
            "build/e.py": LISTING,  # a default exclude
            "notes.txt": LISTING,
        },
    )
    r = _check(tmp_path)
    assert r.exit_code == 0, r.output  # DET101 is a warning
    assert _where(r.output) == ["a.py:2", "sub/deep/b.py:2"]
    # a file named on the command line is checked though excluded (as ruff does) ...
    r = _check(tmp_path, "vendor/c.py", "build/e.py")
    assert _where(r.output) == ["build/e.py:2", "vendor/c.py:2"]  # sorted by path, as ruff
    # ... unless --force-exclude (the pre-commit hook's way: it names every staged file)
    r = _check(tmp_path, "--force-exclude", "vendor/c.py", "build/e.py", "gen/d.py", "a.py")
    assert _where(r.output) == ["a.py:2"]
    r = _check(tmp_path, "--force-exclude", "vendor", "sub")
    assert _where(r.output) == ["sub/deep/b.py:2"]


def test_syntax_error_is_a_finding_and_the_other_files_are_checked(tmp_path: Path) -> None:
    _tree(tmp_path, {"a_bad.py": SYNTAX, "b.py": LISTING})
    r = _check(tmp_path)
    assert r.exit_code == 1
    lines = r.output.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("a_bad.py:2:18: CHK001 syntax error"))
    assert lines[i + 1] == "    for x in range(3)"
    assert lines[i + 2] == "    " + " " * 17 + "^"
    assert _where(r.output) == ["b.py:2"]
    assert lines[-1] == "Found 1 error and 1 warning. [*] 1 fixable with --fix."
    (tmp_path / "c_binary.py").write_bytes(b"x = '\xff\xfe'\n")  # not UTF-8: cannot be read
    r = _check(tmp_path)
    assert "c_binary.py: CHK001 cannot decode" in r.output
    assert r.output.splitlines()[-1].startswith("Found 2 errors and 1 warning.")


def test_noqa(tmp_path: Path) -> None:
    text = (
        "import os\n"
        "a = os.listdir('d')  # noqa\n"
        "b = os.listdir('d')  #NOQA:DET101\n"
        "c = os.listdir('d')  # noqa: RNG001\n"  # another code: still reported
        "d = os.listdir('d')  # noqa:\n"  # no code: not a directive
        "e = os.listdir('d')  # noqa: RNG001, DET101 listed on purpose\n"
        "s = '# noqa'; f = os.listdir('d')\n"  # inside a string: not a comment
        "g = os.listdir('d') + \\\n"
        "    []  # noqa: DET101\n"  # a backslash continuation's last line
        "h = [\n"
        "    os.listdir('d'),\n"
        "]  # noqa: DET101\n"  # a bracketed statement is not one line
    )
    _tree(tmp_path, {"t.py": text})
    r = _check(tmp_path, "t.py")
    assert _where(r.output) == ["t.py:4", "t.py:5", "t.py:7", "t.py:11"]


def test_configuration(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "pyproject.toml": (
                "[tool.flortrain.check]\n"
                'severity = { DET101 = "error" }\n'
                'per-file-ignores = { "legacy/*.py" = ["DET1"] }\n'
            ),
            "train.py": LISTING,
            "legacy/old.py": LISTING,
            # the nearest table governs: this one turns the rule off below it
            "exp/pyproject.toml": '[tool.flortrain.check]\nignore = ["DET"]\n',
            "exp/run.py": LISTING,
            # a pyproject.toml without the table is passed over
            "lib/pyproject.toml": "[project]\nname = 'lib'\n",
            "lib/util.py": LISTING,
        },
    )
    r = _check(tmp_path)
    assert r.exit_code == 1  # the severity override made it an error
    assert _where(r.output) == ["lib/util.py:2", "train.py:2"]
    assert "[error] hint: wrap it in sorted(...)" in r.output
    # the command line is a layer over the file: --select replaces its selection
    r = _check(tmp_path, "--select", "DET101", "exp/run.py")
    assert _where(r.output) == ["exp/run.py:2"]
    r = _check(tmp_path, "--ignore", "DET101")
    assert r.exit_code == 0 and _where(r.output) == []
    # --config names one table for every file; --isolated ignores them all
    r = _check(tmp_path, "--config", "exp/pyproject.toml", "train.py")
    assert _where(r.output) == []
    r = _check(tmp_path, "--isolated", "legacy/old.py")
    assert r.exit_code == 0 and _where(r.output) == ["legacy/old.py:2"]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('selec = ["DET"]', "unknown key 'selec'"),
        ('ignore = ["XYZ1"]', "ignore: unknown rule code or prefix 'XYZ1'"),
        ('severity = { DET101 = "fatal" }', 'must be "error" or "warning", not \'fatal\''),
        ('per-file-ignores = { "*.py" = ["DET9"] }', "unknown rule code or prefix 'DET9'"),
        ("torch-version = 2.1", "torch-version must be a"),
        ("select = DET", "invalid TOML"),
    ],
)
def test_bad_configuration_is_one_line_exit_2(tmp_path: Path, table: str, says: str) -> None:
    _tree(tmp_path, {"pyproject.toml": f"[tool.flortrain.check]\n{table}\n", "a.py": LISTING})
    r = _check(tmp_path)
    assert r.exit_code == 2
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("pyproject.toml") and "FT070" in line and says in line, line


def test_bad_option_and_missing_path_exit_2(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": LISTING})
    r = _check(tmp_path, "--select", "RNG,BOGUS1")
    assert (
        r.exit_code == 2
        and r.stderr.strip() == "FT070 --select: unknown rule code or prefix 'BOGUS1'"
    )
    r = _check(tmp_path, "a.py", "missing.py")
    assert r.exit_code == 2 and r.stderr.strip() == "missing.py: FT001 no such file or directory"
    assert r.stdout == ""


def test_exit_codes(tmp_path: Path) -> None:
    _tree(tmp_path, {"clean.py": CLEAN, "warn.py": LISTING, "bad.py": SYNTAX})
    r = _check(tmp_path, "clean.py")
    assert (r.exit_code, r.output) == (0, "All checks passed.\n")
    assert _check(tmp_path, "warn.py").exit_code == 0
    assert _check(tmp_path, "bad.py").exit_code == 1
    assert _check(tmp_path, "--exit-zero", "bad.py").exit_code == 0


def test_json_output(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": LISTING, "b.py": SYNTAX})
    r = _check(tmp_path, "--output-format", "json")
    assert r.exit_code == 1
    found = json.loads(r.stdout)
    assert [(f["path"], f["line"], f["col"], f["code"], f["severity"]) for f in found] == [
        ("a.py", 2, 10, "DET101", "warning"),
        ("b.py", 2, 18, "CHK001", "error"),
    ]
    listing = found[0]
    assert set(listing) == {
        "path",
        "line",
        "col",
        "end",
        "code",
        "severity",
        "message",
        "hint",
        "fix",
    }
    assert listing["end"] == {"line": 2, "col": 28}
    assert listing["fix"] == {
        "applicable": "safe",
        "edits": [
            {"start": {"line": 2, "col": 10}, "end": {"line": 2, "col": 10}, "content": "sorted("},
            {"start": {"line": 2, "col": 28}, "end": {"line": 2, "col": 28}, "content": ")"},
        ],
    }
    assert found[1]["fix"] is None and found[1]["end"] is None


def test_github_output(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": LISTING, "b.py": SYNTAX})
    r = _check(tmp_path, "--output-format", "github")
    assert r.stdout.splitlines() == [
        "::warning file=a.py,line=2,col=10,endLine=2,endColumn=28,title=DET101::directory listing"
        " in file-system order, which differs between machines and runs%0Ahint: wrap it in"
        " sorted(...)",
        "::error file=b.py,line=2,col=18,title=CHK001::syntax error: expected ':'%0Ahint: the file"
        " is not checked until it parses",
    ]


def test_github_output_is_empty_when_nothing_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": CLEAN})
    r = _check(tmp_path, "--output-format", "github")
    assert (r.exit_code, r.stdout) == (0, "")


def test_sarif_output(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": LISTING, "b.py": SYNTAX})
    r = _check(tmp_path, "--output-format", "sarif")
    log = json.loads(r.stdout)
    assert log["version"] == "2.1.0" and "sarif-2.1.0" in log["$schema"]
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert run["tool"]["driver"]["name"] == "flortrain"
    ids = [rule["id"] for rule in rules]
    assert ids == sorted(ids) and {"CHK001", "DET101"} <= set(ids)
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("error", "warning") and result["message"]["text"]
    region = run["results"][0]["locations"][0]["physicalLocation"]
    assert region == {
        "artifactLocation": {"uri": "a.py"},
        "region": {"startLine": 2, "startColumn": 10, "endLine": 2, "endColumn": 28},
    }


def test_fix_writes_and_diff_does_not(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": LISTING})
    r = _check(tmp_path, "--diff", "a.py")
    assert r.exit_code == 1
    assert "-for f in os.listdir('data'):\n+for f in sorted(os.listdir('data')):" in r.stdout
    assert (tmp_path / "a.py").read_text() == LISTING
    r = _check(tmp_path, "--fix", "a.py")
    assert r.exit_code == 0
    assert r.output == "Fixed 1 finding. All checks passed.\n"
    assert (tmp_path / "a.py").read_text() == CLEAN
    r = _check(tmp_path, "--diff", "a.py")
    assert r.exit_code == 0 and r.stdout == ""


def test_fix_keeps_line_endings_and_encoding(tmp_path: Path) -> None:
    text = "# -*- coding: latin-1 -*-\r\nimport os\r\nname = 'caf\xe9'\r\nfor f in os.listdir('d'):\r\n    pass\r\n"
    (tmp_path / "a.py").write_bytes(text.encode("latin-1"))
    assert _check(tmp_path, "--fix", "a.py").exit_code == 0
    assert (tmp_path / "a.py").read_bytes() == text.replace(
        "os.listdir('d')", "sorted(os.listdir('d'))"
    ).encode("latin-1")


def test_check_never_imports_torch_or_numpy() -> None:
    """The pre-commit hook installs without torch: checking every fixture must not import it."""
    fixtures = Path(__file__).parent.parent / "fixtures"
    code = (
        "import sys\n"
        "from flortrain.cli import main\n"
        f"sys.argv = ['flortrain', 'check', '--exit-zero', {str(fixtures)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "print('heavy:', heavy, file=sys.stderr)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "heavy: []" in p.stderr
