"""torch's own lists of nondeterministic operations, per torch release, as data.

Each ``data/torch-X.Y.json`` is taken from the docstring of ``torch.use_deterministic_algorithms``
of that release: the operations that become deterministic under deterministic mode
(``"list": "deterministic"``) and those that raise there (``"raises"``), each with how it is
spelled in code: a module (``torch.nn.CTCLoss``), a function (``torch.bincount``) or a tensor
method (``index_add_``), and the argument that selects the nondeterministic case
(``accumulate=True``, ``mode="bilinear"``, ``weights`` given). The file is chosen by
``CheckConfig.torch_version`` (the newest list not newer than it), never by importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import libcst as cst

from flortrain.check.unit import Unit
from flortrain.static.expressions import argument


@dataclass(frozen=True)
class Op:
    op: str  # as torch's documentation names it
    raises: bool  # raises under deterministic mode (else: made deterministic by it)
    device: str  # "cuda", "cpu" or "any"
    backward: bool  # nondeterministic in its backward pass only
    cudnn: bool  # also made deterministic by torch.backends.cudnn.deterministic = True
    #: the only case torch's kernels alert on, when narrower than the documentation says and
    #: not visible in the text (a tensor's rank or dtype): such a finding stays a warning
    caveat: str = ""

    def where(self) -> str:
        place = {"cuda": "on CUDA", "cpu": "on CPU", "any": ""}[self.device]
        return " ".join(p for p in ("in backward" if self.backward else "", place) if p)

    def describe(self, spelled: str) -> str:
        """``spelled`` with the documented operation when they differ, and the caveat."""
        out = f"`{spelled}`" if spelled == self.op else f"`{spelled}` ({self.op})"
        return out + (f", only for {self.caveat}" if self.caveat else "")


@dataclass(frozen=True)
class _Spelling:
    kind: str  # "module" | "function" | "method"
    name: str
    when: dict[str, Any] | None
    op: Op


@cache
def versions() -> tuple[tuple[int, ...], ...]:
    out = []
    for entry in resources.files("flortrain.check").joinpath("data").iterdir():
        name = entry.name
        if name.startswith("torch-") and name.endswith(".json"):
            out.append(_version(name[len("torch-") : -len(".json")]))
    return tuple(sorted(out))


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@cache
def _table(torch_version: str) -> dict[str, tuple[_Spelling, ...]]:
    wanted = _version(torch_version)[:2]
    known = versions()
    chosen = max((v for v in known if v <= wanted), default=known[0])
    name = "torch-" + ".".join(map(str, chosen)) + ".json"
    data = json.loads(resources.files("flortrain.check").joinpath("data", name).read_text())
    table: dict[str, list[_Spelling]] = {}
    for entry in data["ops"]:
        op = Op(
            entry["op"],
            entry["list"] == "raises",
            entry["device"],
            entry["backward"],
            entry.get("cudnn", False),
            entry.get("caveat", ""),
        )
        for s in entry["spelled"]:
            sp = _Spelling(s["kind"], s["name"], s.get("when"), op)
            key = sp.name if sp.kind != "method" else "." + sp.name
            table.setdefault(key, []).append(sp)
    return {k: tuple(v) for k, v in table.items()}


def matches(unit: Unit, call: cst.Call) -> list[tuple[Op, str]]:
    """The listed operations ``call`` may be, with how it is spelled."""
    table = _table(unit.config.torch_version)
    out: list[tuple[Op, str]] = []
    for q in unit.called(call):
        for sp in table.get(q, ()):
            if _applies(sp, call):
                out.append((sp.op, q.replace("torch.nn.functional.", "F.")))
    func = call.func
    if not out and isinstance(func, cst.Attribute) and not _imported_root(unit, func.value):
        for sp in table.get("." + func.attr.value, ()):
            if _applies(sp, call):
                out.append((sp.op, "." + func.attr.value))
    return out


def _imported_root(unit: Unit, expr: cst.BaseExpression) -> bool:
    """``expr`` is a dotted name rooted at an import (``asyncio``, ``np``, ``torch``): then
    ``.gather`` or ``.cumsum`` on it is a module's function, not a tensor's method."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    if not isinstance(expr, cst.Name):
        return False
    prog = unit.program
    return expr.value in prog.imported or expr.value in prog.import_origins


def _applies(sp: _Spelling, call: cst.Call) -> bool:
    when = sp.when
    if when is None:
        return True
    value = argument(call, when["arg"], when.get("pos"))
    if value is None:
        if when.get("present"):
            return False
        default = when.get("default")
        if "equals" in when:
            return bool(default == when["equals"])
        if "in" in when:
            return default in when["in"]
        return False
    if when.get("present"):
        return True
    if when.get("tensor"):
        return not isinstance(value, cst.Integer | cst.Float | cst.UnaryOperation)
    literal = _literal(value)
    if literal is _UNKNOWN:
        return True  # not known statically: the call may be the nondeterministic case
    if "equals" in when:
        return bool(literal == when["equals"])
    if "in" in when:
        return literal in when["in"]
    return True


_UNKNOWN = object()


def _literal(value: cst.BaseExpression) -> object:
    if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[value.value]
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value
    return _UNKNOWN
