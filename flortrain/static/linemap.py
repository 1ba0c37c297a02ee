"""Tracebacks point at the user's file: map instrumented lines back to the lines on disk.

The transform only inserts lines, rewrites loop headers in place and indents probes, so setting
the inserted lines aside and diffing the rest against the file on disk recovers the mapping.
Compiling the instrumented *AST* with relocated positions and the user's filename makes every
frame, warning and ``linecache`` lookup show the user's own line.
"""

from __future__ import annotations

import ast
import difflib
import re
from types import CodeType

from flortrain.errors import FlortrainError, Located

_NEWLINE = re.compile(r"\r\n|\r|\n")

#: Lines the transform inserts (stripped): block enter/end, restore assignments, main-loop hooks,
#: probe wrappers and the runtime import. They have no counterpart in the original.
_INJECTED = re.compile(
    r"""^(?:
        _flortrain_\w+\ =\ __flortrain__\.block\(
      | (?:if\ )?_flortrain_\w+\.end\(
      | if\ _flortrain_\w+\.(?:has|jumped)\(
      | _flortrain_\w+\ =\ __flortrain__\.main_iteration\(
      | (?:globals\(\)\[".*"\]|[\w.]+)\ =\ _flortrain_\w+\.value\(
      | __flortrain__\.main_(?:enter|iteration|exit)\(
      | with\ __flortrain__\.probe\(
      | if\ __flortrain__\.forward\(
      | import\ flortrain\.runtime\ as\ __flortrain__$
    )""",
    re.VERBOSE,
)

#: The transform's rewrites of loop headers: ``for x in _flortrain_L6.iterate(it):`` and
#: ``while _flortrain_L6.live() and (cond):``.
_WRAPPER = re.compile(
    r'_flortrain_\w+\.iterate\(|_flortrain_\w+\.live\(\) and |__flortrain__\.main_iter\("[^"]*", '
)

#: Inserted lines that open something (mapped to the next original line): the runtime import,
#: a block's enter line, main-loop enter/iteration hooks, a probe's ``with``, a fast-forward gate.
_OPENS = re.compile(
    r"^(?:_flortrain_\w+ = __flortrain__\.(?:block|main_iteration)\(|__flortrain__\.main_(?:enter|iteration)\("
    r"|with __flortrain__\.probe\(|if __flortrain__\.forward\(|import flortrain\.runtime as __flortrain__$)"
)


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" \t"))


def _column(original: str, line: str) -> int:
    """Where ``line``'s text starts in the original line: its indent, or further right when the
    transform split a one-line compound statement (``if i % 100 == 0: print(x)``: the probe
    wrapper puts ``print(x)`` on a line of its own, and its columns must still point into the
    original line)."""
    text = line.strip()
    col = original.find(text) if text else -1
    return col if col >= 0 else _indent(original)


def _lines(text: str) -> list[str]:
    """Lines as Python numbers them: only \\n, \\r\\n and \\r end a line (``str.splitlines``
    also splits at form feeds and other separators, which would shift every later line)."""
    lines = _NEWLINE.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _key(line: str) -> str:
    """What a line is compared by: a loop header the transform rewrote (``iterate(`` around the
    iterable, ``live() and (`` before the condition, one more parenthesis) keys like the original
    header, so it pairs with it instead of breaking the run of equal lines."""
    return _WRAPPER.sub("", line.strip()).replace("(", "").replace(")", "")


def line_map(original: str, instrumented: str) -> list[tuple[int, int]]:
    """For each instrumented line (index 0 = line 1): (original line, column shift).

    The inserted lines are recognised and set aside first, and only the rest is diffed against the
    original. Diffing with them in place breaks the original's runs into short pieces, and in
    repetitive code (two copies of a loop body) the diff then pairs a piece with the wrong copy.
    """
    a = _lines(original)
    b = _lines(instrumented)
    out: list[tuple[int, int]] = [(1, 0)] * len(b)
    real = [j for j, line in enumerate(b) if not _INJECTED.match(line.strip())]
    sm = difflib.SequenceMatcher(
        a=[_key(x) for x in a], b=[_key(b[j]) for j in real], autojunk=False
    )
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ("equal", "replace"):  # replace: a line libcst re-spaced (`except (A) :`)
            for k in range(j2 - j1):
                i = min(i1 + k, i2 - 1)
                j = real[j1 + k]
                out[j] = (i + 1, _indent(b[j]) - _column(a[i], b[j]))
        elif tag == "insert":  # not the transform's shape; the nearest original line before
            for k in range(j1, j2):
                out[real[k]] = (max(i1, 1), 0)
    # inserted lines take a neighbour's line: what opens a block, a main-loop iteration or a probe
    # belongs to the line after it; what closes one, to the line before it
    is_real = set(real)
    before: list[int | None] = [None] * len(b)
    after: list[int | None] = [None] * len(b)
    last: int | None = None
    for j in range(len(b)):
        before[j] = last
        if j in is_real:
            last = out[j][0]
    last = None
    for j in reversed(range(len(b))):
        after[j] = last
        if j in is_real:
            last = out[j][0]
    for j in range(len(b)):
        if j not in is_real:
            first, second = (after, before) if _OPENS.match(b[j].strip()) else (before, after)
            out[j] = (first[j] or second[j] or 1, 0)
    return out


def relocate(tree: ast.AST, mapping: list[tuple[int, int]]) -> ast.AST:
    n = len(mapping)
    for node in ast.walk(tree):
        if not hasattr(node, "lineno"):
            continue
        line = node.lineno
        if 1 <= line <= n:
            orig, shift = mapping[line - 1]
            node.lineno = orig
            if hasattr(node, "col_offset"):
                node.col_offset = max(0, node.col_offset - shift)
        end = getattr(node, "end_lineno", None)
        if end is not None and 1 <= end <= n:
            orig, shift = mapping[end - 1]
            # setattr: ast.AST declares no position attributes (mypy), its subclasses do
            setattr(node, "end_lineno", max(orig, node.lineno))  # noqa: B010
            end_col = getattr(node, "end_col_offset", None)
            if end_col is not None:
                end_col = max(0, end_col - shift)
                if node.lineno == orig and hasattr(node, "col_offset"):
                    # compile() rejects a range that ends before it starts on one line
                    end_col = max(end_col, node.col_offset)
                setattr(node, "end_col_offset", end_col)  # noqa: B010
    return tree


def compile_mapped(instrumented: str, original: str, filename: str) -> object:
    """Compile instrumented code so that it reports ``filename`` and the original lines."""
    tree = ast.parse(instrumented, filename=filename)
    relocate(tree, line_map(original, instrumented))
    return compile(tree, filename, "exec", dont_inherit=True)


def compile_for(path: str, code_text: str, disk_text: str) -> CodeType:
    """Compile instrumented code so frames point at ``path`` as it is on disk."""
    try:
        code = compile_mapped(code_text, disk_text, path)
    except SyntaxError as e:  # a transform bug must still be one line, not a traceback
        raise FlortrainError(
            f"instrumented code does not compile ({e.msg}); please report this",
            Located(path, e.lineno or 0, e.offset or 0),
            "FT003",
        ) from None
    assert isinstance(code, CodeType)
    return code
