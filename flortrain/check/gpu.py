"""GPU determinism facts of a script, read from its execution-order steps (:mod:`.flow`): where
deterministic mode is turned on, where CUDA starts, where ``CUBLAS_WORKSPACE_CONFIG`` is set,
and what ``torch.backends.cudnn`` is told."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from flortrain.check.flow import Step, steps
from flortrain.check.unit import Unit
from flortrain.static.expressions import argument

CUBLAS = "CUBLAS_WORKSPACE_CONFIG"
#: ``torch.cuda`` functions that do not start CUDA (queries, lazily applied seeds, AMP)
_LAZY_CUDA = frozenset(
    {
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.cuda.is_initialized",
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
    }
)
#: trainers and helpers that turn deterministic mode on and set CUBLAS_WORKSPACE_CONFIG
_FULL_DETERMINISM = frozenset(
    {"transformers.enable_full_determinism", "transformers.trainer_utils.enable_full_determinism"}
)
_TRAINERS = ("lightning", "pytorch_lightning")


@dataclass(frozen=True, eq=False)
class Mode:
    step: Step
    index: int  # the step's position in :func:`flow.steps`
    warn_only: bool
    sets_cublas: bool  # the call also sets CUBLAS_WORKSPACE_CONFIG (Lightning, transformers)


def deterministic_mode(unit: Unit) -> Mode | None:
    """The first step that turns ``torch.use_deterministic_algorithms`` on, or None."""
    for i, step in enumerate(steps(unit)):
        if isinstance(step.node, cst.Call):
            found = _mode(step.unit, step.node)
            if found is not None:
                return Mode(step, i, *found)
    return None


def _mode(unit: Unit, call: cst.Call) -> tuple[bool, bool] | None:
    names = unit.called(call)
    if "torch.use_deterministic_algorithms" in names:
        mode = argument(call, "mode", 0)
        if mode is None or _is(mode, "False"):
            return None
        warn = argument(call, "warn_only")
        return warn is not None and not _is(warn, "False"), False
    if "torch.set_deterministic_debug_mode" in names:
        level = argument(call, "debug_mode", 0)
        text = _literal_text(level)
        if text in ("default", "0"):
            return None
        return text in ("warn", "1"), False
    if names & _FULL_DETERMINISM:
        warn = argument(call, "warn_only")
        return warn is not None and not _is(warn, "False"), True
    if any(q.startswith(_TRAINERS) and q.endswith(".Trainer") for q in names):
        flag = argument(call, "deterministic")
        if flag is None or _is(flag, "False") or _is(flag, "None"):
            return None
        return _literal_text(flag) == "warn", True
    return None


def starts_cuda(step: Step) -> bool:
    """The step may be where CUDA starts: ``.cuda()``, ``.to("cuda")`` or ``.to(device)`` with a
    device named for CUDA, ``device="cuda"``, or a ``torch.cuda`` call other than a query."""
    node = step.node
    if not isinstance(node, cst.Call):
        return False
    unit = step.unit
    names = unit.called(node)
    if any(q.startswith("torch.cuda.") for q in names):
        return not names & _LAZY_CUDA and not any(q.startswith("torch.cuda.amp") for q in names)
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and not names & {"torch.cuda"}:
        return True
    device = argument(node, "device", 0) if _is_to(func) else argument(node, "device")
    return device is not None and _cuda_valued(step, device)


def _is_to(func: cst.BaseExpression) -> bool:
    return isinstance(func, cst.Attribute) and func.attr.value == "to"


def _cuda_valued(step: Step, expr: cst.BaseExpression) -> bool:
    unit = step.unit
    if isinstance(expr, cst.Name):
        owner = unit.program.binding_scope(step.scope, expr.value)
        values = owner.assigned.get(expr.value, ()) if owner is not None else ()
        return any(v is not None and "cuda" in unit.source.code(v) for v in values)
    return "cuda" in unit.source.code(expr)


def sets_cublas(step: Step) -> bool:
    """The step puts CUBLAS_WORKSPACE_CONFIG into the environment (``os.environ[...] = ``,
    ``setdefault``, ``update``, ``putenv``, or a helper that sets it)."""
    node, unit = step.node, step.unit
    if isinstance(node, cst.Assign):
        return any(
            isinstance(t.target, cst.Subscript)
            and "environ" in unit.source.code(t.target.value)
            and CUBLAS in unit.source.code(t.target)
            for t in node.targets
        )
    if isinstance(node, cst.Call):
        names = unit.called(node)
        if names & {"os.environ.setdefault", "os.environ.update", "os.putenv"}:
            return CUBLAS in unit.source.code(node)
        found = _mode(unit, node)
        return found is not None and found[1]
    return False


def cudnn_flags(unit: Unit, flag: str) -> list[tuple[Step, bool | None]]:
    """Assignments to ``torch.backends.cudnn.<flag>``, with the value when it is a literal."""
    out: list[tuple[Step, bool | None]] = []
    for step in steps(unit):
        node = step.node
        if not isinstance(node, cst.Assign):
            continue
        for t in node.targets:
            target = t.target
            if not isinstance(target, cst.Attribute) or target.attr.value != flag:
                continue
            names = step.unit.qualified_names(target)
            code = step.unit.source.code(target)
            if f"torch.backends.cudnn.{flag}" in names or code.endswith(f"cudnn.{flag}"):
                value = node.value
                literal = (
                    {"True": True, "False": False}.get(value.value)
                    if isinstance(value, cst.Name)
                    else None
                )
                out.append((step, literal))
    return out


def line_of(unit: Unit, step: Step) -> int:
    """The line of ``step`` in the checked file (of its anchor when it is in another file)."""
    return unit.where(step.node if step.unit is unit else step.anchor)[0]


def _is(expr: cst.BaseExpression, name: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == name


def _literal_text(expr: cst.BaseExpression | None) -> str | None:
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(expr, cst.Integer):
        return expr.value
    return None
