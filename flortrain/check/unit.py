"""One file under check, and the facts rules ask of it, each computed at most once.

Rules share the parse, the names' import paths (``np.random.default_rng`` is
``numpy.random.default_rng`` however numpy was imported) and flortrain's own program index and
plan, so a dozen rules cost about one pass over the file.
"""

from __future__ import annotations

from functools import cached_property

import libcst as cst
from libcst.metadata import CodeRange, PositionProvider

from flortrain.check.config import CheckConfig
from flortrain.check.names import Names, resolve_names
from flortrain.static.analysis import analyse
from flortrain.static.indexing import index
from flortrain.static.plan import Plan
from flortrain.static.program import Program
from flortrain.static.source import Source


class Unit:
    def __init__(self, source: Source, config: CheckConfig, plan: Plan | None = None) -> None:
        self.source = source
        self.config = config
        self._plan = plan  # the plan already made of this very source (record's static pass)

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
    def _names(self) -> Names:
        return resolve_names(self.module)

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """What ``node`` (a name, attribute or call's callee) may stand for, by dotted import path
        (``numpy.random.default_rng``; ``builtins.print``); names bound in the file itself keep
        their local path (``f.<locals>.rng.normal``). See :mod:`flortrain.check.names`."""
        return self._names.qualified(node)

    def called(self, call: cst.Call) -> set[str]:
        return self.qualified_names(call.func)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._names.parents.get(node)

    @cached_property
    def calls(self) -> tuple[cst.Call, ...]:
        """Every call in the file, in source order (rules scan it again and again)."""
        return tuple(self._names.calls)

    @cached_property
    def program(self) -> Program:
        return index(self.source)

    @cached_property
    def plan(self) -> Plan:
        return self._plan if self._plan is not None else analyse(self.source, prog=self.program)

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
