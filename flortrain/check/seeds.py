"""Where a worker's seed comes from: the worker id, torch's per-worker seed, values fixed for
the run, or the clock.

A small taint pass over a ``worker_init_fn`` and the helpers it calls (``set_seed(seed +
worker_id)``), through local assignments and parameters: a seed is right only when torch
derived it (``torch.initial_seed()``, ``get_worker_info().seed``, or a stream torch has already
reseeded in the worker).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import streams as st
from flortrain.check.reach import callees, calls_in
from flortrain.check.regions import Func, Regions
from flortrain.check.rngflow import version
from flortrain.check.unit import Unit

WID, RUN, TORCH, ENTROPY = "worker id", "run", "torch", "entropy"
#: reading a global stream's state (``np.random.get_state()[1][0] + worker_id``)
_STATES = {"numpy.random.get_state": st.NUMPY, "random.getstate": st.PYTHON}
_ENTROPY = ("time.", "os.getpid", "os.urandom", "uuid.", "datetime.", "secrets.")


def seeds(
    regions: Regions, func: Func, bound: dict[str, set[str]], depth: int
) -> Iterator[tuple[cst.CSTNode | None, str, set[str]]]:
    """Seeding calls in ``func`` (and what it calls) whose seed torch did not derive."""
    for call in calls_in(func.unit, func.node.body):
        seed = _seed_arg(func.unit, call)
        if seed is not None:
            src = _sources(func, seed, bound, set())
            if TORCH not in src and ENTROPY not in src:
                yield call, func.unit.source.code(call), src
            continue
        if depth < 4:
            for target, binding, _ in callees(regions, func, call):
                inner = {
                    p: _sources(func, arg, bound, set())
                    for p, arg in binding.items()
                    if p != (target.self_param or "")
                }
                for node, text, src in seeds(regions, target, inner, depth + 1):
                    yield (node if target.unit is func.unit else call), text, src


def _seed_arg(unit: Unit, call: cst.Call) -> cst.BaseExpression | None:
    """The seed of a seeding call or generator creation (None: not one, or no seed given)."""
    f = call.func
    reseed = isinstance(f, cst.Attribute) and f.attr.value in ("seed", "manual_seed")
    if st.seeded_stream(unit, call) or st.creator(unit, call) or reseed:
        if isinstance(f, cst.Attribute) and st.creator(unit, f.value):
            pass  # torch.Generator().manual_seed(s): the seed is this call's argument
        return call.args[0].value if call.args else None
    return None


def _reseeded(unit: Unit) -> set[str]:
    """The global streams torch has reseeded when a worker_init_fn runs."""
    out = {st.PYTHON, st.TORCH}
    if version(unit.config.torch_version) >= (1, 9):
        out.add(st.NUMPY)
    return out


def _sources(func: Func, expr: cst.CSTNode, bound: dict[str, set[str]], seen: set[str]) -> set[str]:
    """Where a seed's value comes from: the worker id, torch's per-worker seed, values fixed
    for the run, or the clock and the like."""
    if isinstance(expr, cst.Name):
        return _name_sources(func, expr.value, bound, seen)
    if isinstance(expr, cst.Call):
        return _call_sources(func, expr, bound, seen)
    if isinstance(expr, cst.Attribute):
        return _sources(func, expr.value, bound, seen)
    if isinstance(expr, cst.BaseNumber | cst.BaseString):
        return set()
    out: set[str] = set()
    for child in expr.children:
        if isinstance(child, cst.BaseExpression):
            out |= _sources(func, child, bound, seen)
    return out


def _name_sources(func: Func, name: str, bound: dict[str, set[str]], seen: set[str]) -> set[str]:
    """A name's: a parameter's as bound by the caller, a local's from its assignments."""
    if name in bound:
        return bound[name]
    if func.is_local(name) and name not in seen and not isinstance(func.node, cst.Lambda):
        out: set[str] = set()
        for v in func.scope.assigned.get(name, []):
            out |= _sources(func, v, bound, seen | {name}) if v is not None else {RUN}
        return out
    if name in ("True", "False", "None"):
        return set()
    return {RUN}


def _call_sources(
    func: Func, expr: cst.Call, bound: dict[str, set[str]], seen: set[str]
) -> set[str]:
    """A call's: torch's seed, a stream torch reseeded, the clock, else its receiver's and
    arguments' (``int(seed) + worker_id``)."""
    called = func.unit.called(expr)
    if any(q.startswith("torch.") for q in called):
        return {TORCH}
    stream = st.global_draw(func.unit, expr) or next(
        (_STATES[q] for q in called if q in _STATES), None
    )
    if stream in _reseeded(func.unit):
        return {TORCH}  # a stream torch already reseeded in this worker
    if any(q.startswith(_ENTROPY) for q in called):
        return {ENTROPY}
    out: set[str] = set()
    if isinstance(expr.func, cst.Attribute):  # `x.item()`: the receiver's
        out |= _sources(func, expr.func.value, bound, seen)
    for a in expr.args:
        out |= _sources(func, a.value, bound, seen)
    return out
