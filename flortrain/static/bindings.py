"""How many times each name is bound anywhere in a script, in any scope.

Two questions need it, both about a name whose meaning the static pass assumes: is a builtin
(``int``, ``dict``) still the builtin wherever the script uses it, and is a class name bound by
its ``class`` statement alone (so ``Config.from_args(..)`` runs that class's method). Python's
scopes would answer "here"; counting every binding of the name in the whole file answers
"everywhere", which is what an assumption made once for the file needs, and it cannot be wrong
in the unsafe direction: a name bound twice anywhere is simply not assumed about.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from flortrain.static.expressions import names_of


class Bindings:
    """Every binding of every name in a module: assignment, ``for`` and comprehension targets,
    ``with``/``except``/import aliases, walrus targets, parameters, ``def``/``class`` names,
    ``global``/``nonlocal`` declarations and ``del``. A star import binds unknown names."""

    def __init__(self, module: cst.Module) -> None:
        visitor = _Collector()
        module.visit(visitor)
        self.counts: Counter[str] = visitor.counts
        self.star_import = visitor.star_import

    def count(self, name: str) -> int:
        return self.counts[name]

    def unbound(self, name: str) -> bool:
        """``name`` is never bound by the script (a builtin stays the builtin)."""
        return not self.star_import and self.counts[name] == 0

    def bound_once(self, name: str) -> bool:
        """``name`` has exactly one binding in the whole script (its ``class`` statement, say)."""
        return not self.star_import and self.counts[name] == 1


class _Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.star_import = False

    def _bind(self, target: cst.BaseExpression) -> None:
        self.counts.update(names_of(target))  # `x.a` and `x[i]` bind no name

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self.counts[node.name.value] += 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.counts[node.name.value] += 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.counts[node.name.value] += 1

    def visit_Global(self, node: cst.Global) -> None:
        self.counts.update(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.counts.update(n.name.value for n in node.names)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is None:  # `import a.b` binds `a`; with `as`, AsName counts it
            name = node.name
            while isinstance(name, cst.Attribute):
                name = name.value  # type: ignore[assignment]
            if isinstance(name, cst.Name):
                self.counts[name.value] += 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.star_import = True

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self.counts[node.name.value] += 1

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self.counts[node.name.value] += 1

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self.counts[node.rest.value] += 1
