"""One file under check, and the facts rules ask of it, each computed at most once.

Rules share the parse, libcst's qualified names (``np.random.default_rng`` is
``numpy.random.default_rng`` however numpy was imported) and flortrain's own program index and
plan, so a dozen rules cost about one pass over the file.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import (
    CodeRange,
    ParentNodeProvider,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
)
from libcst.metadata.base_provider import LazyValue  # type: ignore[attr-defined]

from flortrain.static.source import Source

if TYPE_CHECKING:
    from flortrain.check.config import CheckConfig
    from flortrain.static.plan import Plan
    from flortrain.static.program import Program


class Unit:
    def __init__(self, source: Source, config: CheckConfig) -> None:
        self.source = source
        self.config = config

    @property
    def path(self) -> str:
        return self.source.path

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def module(self) -> cst.Module:
        return self.source.module

    @cached_property
    def positions(self) -> dict[cst.CSTNode, CodeRange]:
        return dict(self.source.wrapper.resolve(PositionProvider))

    def where(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based line and column of ``node``'s start."""
        start = self.positions[node].start
        return start.line, start.column + 1

    @cached_property
    def _qualified(self) -> dict[cst.CSTNode, object]:
        return dict(self.source.wrapper.resolve(QualifiedNameProvider))

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """What ``node`` (a name, attribute or call's callee) may stand for, by dotted import path
        (``numpy.random.default_rng``); names bound in the file itself keep their local path
        (``Net.forward``)."""
        found = self._qualified.get(node, ())
        if isinstance(found, LazyValue):  # libcst resolves qualified names on first access
            found = self._qualified[node] = found()  # and again on every access: keep it
        if not isinstance(found, set | frozenset | list | tuple):
            return set()
        return {q.name for q in found if isinstance(q, QualifiedName)}

    def called(self, call: cst.Call) -> set[str]:
        return self.qualified_names(call.func)

    @cached_property
    def _parents(self) -> dict[cst.CSTNode, cst.CSTNode]:
        return dict(self.source.wrapper.resolve(ParentNodeProvider))

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    @cached_property
    def calls(self) -> tuple[cst.Call, ...]:
        """Every call in the file, in source order."""
        found: list[cst.Call] = []

        class _Calls(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                found.append(node)

        self.module.visit(_Calls())
        return tuple(found)

    @cached_property
    def program(self) -> Program:
        from flortrain.static.program import index

        return index(self.source)

    @cached_property
    def plan(self) -> Plan:
        from flortrain.static.analysis import analyse

        return analyse(self.source)

    @cached_property
    def uses_cuda(self) -> bool:
        """The file runs on a GPU as far as its text says (``.cuda()``, ``"cuda"``,
        ``torch.cuda``): then GPU-only hazards are errors, elsewhere warnings."""
        t = self.text
        return ".cuda(" in t or "'cuda" in t or '"cuda' in t or "torch.cuda" in t

    def offset(self, line: int, col: int) -> int:
        """The character offset of a 1-based line and column (for :class:`Edit`)."""
        return self._line_starts[line - 1] + col - 1

    @cached_property
    def _line_starts(self) -> list[int]:
        starts = [0]
        for i, ch in enumerate(self.text):
            if ch == "\n":
                starts.append(i + 1)
        return starts

    def span(self, node: cst.CSTNode) -> tuple[int, int]:
        """``node``'s start and end character offsets."""
        r = self.positions[node]
        return (
            self.offset(r.start.line, r.start.column + 1),
            self.offset(r.end.line, r.end.column + 1),
        )
