"""``# noqa`` and ``# noqa: CODE[, CODE]`` comments, read as ruff reads them.

- ``noqa`` is matched in any case, with optional space after ``#`` and before the colon
  (``#noqa:RNG001``, ``# NOQA : RNG001``); codes are upper-case letters then digits, separated
  by commas or spaces; the list ends at the first word that is not a code (``# noqa: RNG001
  seeded upstream``). A bare ``# noqa`` silences every finding on the line. ``# noqa:`` with no
  valid code silences nothing (a typo must not turn into a blanket suppression).
- The comment goes on the line a finding is reported at. A finding inside a multi-line string
  takes the comment on the string's last line, and one on a backslash-continued line the
  comment on the continuation's last line, as ruff places them; a bracketed multi-line
  statement is not one line (the comment goes on the finding's own line).
Only real comments count (tokenize), never ``# noqa`` inside a string.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

_NOQA = re.compile(
    r"#\s*(?i:noqa)(?:\s*:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?|(?=\s|#|$))"
)
_CODE = re.compile(r"[A-Z]+[0-9]+")
_NOT_CODE_TOKENS = frozenset({tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT})
#: f-strings are tokenized in parts from Python 3.12 (-1: no such token before)
_FSTRING_START: int = getattr(tokenize, "FSTRING_START", -1)
_FSTRING_END: int = getattr(tokenize, "FSTRING_END", -1)


@dataclass(frozen=True)
class Directive:
    codes: frozenset[str] | None  # None: every code

    def covers(self, code: str) -> bool:
        return self.codes is None or code in self.codes


def parse_comment(comment: str) -> Directive | None:
    """The directive in one comment (``# noqa: RNG001``), or None when it has none."""
    for m in _NOQA.finditer(comment):
        codes = m.group("codes")
        if codes is not None:
            return Directive(frozenset(_CODE.findall(codes)))
        if m.group(0).rstrip().endswith(":") or comment[m.end() :].lstrip().startswith(":"):
            continue  # a colon and no code: not a directive
        return Directive(None)
    return None


class Suppressions:
    """The directives of one file, by the line each one governs."""

    def __init__(self, text: str) -> None:
        self._by_line: dict[int, Directive] = {}
        self._remap: dict[int, int] = {}
        if "noqa" in text.lower():
            self._read(text)

    def _read(self, text: str) -> None:
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            return  # the file does not parse: only CHK001, which noqa never silences
        prev: tokenize.TokenInfo | None = None
        fstrings: list[int] = []  # start lines of the f-strings open (tokenized in parts)
        for tok in tokens:
            if tok.type == tokenize.COMMENT:
                d = parse_comment(tok.string)
                if d is not None:
                    self._by_line[tok.start[0]] = d
            span: tuple[int, int] | None = None
            if tok.type == tokenize.STRING:
                span = (tok.start[0], tok.end[0])
            elif tok.type == _FSTRING_START:
                fstrings.append(tok.start[0])
            elif tok.type == _FSTRING_END and fstrings:
                span = (fstrings.pop(), tok.end[0])
            if span is not None:
                for line in range(*span):
                    self._remap[line] = span[1]
            if (
                prev is not None
                and prev.type not in _NOT_CODE_TOKENS
                and tok.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)
                and tok.start[0] > prev.end[0]
            ):
                for line in range(prev.end[0], tok.start[0]):  # a backslash continuation
                    self._remap.setdefault(line, tok.start[0])
            if tok.type not in (tokenize.INDENT, tokenize.DEDENT):
                prev = tok

    def _governing(self, line: int) -> int:
        for _ in range(len(self._remap) + 1):  # chains: a string continued by a backslash
            nxt = self._remap.get(line)
            if nxt is None or nxt == line:
                break
            line = nxt
        return line

    def covers(self, line: int, code: str) -> bool:
        d = self._by_line.get(line) or self._by_line.get(self._governing(line))
        return d is not None and d.covers(code)
