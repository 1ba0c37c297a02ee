"""Reading and parsing a user's script: every failure becomes one located line, never a traceback."""

from __future__ import annotations

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
    p = Path(path)
    if not p.is_file():
        raise FlortrainError("no such file", Located(path), "FT001")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise FlortrainError(f"not UTF-8 text ({e.reason})", Located(path), "FT001") from None
    except OSError as e:
        raise FlortrainError(f"cannot read: {e.strerror}", Located(path), "FT001") from None


def parse(path: str, text: str | None = None) -> Source:
    """Parse ``path`` (or ``text`` standing for it). A syntax error is a :class:`FlortrainError`
    at the offending line and column, the way Python itself would point at it."""
    if text is None:
        text = read_text(path)
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as e:
        msg = e.message.splitlines()[0] if e.message else "invalid syntax"
        raise FlortrainError(f"syntax error: {msg}", Located(path, e.raw_line, e.raw_column + 1), "FT002") from None
    # libcst accepts a few things CPython refuses (and vice versa for new syntax); compile() is the
    # judge of what can run, so the instrumented code is never the first to find out.
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise FlortrainError(
            f"syntax error: {e.msg}", Located(path, e.lineno or 0, e.offset or 0), "FT002"
        ) from None
    except ValueError as e:  # e.g. source with NUL bytes
        raise FlortrainError(f"cannot compile: {e}", Located(path), "FT002") from None
    return Source(path, text, MetadataWrapper(module, unsafe_skip_copy=True))


def positions(source: Source) -> dict[cst.CSTNode, object]:
    return dict(source.wrapper.resolve(PositionProvider))
