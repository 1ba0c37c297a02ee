"""The one transform: apply a plan to a script in a single libcst pass.

Memoized loops become SkipBlocks without re-indenting the user's code::

    _flortrain_L24 = __flortrain__.block("L24")
    for batch in _flortrain_L24.iterate(loader):        # empty when the block is skipped
        ...
    if _flortrain_L24.end({"opt": lambda: opt}, {"total": lambda: total}):
        if _flortrain_L24.has("total"): total = _flortrain_L24.value("total")  # by assignment

``while`` loops test ``_flortrain_L24.live() and (cond)``. The main loop is bracketed by
``main_enter``/``main_exit`` and its body starts with ``main_iteration``. A statement of its body
that a pseudoresume may leave out (fast-forward) runs under ``if __flortrain__.forward(..):``. Probes (statements added
since the record) run inside ``with __flortrain__.probe(n):``, under ``if
__flortrain__.probing():`` (false before a parallel-replay worker's segment). Lambdas defer reading each
changeset element to block end, so a name the loop left unbound (assigned only under ``if ddp:``)
is recorded as absent and stays unbound on replay, not a crash.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import PositionProvider

from flortrain.errors import FlortrainError, Located
from flortrain.static.expressions import impurity
from flortrain.static.plan import (
    Block,
    Change,
    FastForward,
    Instrumentation,
    MainLoop,
    Restore,
)
from flortrain.static.source import TOO_DEEP, Source

RUNTIME = "__flortrain__"
IMPORT = f"import flortrain.runtime as {RUNTIME}"


def _stmt(code: str) -> cst.SimpleStatementLine | cst.BaseCompoundStatement:
    stmt = cst.parse_statement(code)
    assert isinstance(stmt, cst.SimpleStatementLine | cst.BaseCompoundStatement)
    return stmt


def _frame(block: Block | MainLoop) -> str:
    """The block's local variable: its id made an identifier (a module's ids carry ``.`` and
    ``:``, ``mingpt.trainer:L24``), still ``_flortrain_\\w+`` as the line map expects."""
    return "_flortrain_" + re.sub(r"\W", "_", block.id)


def _getters(changes: Sequence[Change], restore: Restore) -> str:
    """``{"expr": lambda: expr, ...}``: each element read when the runtime asks, so one the run
    left unbound (assigned only under ``if ddp:``) is absent, not an error."""
    return (
        "{"
        + ", ".join(f'"{c.expr}": lambda: {c.expr}' for c in changes if c.restore is restore)
        + "}"
    )


def _reassign(var: str, changes: Sequence[Change]) -> list[str]:
    """The assignments that put restored rebound names back, indented under an ``if``."""
    out = []
    for c in changes:
        if c.restore is Restore.REBOUND:
            target = f'globals()["{c.expr}"]' if c.is_global else c.expr
            out.append(f'    if {var}.has("{c.expr}"): {target} = {var}.value("{c.expr}")')
    return out


def _end_statement(block: Block) -> cst.BaseStatement:
    var = _frame(block)
    call = f"{var}.end({_getters(block.changeset, Restore.IN_PLACE)}, {_getters(block.changeset, Restore.REBOUND)})"
    lines = _reassign(var, block.changeset)
    if not lines:
        return _stmt(call + "\n")
    return _stmt("\n".join([f"if {call}:", *lines]) + "\n")


def _iteration_statements(main: MainLoop) -> list[cst.BaseStatement]:
    """The first statements of a main-loop iteration. With a boundary state (iteration spans)::

    _flortrain_M12 = __flortrain__.main_iteration("M12", {objects}, {names}, values)
    if _flortrain_M12.jumped():      # replay restored a later iteration's boundary
        if _flortrain_M12.has("step"): step = _flortrain_M12.value("step")
    """
    if main.boundary is None:
        return [_stmt(f'{RUNTIME}.main_iteration("{main.id}")\n')]
    b = main.boundary
    var = _frame(main)
    values = "".join(f'"{v}", ' for v in b.values)
    call = (
        f'{var} = {RUNTIME}.main_iteration("{main.id}", {_getters(b.changes, Restore.IN_PLACE)},'
        f" {_getters(b.changes, Restore.REBOUND)}, ({values}))\n"
    )
    out: list[cst.BaseStatement] = [_stmt(call)]
    lines = _reassign(var, b.changes)
    if lines:
        out.append(_stmt("\n".join([f"if {var}.jumped():", *lines]) + "\n"))
    return out


def _gate(main_id: str, line: int, step: FastForward) -> str:
    """``__flortrain__.forward("M12", 34, ("model",), ("xs",))``: true unless a pseudoresume
    leaves the statement out."""
    modules = "".join(f'"{m}", ' for m in step.modules)
    containers = "".join(f'"{c}", ' for c in step.containers)
    return f'{RUNTIME}.forward("{main_id}", {line}, ({modules}), ({containers}))'


def _prepend(body: cst.BaseSuite, stmts: Sequence[cst.BaseStatement]) -> cst.BaseSuite:
    if isinstance(body, cst.IndentedBlock):
        return body.with_changes(body=[*stmts, *body.body])
    assert isinstance(body, cst.SimpleStatementSuite)
    return cst.IndentedBlock(body=[*stmts, cst.SimpleStatementLine(body=body.body)])


#: Statements a probe can be (besides loops, handled in leave_For/leave_While): any statement a
#: user can add, including a helper ``def`` or ``class`` written for the probe.
_PROBEABLE = (
    cst.SimpleStatementLine,
    cst.If,
    cst.With,
    cst.Try,
    cst.TryStar,
    cst.Match,
    cst.FunctionDef,
    cst.ClassDef,
)


class _Transformer(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, inst: Instrumentation) -> None:
        super().__init__()
        self.inst = inst
        self.applied: set[int] = set()
        self.gated: set[int] = set()  # fast-forward gates placed
        # `elif` clauses: an If node in another If's orelse slot cannot be wrapped in a `with`
        # (libcst would print the `with` at the If's indentation, detached from the chain)
        self.elifs: set[cst.If] = set()

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.If):
            self.elifs.add(node.orelse)

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _loop(
        self, original: cst.For | cst.While, updated: cst.For | cst.While
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        line = self._line(original)
        lead = updated.leading_lines
        if line in self.inst.blocks:
            block = self.inst.blocks[line]
            self.applied.add(line)
            var = _frame(block)
            if isinstance(updated, cst.For):
                it = cst.parse_expression(f"{var}.iterate(0)")
                assert isinstance(it, cst.Call)
                loop: cst.For | cst.While = updated.with_changes(
                    iter=it.with_changes(args=[cst.Arg(updated.iter)]), leading_lines=[]
                )
            else:
                test = cst.BooleanOperation(
                    left=cst.parse_expression(f"{var}.live()"),
                    operator=cst.And(),
                    right=updated.test.with_changes(
                        lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
                    ),
                )
                loop = updated.with_changes(test=test, leading_lines=[])
            end_line = self.get_metadata(PositionProvider, original).end.line
            values = ", ".join(f'"{v}"' for v in block.values)
            extra = f", values=({values},)" if values else ""
            if block.unchecked:
                extra += ", unchecked=(" + "".join(f'"{v}", ' for v in block.unchecked) + ")"
            # read as the instance starts too: which objects the loop replaces (``identity``)
            for kw, kind in (("objects", Restore.IN_PLACE), ("names", Restore.REBOUND)):
                getters = _getters(block.changeset, kind)
                if getters != "{}":
                    extra += f", {kw}={getters}"
            enter = _stmt(f'{var} = {RUNTIME}.block("{block.id}", {line}, {end_line}{extra})\n')
            assert isinstance(enter, cst.SimpleStatementLine)
            return cst.FlattenSentinel(
                [enter.with_changes(leading_lines=lead), loop, _end_statement(block)]
            )
        if line in self.inst.mains:
            main = self.inst.mains[line]
            self.applied.add(line)
            body = _prepend(updated.body, _iteration_statements(main))
            if main.boundary is not None and isinstance(updated, cst.For):
                # the runtime's generator can jump the iterator to a later iteration on replay
                it = cst.parse_expression(f'{RUNTIME}.main_iter("{main.id}", 0)')
                assert isinstance(it, cst.Call)
                updated = updated.with_changes(
                    iter=it.with_changes(args=[it.args[0], cst.Arg(updated.iter)])
                )
            enter = _stmt(f'{RUNTIME}.main_enter("{main.id}")\n')
            assert isinstance(enter, cst.SimpleStatementLine)
            return cst.FlattenSentinel(
                [
                    enter.with_changes(leading_lines=lead),
                    updated.with_changes(body=body, leading_lines=[]),
                    _stmt(f'{RUNTIME}.main_exit("{main.id}")\n'),
                ]
            )
        return updated

    def leave_For(
        self, original_node: cst.For, updated_node: cst.For
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        return self._forward(
            original_node, self._probe(original_node, self._loop(original_node, updated_node))
        )

    def leave_While(
        self, original_node: cst.While, updated_node: cst.While
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        return self._forward(
            original_node, self._probe(original_node, self._loop(original_node, updated_node))
        )

    def _forward(
        self,
        original: cst.BaseStatement,
        updated: cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement],
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        """A statement a pseudoresume may leave out, under ``if __flortrain__.forward(..):``
        (a memoized loop with its enter and end statements)."""
        line = self._line(original)
        if line not in self.inst.forward or line in self.gated:
            return updated
        self.gated.add(line)
        self.applied.add(line)
        main_id, step = self.inst.forward[line]
        nodes = list(updated.nodes) if isinstance(updated, cst.FlattenSentinel) else [updated]
        first = nodes[0]
        assert isinstance(first, cst.SimpleStatementLine | cst.BaseCompoundStatement)
        lead = first.leading_lines
        nodes[0] = first.with_changes(leading_lines=[])
        gate = _stmt(f"if {_gate(main_id, line, step)}:\n    pass\n")
        assert isinstance(gate, cst.If)
        return gate.with_changes(body=cst.IndentedBlock(body=nodes), leading_lines=lead)

    def _probe(
        self,
        original: cst.BaseStatement,
        updated: cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement],
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        line = self._line(original)
        if (
            line not in self.inst.probes
            or original in self.elifs
            or not isinstance(updated, cst.SimpleStatementLine | cst.BaseCompoundStatement)
        ):
            return updated  # unapplied: transform() reports the line as not found
        self.applied.add(line)
        lead = updated.leading_lines
        probed = self._isolated(original, updated.with_changes(leading_lines=[]), line)
        # before a worker's segment no probe runs: its output would be dropped, and what it
        # reads may be a name only a block binds, whose restored checkpoint does not hold it
        gate = _stmt(f"if {RUNTIME}.probing():\n    pass\n")
        assert isinstance(gate, cst.If)
        return gate.with_changes(body=cst.IndentedBlock(body=[probed]), leading_lines=lead)

    def _isolated(
        self,
        original: cst.BaseStatement,
        updated: cst.SimpleStatementLine | cst.BaseCompoundStatement,
        line: int,
    ) -> cst.BaseStatement:
        """The probe statement run under ``with __flortrain__.probe(n):``."""
        wrapper = _stmt(f"with {RUNTIME}.probe({self.inst.probes[line]}):\n    pass\n")
        assert isinstance(wrapper, cst.With)
        if (
            isinstance(original, cst.If)
            and isinstance(updated, cst.If)
            and updated.orelse is None
            and impurity(original.test) is None
        ):
            # `if i % 100 == 0: print(...)`: isolation (saving every RNG stream and module mode)
            # costs more than a training step of a small model, and the test is false on almost
            # every iteration. A test that only reads values cannot perturb training, so only a
            # true test pays for isolation.
            body = updated.body
            if isinstance(body, cst.IndentedBlock):  # its header and footer comments stay put
                wrapped = wrapper.with_changes(body=cst.IndentedBlock(body=body.body))
                return updated.with_changes(body=body.with_changes(body=[wrapped]))
            assert isinstance(body, cst.SimpleStatementSuite)
            one = cst.SimpleStatementLine(
                body=body.body, trailing_whitespace=body.trailing_whitespace
            )
            wrapped = wrapper.with_changes(body=cst.IndentedBlock(body=[one]))
            return updated.with_changes(body=cst.IndentedBlock(body=[wrapped]))
        return wrapper.with_changes(body=cst.IndentedBlock(body=[updated]))

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[no-untyped-def]
        updated = super().on_leave(original_node, updated_node)
        if isinstance(original_node, _PROBEABLE) and isinstance(updated, cst.BaseStatement):
            return self._forward(original_node, self._probe(original_node, updated))
        return updated


def _import_index(body: Sequence[cst.BaseStatement]) -> int:
    i = 0
    if body and isinstance(body[0], cst.SimpleStatementLine):
        first = body[0].body[0] if body[0].body else None
        if isinstance(first, cst.Expr) and isinstance(
            first.value, cst.SimpleString | cst.ConcatenatedString
        ):
            i = 1
    while i < len(body):
        s = body[i]
        if (
            isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.ImportFrom)
            and isinstance(s.body[0].module, cst.Name)
            and s.body[0].module.value == "__future__"
        ):
            i += 1
            continue
        break
    return i


def transform(source: Source, inst: Instrumentation) -> str:
    """The instrumented code as text; every requested loop and probe must have been found."""
    t = _Transformer(inst)
    try:
        module = source.wrapper.visit(t)
        body = list(module.body)
        body.insert(_import_index(body), _stmt(IMPORT + "\n"))
        code = module.with_changes(body=body).code
    except RecursionError:
        # libcst walks the tree recursively; a huge implicit string concatenation or a deeply
        # nested expression exhausts the stack. A one-line refusal, not a traceback.
        raise FlortrainError(TOO_DEEP, Located(source.path), "FT004") from None
    missing = (
        set(inst.blocks) | set(inst.mains) | set(inst.probes) | set(inst.forward)
    ) - t.applied
    if missing:
        raise ValueError(f"instrumentation points not found at lines {sorted(missing)}")
    return code
