"""Reading and parsing a user's script: every failure becomes one located line, never a traceback."""

from __future__ import annotations

import io
import tokenize
import warnings
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from flortrain.errors import FlortrainError, Located


@dataclass(frozen=True)
class Source:
    """A parsed script with positions: the unit every analysis consumes."""

    path: str
    text: str
    wrapper: MetadataWrapper

    @property
    def module(self) -> cst.Module:
        return self.wrapper.module

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)


def read_text(path: str) -> str:
    """The script's text as Python decodes it: a UTF-8 BOM or a PEP 263 coding cookie is honoured
    (``compile`` rejects a str that still starts with a BOM; a latin-1 script is valid Python)."""
    p = Path(path)
    if p.is_dir():
        raise FlortrainError("is a directory, not a script", Located(path), "FT001")
    if not p.is_file():
        raise FlortrainError("no such file", Located(path), "FT001")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FlortrainError(f"cannot read: {e.strerror}", Located(path), "FT001") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:  # an unknown or contradictory coding cookie
        raise FlortrainError(f"cannot decode: {e.msg}", Located(path), "FT001") from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        what = "UTF-8" if encoding.startswith("utf-8") else encoding
        raise FlortrainError(f"not {what} text ({e.reason})", Located(path), "FT001") from None


def parse(path: str, text: str | None = None) -> Source:
    """Parse ``path`` (or ``text`` standing for it). A syntax error is a :class:`FlortrainError`
    at the offending line and column, the way Python itself would point at it."""
    if text is None:
        text = read_text(path)
    # compile() runs first: it is the judge of what can run, and it locates a syntax error the way
    # Python does (libcst's parser reports the token after the error, often on the next line).
    try:
        with warnings.catch_warnings():
            # SyntaxWarnings belong to running the script, not to analysing it
            warnings.simplefilter("ignore")
            compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise FlortrainError(
            f"syntax error: {_first_line(e.msg)}", Located(path, e.lineno or 0, e.offset or 0), "FT002"
        ) from None
    except ValueError as e:  # e.g. source with NUL bytes
        raise FlortrainError(f"cannot compile: {e}", Located(path), "FT002") from None
    # libcst may still refuse what CPython accepts (syntax newer than it knows).
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as e:
        msg = _first_line(e.message)
        raise FlortrainError(
            f"syntax not supported by the static pass: {msg}",
            Located(path, e.editor_line, e.editor_column),
            "FT002",
        ) from None
    return Source(path, text, MetadataWrapper(module, unsafe_skip_copy=True))


def _first_line(msg: str | None) -> str:
    """An error message as one line (the CLI contract: one line, never a traceback)."""
    lines = (msg or "").strip().splitlines()
    return lines[0] if lines else "invalid syntax"


def positions(source: Source) -> dict[cst.CSTNode, object]:
    return dict(source.wrapper.resolve(PositionProvider))
