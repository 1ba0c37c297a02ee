"""Tracebacks point at the user's file: map instrumented lines back to the lines on disk.

The transform only inserts lines, rewrites loop headers in place and indents probes, so a
line-level diff between the file on disk and the instrumented text recovers the mapping exactly.
Compiling the instrumented *AST* with relocated positions and the user's filename makes every
frame, warning and ``linecache`` lookup show the user's own line.
"""

from __future__ import annotations

import ast
import difflib


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" \t"))


def line_map(original: str, instrumented: str) -> list[tuple[int, int]]:
    """For each instrumented line (index 0 = line 1): (original line, column shift)."""
    a = original.splitlines()
    b = instrumented.splitlines()
    out: list[tuple[int, int]] = [(1, 0)] * len(b)
    sm = difflib.SequenceMatcher(a=[x.strip() for x in a], b=[x.strip() for x in b], autojunk=False)
    last = 1
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for k in range(j2 - j1):
                out[j1 + k] = (i1 + k + 1, _indent(b[j1 + k]) - _indent(a[i1 + k]))
            last = i2
        elif tag == "replace":
            for k in range(j2 - j1):
                orig = min(i1 + k, i2 - 1)
                out[j1 + k] = (orig + 1, 0)
            last = i2
        elif tag == "insert":
            for k in range(j2 - j1):
                out[j1 + k] = (max(last, 1), 0)
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
                setattr(node, "end_col_offset", max(0, end_col - shift))  # noqa: B010
    return tree


def compile_mapped(instrumented: str, original: str, filename: str) -> object:
    """Compile instrumented code so that it reports ``filename`` and the original lines."""
    tree = ast.parse(instrumented, filename=filename)
    relocate(tree, line_map(original, instrumented))
    return compile(tree, filename, "exec", dont_inherit=True)
