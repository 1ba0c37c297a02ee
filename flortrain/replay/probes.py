"""Probes: the statements added to a script since it was recorded.

Replaying different training code would be a lie, so the current script must be the recorded one
plus whole added statements. Lines are compared by what Python sees on them, their tokens (see
:func:`_significant`): blank lines, comments (whole-line or trailing, added, changed or removed) and
spacing that is not indentation are ignored, so ``tot = 0.0  # accumulate`` and ``tot=0.0`` are the
recorded ``tot = 0.0``. Any other change (an edited token, a deleted or re-indented line, an edit
inside an existing statement or string) is refused with the lines named.
A probe may bind new names for its own use but not rebind a name the training code uses, and may
not change control flow (``return``, ``break``, ``yield`` ...).
"""

from __future__ import annotations

import difflib
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import PositionProvider

from flortrain.errors import FlortrainError, Located
from flortrain.replay.observation import imported_names, mutation
from flortrain.static.source import Source, parse


@dataclass(frozen=True)
class Probe:
    number: int
    line: int  # first line in the current script
    end_line: int
    code: str
    node: cst.BaseStatement


@dataclass(frozen=True)
class ProbeSet:
    line_map: dict[int, int]  # recorded line -> current line, for unchanged lines
    probes: tuple[Probe, ...]
    current: Source


@dataclass(frozen=True)
class _Line:
    number: int
    #: what must match: the statement's indentation if one starts on the line (None on a
    #: continuation line, where indentation means nothing), then the tokens starting on it
    key: tuple[str | None, tuple[str, ...]]
    text: str  # as written, for error messages


# tokens that are not code: comments, line ends, and INDENT/DEDENT (the key's indentation says it)
_NOT_CODE = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
)


def _reader(text: str) -> io.StringIO:
    """Lines as compile and libcst count them: ``\\n``, ``\\r\\n`` and ``\\r`` end one, nothing else
    does (``str.splitlines`` also splits at form feeds, which Python allows in indentation)."""
    return io.StringIO(text, newline=None)


def _significant(text: str) -> list[_Line]:
    """The lines that carry code, keyed by their tokens: what a comment or spacing changes is not
    compared, what any token changes is. A token spanning lines (a triple-quoted string) belongs,
    whole, to the line it starts on, so an edit inside it changes that line; the lines it covers
    carry no key of their own. Line numbers are tokenize's rows, which are libcst's lines, so they
    place probes and map recorded lines the same way."""
    lines = _reader(text).readlines()
    tokens: dict[int, list[str]] = {}
    indent: dict[int, str] = {}
    starts_statement = True
    for tok in tokenize.generate_tokens(_reader(text).readline):
        if tok.type in _NOT_CODE:
            starts_statement = starts_statement or tok.type == tokenize.NEWLINE
            continue
        row, col = tok.start
        if starts_statement:
            indent[row] = lines[row - 1][:col]
            starts_statement = False
        tokens.setdefault(row, []).append(tok.string)
    return [
        _Line(row, (indent.get(row), tuple(t)), lines[row - 1].rstrip())
        for row, t in sorted(tokens.items())
    ]


def _textual(text: str) -> list[_Line]:
    """The fallback should the pure-Python tokenizer refuse what the compiler accepted (it can lag
    on rare syntax): lines as written less trailing whitespace, comment-only lines ignored."""
    out = []
    for i, line in enumerate(_reader(text), 1):
        s = line.strip()
        if s and not s.startswith("#"):
            out.append(_Line(i, (None, (line.rstrip(),)), line.rstrip()))
    return out


def _compared(recorded: str, current: str) -> tuple[list[_Line], list[_Line]]:
    """Both scripts keyed the same way: mixing the two kinds of key would find every line changed."""
    try:
        return _significant(recorded), _significant(current)
    except (tokenize.TokenError, SyntaxError):
        return _textual(recorded), _textual(current)


def _statements(module: cst.Module) -> Iterator[cst.BaseStatement]:
    def walk(node: cst.CSTNode) -> Iterator[cst.BaseStatement]:
        if isinstance(node, cst.BaseStatement):
            yield node
        for c in node.children:
            yield from walk(c)

    yield from walk(module)


_CONTROL = (
    cst.Return,
    cst.Break,
    cst.Continue,
    cst.Yield,
    cst.Await,
    cst.Global,
    cst.Nonlocal,
    cst.Del,
)


def bound_names(node: cst.CSTNode) -> Iterator[str]:
    """The names a statement binds, nested statements included (``a.b = 1`` binds none)."""
    if isinstance(node, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.NamedExpr):
        t = node.target
        yield from (
            n.value for n in _walk(t) if isinstance(n, cst.Name) and not _is_attr_name(t, n)
        )
    elif isinstance(node, cst.For):
        yield from (n.value for n in _walk(node.target) if isinstance(n, cst.Name))
    elif isinstance(node, cst.AsName):
        yield from (n.value for n in _walk(node.name) if isinstance(n, cst.Name))
    elif isinstance(node, cst.FunctionDef | cst.ClassDef):
        yield node.name.value
    for c in node.children:
        yield from bound_names(c)


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for c in node.children:
        yield from _walk(c)


def _is_attr_name(target: cst.CSTNode, name: cst.Name) -> bool:
    # in `a.b = 1` or `a[i] = 1` nothing is *bound*; the object is mutated: not a rebinding
    return not isinstance(target, cst.Name | cst.Tuple | cst.List | cst.StarredElement)


def _names_used(text: str) -> set[str]:
    module = cst.parse_module(text)
    return {n.value for n in _walk(module) if isinstance(n, cst.Name)}


def _line_map(
    a: list[_Line], b: list[_Line], path: str, run_id: int
) -> tuple[dict[int, int], set[int]]:
    """Recorded line -> current line for the lines both scripts share, and the current lines
    added; a line changed or removed is refused (FT020): only added statements replay."""
    sm = difflib.SequenceMatcher(a=[x.key for x in a], b=[x.key for x in b], autojunk=False)
    line_map: dict[int, int] = {}
    inserted: set[int] = set()
    changed: list[str] = []
    first_changed: int | None = None
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                line_map[a[i1 + k].number] = b[j1 + k].number
        elif tag == "insert":
            inserted.update(x.number for x in b[j1:j2])
        else:
            for x in a[i1:i2]:
                changed.append(f"recorded line {x.number} `{x.text.strip()}`")
            for x in b[j1:j2]:
                first_changed = first_changed or x.number
                changed.append(f"line {x.number} `{x.text.strip()}`")
            if first_changed is None:
                first_changed = b[j1].number if j1 < len(b) else (b[-1].number if b else 1)
    if changed:
        shown = "; ".join(changed[:4]) + (" ..." if len(changed) > 4 else "")
        raise FlortrainError(
            f"the script changed since record run {run_id} beyond added statements ({shown});"
            " only added statements (probes) can be replayed",
            Located(path, first_changed or 1, 1),
            "FT020",
        )
    return line_map, inserted


def _added_statements(
    current: Source, significant: set[int], inserted: set[int], path: str, run_id: int
) -> list[Probe]:
    """The statements made only of added lines, in line order (numbered later); an added line
    that is part of a recorded statement edits it, and is refused (FT021)."""
    pos = current.wrapper.resolve(PositionProvider)
    probes: list[Probe] = []
    covered: set[int] = set()
    for stmt in _statements(current.module):
        r = pos[stmt]
        lines = {ln for ln in range(r.start.line, r.end.line + 1) if ln in significant}
        if not lines or not lines <= inserted or lines & covered:
            continue
        covered |= lines
        probes.append(Probe(0, r.start.line, r.end.line, current.code(stmt).strip(), stmt))
    stray = sorted(inserted - covered)
    if stray:
        raise FlortrainError(
            f"line {stray[0]} edits an existing statement since record run {run_id}; only whole added"
            " statements (probes) can be replayed",
            Located(path, stray[0], 1),
            "FT021",
        )
    return sorted(probes, key=lambda p: p.line)


def _check_observes(p: Probe, used: set[str], modules: set[str], path: str) -> None:
    """Refuse a probe that would change what the script does: control flow (FT022), a name the
    recorded script uses rebound (FT023), training state mutated (FT025)."""
    for node in _walk(p.node):
        if isinstance(node, _CONTROL) and not _inside_def(p.node, node):
            kind = type(node).__name__.lower()
            raise FlortrainError(
                f"probe uses `{kind}`, which changes control flow",
                Located(path, p.line, 1),
                "FT022",
            )
    rebinds = sorted(set(bound_names(p.node)) & used)
    if rebinds:
        raise FlortrainError(
            f"probe rebinds `{rebinds[0]}`, which the recorded script uses; give probe variables new names",
            Located(path, p.line, 1),
            "FT023",
        )
    changes = mutation(p.node, used, modules)
    if changes:
        raise FlortrainError(
            f"probe {changes}, which changes training state: a plain run of this script would"
            " train differently, and the replay cannot show that; probes may only observe",
            Located(path, p.line, 1),
            "FT025",
        )


def find_probes(recorded: str, current_text: str, path: str, run_id: int) -> ProbeSet:
    """The probes: the statements added to the recorded script, each checked to only observe."""
    # parse first: a script that does not compile is a syntax error (FT002), not a difference
    current = parse(path, current_text)
    a, b = _compared(recorded, current_text)
    line_map, inserted = _line_map(a, b, path, run_id)
    probes = _added_statements(current, {x.number for x in b}, inserted, path, run_id)
    used = _names_used(recorded)
    modules = imported_names(cst.parse_module(recorded))
    out: list[Probe] = []
    for n, p in enumerate(probes, 1):
        _check_observes(p, used, modules, path)
        out.append(Probe(n, p.line, p.end_line, p.code, p.node))
    return ProbeSet(line_map, tuple(out), current)


def _inside_def(root: cst.CSTNode, target: cst.CSTNode) -> bool:
    def search(node: cst.CSTNode, in_def: bool) -> bool | None:
        if node is target:
            return in_def
        for c in node.children:
            r = search(c, in_def or isinstance(node, cst.FunctionDef | cst.Lambda))
            if r is not None:
                return r
        return None

    return bool(search(root, False))


def add_cli_probe(text: str, spec: str, path: str) -> str:
    """``--probe LINE:EXPR``: print EXPR's value after the simple statement ending on LINE."""
    line_s, sep, expr = spec.partition(":")
    if not sep or not line_s.strip().isdigit() or not expr.strip():
        raise FlortrainError(
            f"--probe {spec!r}: expected LINE:EXPR, e.g. 57:grad_norm", Located(path), "FT024"
        )
    line = int(line_s)
    expr = expr.strip()
    try:
        cst.parse_expression(expr)
    except cst.ParserSyntaxError:
        raise FlortrainError(
            f"--probe {spec!r}: `{expr}` is not a Python expression",
            Located(path, line, 1),
            "FT024",
        ) from None
    src = parse(path, text)
    pos = src.wrapper.resolve(PositionProvider)
    target: cst.SimpleStatementLine | None = None
    for stmt in _statements(src.module):
        if isinstance(stmt, cst.SimpleStatementLine) and pos[stmt].end.line == line:
            target = stmt
    if target is None:
        raise FlortrainError(
            f"--probe {spec!r}: line {line} does not end a simple statement",
            Located(path, line, 1),
            "FT024",
        )
    lines = text.splitlines(keepends=True)
    first = lines[pos[target].start.line - 1]
    indent = first[: len(first) - len(first.lstrip())]
    added = f"{indent}print({expr!r} + ' =', ({expr}))\n"
    if lines and not lines[line - 1].endswith("\n"):
        lines[line - 1] += "\n"
    lines.insert(line, added)
    return "".join(lines)
