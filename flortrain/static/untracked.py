"""Writes to tensor memory that the tensor's version counter does not see.

Every in-place op on a tensor (or on a view of it: ``detach()``, slicing) bumps its version
counter, ``tensor._version``; the runtime uses it to tell, without reading a byte, that a large
tensor is unchanged since its last checkpoint (it is then neither copied nor written again) and
which live modules a block changed (the alias watch). Two ways of writing escape it: through
``.data`` (``p.data.mul_(0.9)``, ``p.data += g``, ``p.data[0] = 1``: ``.data`` is a new tensor
with a counter of its own) and through a NumPy view (``t.numpy()[i] = x``). A script with either
gets both shortcuts turned off at record: each checkpoint then copies every tensor, and the alias
watch compares copies.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from flortrain.static.plan import SourceRange
from flortrain.static.source import Source


def _is_data(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and node.attr.value == "data"


def _is_numpy_view(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "numpy"
    )


def _writes_through(target: cst.BaseExpression) -> bool:
    """``x.data`` or ``x.data[...]`` / ``x.numpy()[...]`` as an assignment target."""
    if _is_data(target):
        return True
    return isinstance(target, cst.Subscript) and (
        _is_data(target.value) or _is_numpy_view(target.value)
    )


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.found: list[SourceRange] = []

    def _add(self, node: cst.CSTNode) -> None:
        pos = self.get_metadata(PositionProvider, node)
        self.found.append(SourceRange(pos.start.line, pos.start.column + 1, pos.end.line))

    def visit_Call(self, node: cst.Call) -> None:
        f = node.func
        in_place = (
            isinstance(f, cst.Attribute)
            and f.attr.value.endswith("_")
            and not f.attr.value.startswith("_")
        )
        if (
            in_place
            and isinstance(f, cst.Attribute)
            and (_is_data(f.value) or _is_numpy_view(f.value))
        ):
            self._add(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if _writes_through(node.target):
            self._add(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            if isinstance(t.target, cst.Subscript) and _writes_through(t.target):
                self._add(node)


def untracked_writes(source: Source) -> tuple[SourceRange, ...]:
    """Where a module writes tensor memory behind the version counter's back. Visited through the
    source's own wrapper, whose positions the index has already resolved: a wrapper of its own
    would compute them again (a second of a 2,400-line file's instrumentation)."""
    finder = _Finder()
    source.wrapper.visit(finder)
    return tuple(finder.found)
