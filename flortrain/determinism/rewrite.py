"""The static half of ``--deterministic``: per-example generators at the draw sites (DETrain §4).

The RNG-safety analysis (:mod:`flortrain.check.rngflow`) walks every data-parallel region: a
Dataset's ``__getitem__``/``__iter__`` and what it calls, whatever its loader's ``num_workers``
(the main process loads too, and must draw the same numbers), and the callables handed to thread
and process pools. Each draw it finds there from python's ``random``, numpy's global stream or
torch's global stream is rewritten, in place, to draw from the current example's generator:

- ``np.random.normal(x)`` -> ``__flortrain_det__.numpy().normal(x)`` (python's alike);
- ``torch.rand(3)`` / ``t.normal_()`` -> the same call with ``generator=__flortrain_det__.torch()``;
- ``ex.map(f, xs)`` -> ``__flortrain_det__.mapped("site", ex.map, f, xs)`` and
  ``ex.submit(f, x)`` -> ``ex.submit(__flortrain_det__.keyed("site", f), x)``: each call gets the
  generators of its submission (:mod:`flortrain.determinism.examples`).

A draw the analysis finds safe because the call seeds it itself (``np.random.seed(i)`` first) is
left as written. Every edit stays on its line, so block ids, probes and tracebacks keep their
lines. ``__flortrain_det__`` is a builtin the runtime installs: no line is added for an import.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from flortrain.check import streams as st
from flortrain.check.config import CheckConfig
from flortrain.check.regions import Kind, Region, Regions, entry_methods, resolve_ref
from flortrain.check.rngflow import Draw, Safe, flow_draws
from flortrain.check.unit import Unit
from flortrain.determinism.report import Rewritten
from flortrain.static.source import parse

#: the name rewritten code calls (a builtin while a deterministic run is under way)
NAME = "__flortrain_det__"

_MAPS = frozenset({"map", "imap", "imap_unordered", "starmap", "map_async", "starmap_async"})
_GLOBALS = {st.NUMPY: ("numpy.random.", "numpy"), st.PYTHON: ("random.", "python")}


@dataclass
class _Edits:
    text: str
    out: list[tuple[int, int, str]] = field(default_factory=list)

    def put(self, start: int, end: int, new: str) -> None:
        self.out.append((start, end, new))

    def apply(self) -> str:
        text, last = self.text, len(self.text) + 1
        for start, end, new in sorted(self.out, key=lambda e: (e[0], e[1]), reverse=True):
            if end > last:  # overlaps an edit already made: never in the shapes written here
                continue
            text = text[:start] + new + text[end:]
            last = start
        return text


def _regions(regions: Regions) -> list[Region]:
    """The regions whose draws become per-example: datasets (also those loaded in the main
    process, ``num_workers=0``, which the check leaves out) and pool callables."""
    unit = regions.unit
    chosen = [
        r
        for r in regions.all
        if not r.elsewhere
        and r.kind in (Kind.LOADER, Kind.LOADER_THREADS, Kind.THREADS, Kind.PROCESSES)
        and (r.dataset is not None or r.loader is None)
    ]
    for loader in regions.loaders:
        cls = regions.dataset_class(loader) if loader.kind is None else None
        if cls is not None and cls[0] is unit:
            chosen.extend(Region(Kind.LOADER, f, None, loader, cls) for f in entry_methods(*cls))
    return chosen


def _generator_kw(unit: Unit, call: cst.Call, edits: _Edits) -> None:
    end = unit.span(call)[1]
    sep = "" if not call.args else " " if isinstance(call.args[-1].comma, cst.Comma) else ", "
    edits.put(end - 1, end - 1, f"{sep}generator={NAME}.torch()")


def _draw(unit: Unit, draw: Draw, edits: _Edits) -> str | None:
    """Rewrite one draw; or why it stays as written."""
    call = draw.node
    assert isinstance(call, cst.Call)
    stream = st.global_draw(unit, call)
    if stream in _GLOBALS:
        prefix, which = _GLOBALS[stream]
        q = next(q for q in sorted(unit.called(call)) if q.startswith(prefix))
        start, end = unit.span(call.func)
        edits.put(start, end, f"{NAME}.{which}().{q.rsplit('.', 1)[1]}")
        return None
    if stream == st.TORCH and not any(q.endswith("_like") for q in unit.called(call)):
        _generator_kw(unit, call, edits)
        return None
    f = call.func
    if stream is None and isinstance(f, cst.Attribute) and f.attr.value in st.TENSOR_DRAWS:
        _generator_kw(unit, call, edits)
        return None
    return "it draws from torch's stream inside a call flortrain cannot give a generator"


def _submission(unit: Unit, call: cst.Call, label: str, edits: _Edits) -> bool:
    """Key one pool submission by its site and order; False when its shape is not one known."""
    f, first = call.func, call.args[0]
    if first.keyword is not None or first.star:
        return False
    if isinstance(f, cst.Attribute) and f.attr.value in _MAPS:
        start, _ = unit.span(call)
        _, func_end = unit.span(f)
        arg_start, _ = unit.span(first)
        paren = unit.text.index("(", func_end, arg_start)
        edits.put(start, start, f'{NAME}.mapped("{label}", ')
        edits.put(paren, paren + 1, ", ")
        return True
    start, end = unit.span(first.value)
    edits.put(start, start, f'{NAME}.keyed("{label}", ')
    edits.put(end, end, ")")
    return True


def _main_loops(unit: Unit, edits: _Edits) -> None:
    """``flortrain run --deterministic``: the main loops count their own iterations, as a
    record's session does (a record asks the session instead)."""
    mains = {m.span.line: m.id for m in unit.plan.main_loops}
    for node in _loops(unit.module):
        main = mains.get(unit.where(node)[0])
        if main is None:
            continue
        if isinstance(node, cst.For):
            start, end = unit.span(node.iter)
            edits.put(start, start, f'{NAME}.epochs("{main}", ')
            edits.put(end, end, ")")
        else:
            start, end = unit.span(node.test)
            edits.put(start, start, "(")
            edits.put(end, end, f') and {NAME}.tick("{main}") or {NAME}.leave("{main}")')


def _loops(node: cst.CSTNode) -> Iterator[cst.For | cst.While]:
    for child in node.children:
        if isinstance(child, cst.For | cst.While):
            yield child
        yield from _loops(child)


def determinize(path: str, text: str, count_main_loops: bool = False) -> Rewritten:
    """``text`` (the file ``path``) with its region draws on per-example generators; with
    ``count_main_loops``, its main loops also tell the runtime their iterations."""
    unit = Unit(parse(path, text), CheckConfig())
    regions = Regions(unit)
    edits = _Edits(text)
    done: set[int] = set()
    drawing: set[int] = set()  # the region entries (by node id) with a rewritten draw
    left: list[str] = []
    for draw in flow_draws(regions, _regions(regions)):
        if draw.key not in (st.NUMPY, st.PYTHON, st.TORCH) or draw.func.unit is not unit:
            continue
        if isinstance(draw.state, Safe) and draw.state.ephemeral:
            continue  # seeded by this very call
        drawing.add(id(draw.region.entry.node))
        if id(draw.node) in done:
            continue
        done.add(id(draw.node))
        why = _draw(unit, draw, edits)
        if why is not None:
            line, col = unit.where(draw.node)
            left.append(f"{line}:{col}: {why}")
    draws = len(done) - len(left)
    pools = 0
    per_scope: dict[str, int] = {}
    for call, kind, target, scope in regions.submissions():
        if kind is Kind.REPLICAS:
            continue
        k = per_scope.get(scope.qualname, 0)
        per_scope[scope.qualname] = k + 1
        if not any(id(f.node) in drawing for f in resolve_ref(unit, target, scope)):
            continue
        if _submission(unit, call, f"{scope.qualname}#{k}", edits):
            pools += 1
    if count_main_loops:
        _main_loops(unit, edits)
    return Rewritten(edits.apply(), draws, pools, tuple(left))
