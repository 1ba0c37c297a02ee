"""Reading and parsing a user's script: every failure becomes one located line, never a traceback."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from flortrain.errors import FlortrainError, Located
from flortrain.static.text import read_text

#: a file whose nesting exceeds a recursive walk's depth (``FT004``)
TOO_DEEP = "too deeply nested for the static pass"


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
            f"syntax error: {_first_line(e.msg)}",
            Located(path, e.lineno or 0, e.offset or 0),
            "FT002",
        ) from None
    except ValueError as e:  # e.g. source with NUL bytes
        raise FlortrainError(f"cannot compile: {e}", Located(path), "FT002") from None
    except RecursionError:  # CPython's compiler has a nesting limit of its own
        raise FlortrainError(TOO_DEEP, Located(path), "FT004") from None
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
    except RecursionError:
        raise FlortrainError(TOO_DEEP, Located(path), "FT004") from None
    return Source(path, text, MetadataWrapper(module, unsafe_skip_copy=True))


def _first_line(msg: str | None) -> str:
    """An error message as one line (the CLI contract: one line, never a traceback)."""
    lines = (msg or "").strip().splitlines()
    return lines[0] if lines else "invalid syntax"


def positions(source: Source) -> dict[cst.CSTNode, object]:
    return dict(source.wrapper.resolve(PositionProvider))
