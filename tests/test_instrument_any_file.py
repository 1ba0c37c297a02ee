"""`flortrain instrument` on any Python file either prints code that compiles or exits 2 with a
one-line reason, never a traceback (DESIGN.md, CLI contract).

Inputs: a deterministic sample of the CPython standard library (every k-th file, sorted), which
includes its deliberately broken test data, plus hand-written nasty inputs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from flortrain.cli import cli
from flortrain.static.linemap import compile_mapped, line_map
from flortrain.static.text import read_text

ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SAMPLE_SIZE = 150

#: A refusal: `path[:line:col]: FT00n message`, one line.
ONE_LINE_ERROR = re.compile(r"^\S.*: FT00\d \S.*$")

#: Line ends as Python counts them (not str.splitlines, which also splits at form feeds).
NEWLINE = re.compile(r"\r\n|\r|\n")

#: The transform's rewrites of a loop header, undone to compare it with the original line.
HEADER_WRAPPER = re.compile(r"_flortrain_L\d+\.iterate\(|_flortrain_L\d+\.live\(\) and \(")


def stdlib_sample() -> list[Path]:
    files = sorted(
        p for p in STDLIB.rglob("*.py") if "site-packages" not in p.relative_to(STDLIB).parts
    )
    step = max(1, len(files) // SAMPLE_SIZE)
    return files[::step]


def run_instrument(path: Path | str, *options: str) -> Result:
    return CliRunner().invoke(cli, ["instrument", str(path), *options])


def assert_contract(result: Result, path: Path | str) -> str:
    """Exit 0 with code that compiles, or exit 2 with one line on stderr; never a traceback.
    Returns "ok" or the error line."""
    # (stdout may legitimately contain the word: it is the user's code)
    assert "Traceback (most recent call last)" not in result.stderr, result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    if result.exit_code == 0:
        assert result.stderr == ""
        compile(result.stdout, str(path), "exec", dont_inherit=True)
        assert "import flortrain.runtime as __flortrain__\n" in result.stdout
        return "ok"
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert ONE_LINE_ERROR.match(lines[0]), lines[0]
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


def _normalised(line: str) -> str:
    # whitespace too: libcst's round trip is not byte-exact everywhere (`except (A, B) :` comes
    # back as `except (A, B):`), which is harmless here
    return re.sub(r"[\s()]", "", HEADER_WRAPPER.sub("", line))


SAMPLE = stdlib_sample()


def test_the_sample_is_sized() -> None:
    assert SAMPLE_SIZE <= len(SAMPLE) < 2 * SAMPLE_SIZE


@pytest.mark.parametrize("path", SAMPLE, ids=[str(p.relative_to(STDLIB)) for p in SAMPLE])
def test_stdlib_file(path: Path) -> None:
    result = run_instrument(path)
    outcome = assert_contract(result, path)
    if outcome != "ok":
        # refusals of stdlib files are only about the input itself: bad syntax, encoding, depth
        assert re.search(r": FT00[124] ", outcome), outcome
        return
    # What `record` compiles: the instrumented code mapped back to the file's own lines. Every
    # line the transform did not insert maps to the original line it came from.
    text = read_text(str(path))
    code = result.stdout
    compile_mapped(code, text, str(path))
    original = NEWLINE.split(text)
    instrumented = NEWLINE.split(code)
    for j, (line, _shift) in enumerate(line_map(text, code)):
        if "flortrain" in instrumented[j] or not instrumented[j].strip():
            continue
        assert _normalised(original[line - 1]) == _normalised(instrumented[j]), (j + 1, line)


@pytest.mark.parametrize(
    "path", SAMPLE[::10], ids=[str(p.relative_to(STDLIB)) for p in SAMPLE[::10]]
)
def test_stdlib_file_explain(path: Path) -> None:
    result = run_instrument(path, "--explain")
    if assert_contract_explain(result) == "ok":
        first = result.stdout.splitlines()[0]
        assert first.startswith(str(path)), first


def assert_contract_explain(result: Result) -> str:
    assert "Traceback (most recent call last)" not in result.output, result.output
    if result.exit_code == 0:
        assert result.stdout.strip(), "an explanation is never empty"
        return "ok"
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    return result.stderr


# -- nasty inputs ---------------------------------------------------------------------------------

NASTY: dict[str, tuple[bytes, int, str | None]] = {
    # name: (content, expected exit code, expected stderr line with {path} for the file)
    "syntax_error.py": (b"x = (\n", 2, "{path}:1:5: FT002 syntax error: '(' was never closed"),
    "syntax_error_def.py": (
        b"def f(:\n    pass\n",
        2,
        "{path}:1:7: FT002 syntax error: invalid syntax",
    ),
    "syntax_error_indent.py": (
        b"for i in x:\nprint(i)\n",
        2,
        "{path}:2:1: FT002 syntax error: expected an indented block after 'for' statement on line 1",
    ),
    "empty.py": (b"", 0, None),
    "only_comment.py": (b"# nothing\n", 0, None),
    "binary.py": (b"\xff\xfe\x00\x01\x80binary", 2, None),
    "latin1_undeclared.py": (b"s = '\xe9'\n", 2, None),
    "nul_byte.py": (b"x = 1\n\x00\n", 2, None),
    "bom.py": (
        b"\xef\xbb\xbfx = 1\nfor e in range(2):\n    for b in [x]:\n        x = b\n",
        0,
        None,
    ),
    "latin1_declared.py": (b"# -*- coding: latin-1 -*-\ns = '\xe9'\nprint(s)\n", 0, None),
    "unknown_encoding.py": (b"# -*- coding: no-such-codec -*-\nx = 1\n", 2, None),
    "async_for.py": (
        b"async def f(stream):\n"
        b"    for epoch in range(2):\n"
        b"        async for b in stream:\n"
        b"            await b\n"
        b"        async with stream as s:\n"
        b"            pass\n",
        0,
        None,
    ),
    "class_body_loops.py": (
        b"class Table:\n"
        b"    rows = []\n"
        b"    for i in range(3):\n"
        b"        for j in range(3):\n"
        b"            rows.append((i, j))\n"
        b"    del i, j\n",
        0,
        None,
    ),
    "walrus.py": (
        b"data = [1, 2, 3]\n"
        b"for epoch in range(2):\n"
        b"    while (n := len(data)) > 1:\n"
        b"        data.pop()\n"
        b"    if (m := n + 1) > 1:\n"
        b"        print(m)\n",
        0,
        None,
    ),
    "match.py": (
        b"def f(cmds):\n"
        b"    for epoch in range(2):\n"
        b"        for c in cmds:\n"
        b"            match c:\n"
        b"                case {'op': 'add', 'n': int(n)}:\n"
        b"                    total = n\n"
        b"                case [x, *rest] if rest:\n"
        b"                    total = x\n"
        b"                case _:\n"
        b"                    pass\n"
        b"    match cmds:\n"
        b"        case []:\n"
        b"            return 0\n",
        0,
        None,
    ),
    "nested_lambdas.py": (
        b"f = "
        + b"lambda: " * 150
        + b"0\n"
        + b"for e in range(2):\n    for b in [f]:\n        f = b\n",
        0,
        None,
    ),
    "nested_parens.py": (b"x = " + b"(" * 150 + b"1" + b")" * 150 + b"\n", 0, None),
    "too_many_parens.py": (b"x = " + b"(" * 300 + b"1" + b")" * 300 + b"\n", 2, None),
    "long_string_concat.py": (
        b"doc = (\n" + b"".join(b"    'part %d'\n" % i for i in range(3000)) + b")\n",
        2,
        "{path}: FT004 too deeply nested for the static pass",
    ),
    "for_else.py": (
        b"for epoch in range(2):\n"
        b"    for b in range(3):\n"
        b"        if b == 5:\n"
        b"            break\n"
        b"    else:\n"
        b"        print('no break')\n"
        b"else:\n"
        b"    print('done')\n",
        0,
        None,
    ),
    "generators_and_returns.py": (
        b"def gen(xs):\n"
        b"    for epoch in range(2):\n"
        b"        for x in xs:\n"
        b"            yield x\n"
        b"        return\n",
        0,
        None,
    ),
    "global_nonlocal.py": (
        b"g = 0\n"
        b"def outer():\n"
        b"    n = 0\n"
        b"    def inner():\n"
        b"        global g\n"
        b"        nonlocal n\n"
        b"        for e in range(2):\n"
        b"            for b in range(2):\n"
        b"                g += b\n"
        b"                n += b\n"
        b"    inner()\n"
        b"    return n\n",
        0,
        None,
    ),
    "one_line_everything.py": (
        b"for e in range(2):\n    for b in range(2): print(b); e += b\n",
        0,
        None,
    ),
    "crlf_tabs_formfeed.py": (
        b"\x0c\r\nfor e in range(2):\r\n\tfor b in [1]:\r\n\t\tt = b\r\n\x0c\r\n\tprint(t)\r\n",
        0,
        None,
    ),
    "type_hints_and_decorators.py": (
        b"import functools\n"
        b"@functools.cache\n"
        b"def f(x: int) -> list[int]:\n"
        b"    out: list[int] = []\n"
        b"    for e in range(x):\n"
        b"        for b in range(e):\n"
        b"            out.append(b)\n"
        b"    return out\n",
        0,
        None,
    ),
    "try_star.py": (
        b"for e in range(2):\n"
        b"    for b in range(2):\n"
        b"        try:\n"
        b"            pass\n"
        b"        except* ValueError as eg:\n"
        b"            pass\n",
        0,
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(NASTY))
def test_nasty_input(name: str, tmp_path: Path) -> None:
    content, code, message = NASTY[name]
    path = tmp_path / name
    path.write_bytes(content)
    result = run_instrument(path)
    outcome = assert_contract(result, path)
    assert result.exit_code == code, result.output
    if message is not None:
        assert outcome == message.format(path=path)


def test_a_nonexistent_path(tmp_path: Path) -> None:
    path = tmp_path / "missing.py"
    result = run_instrument(path)
    assert assert_contract(result, path) == f"{path}: FT001 no such file"


def test_a_directory_path(tmp_path: Path) -> None:
    result = run_instrument(tmp_path)
    assert assert_contract(result, tmp_path) == f"{tmp_path}: FT001 is a directory, not a script"


def test_syntax_error_reports_what_python_reports(tmp_path: Path) -> None:
    """The location is CPython's, not libcst's (which points at the next token, often the next
    line)."""
    path = tmp_path / "bad.py"
    path.write_text("def f(:\n    pass\n")
    try:
        compile(path.read_text(), str(path), "exec")
    except SyntaxError as e:
        expected = (e.lineno, e.offset)
    result = run_instrument(path)
    line = assert_contract(result, path)
    assert line.startswith(f"{path}:{expected[0]}:{expected[1]}: FT002 syntax error")


def test_instrument_does_not_import_torch(tmp_path: Path) -> None:
    """The static side must stay light (pre-commit hook): instrumenting a torch script, plan or
    code, never imports torch."""
    fixture = ROOT / "fixtures" / "module_level.py"
    assert "import torch" in fixture.read_text()
    program = (
        "import sys\n"
        "from flortrain.cli import cli\n"
        "for options in ([], ['--explain']):\n"
        "    try:\n"
        f"        cli.main(['instrument', {str(fixture)!r}, *options], prog_name='flortrain')\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), e.code\n"
        "print('TORCH LOADED' if 'torch' in sys.modules else 'NO TORCH')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "NO TORCH"
    assert '__flortrain__.main_enter("M' in proc.stdout
    assert "main loop M" in proc.stdout
