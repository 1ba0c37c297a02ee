"""What a DataLoader's ``worker_init_fn`` reseeds in each worker: global streams, and the
generators of the worker's copy of the dataset. The RNG flow starts each loader region from
these (a stream reseeded per worker is safe there)."""

from __future__ import annotations

import libcst as cst

from flortrain.check import streams as st
from flortrain.check.reach import callees, calls_in, key_of
from flortrain.check.regions import Func, Regions
from flortrain.check.unit import Unit


def worker_seeding(
    regions: Regions, init: Func, dataset: tuple[Unit, str] | None = None
) -> tuple[set[str], set[str]]:
    """What a ``worker_init_fn`` reseeds in each worker: global streams, and attributes of the
    worker's dataset (``get_worker_info().dataset.rng = default_rng(..)``, or a method of the
    dataset that does it: ``info.dataset.reseed(info.seed)``)."""
    streams: set[str] = set()
    attrs: set[str] = set()
    for f in [init, *_local_callees(regions, init)]:
        for call in calls_in(f.unit, f.node.body):
            s = st.seeded_stream(f.unit, call)
            if s is not None:
                streams.add(s)
            fn = call.func
            if not isinstance(fn, cst.Attribute):
                continue
            k = key_of(f, fn.value)
            if k is None or ".dataset" not in f".{k}":
                continue
            if fn.attr.value in st.RESEEDS and ".dataset." in f".{k}":
                attrs.add(k.rsplit(".", 1)[-1])
            elif k.endswith("dataset") and dataset is not None:
                attrs |= _created_by(dataset, fn.attr.value)
        for node in _assigns(f.node.body):
            for t in node.targets:
                k = key_of(f, t.target)
                if k is not None and ".dataset." in f".{k}" and st.creator(f.unit, node.value):
                    attrs.add(k.rsplit(".", 1)[-1])
    return streams, attrs


def _created_by(dataset: tuple[Unit, str], method: str) -> set[str]:
    """The attributes a dataset method gives a new generator (or reseeds)."""
    unit, cls = dataset
    prog = unit.program
    qual = prog.method(cls, method)
    if qual is None:
        return set()
    out = set()
    for info in (prog.classes.get(c) for c in [cls, *prog.classes[cls].bases]):
        for attr, assigned in info.attr_assigned.items() if info else ():
            if any(m == qual and v is not None and st.creator(unit, v) for m, v in assigned):
                out.add(attr)
    node = prog.scopes[qual].node
    for call in calls_in(unit, node.body) if isinstance(node, cst.FunctionDef) else ():
        fn = call.func
        if isinstance(fn, cst.Attribute) and fn.attr.value in st.RESEEDS:
            r = fn.value
            if isinstance(r, cst.Attribute) and isinstance(r.value, cst.Name):
                out.add(r.attr.value)
    return out


def _local_callees(regions: Regions, f: Func) -> list[Func]:
    return [t for c in calls_in(f.unit, f.node.body) for t, _, _ in callees(regions, f, c)]


def _assigns(node: cst.CSTNode) -> list[cst.Assign]:
    out: list[cst.Assign] = []

    class _V(cst.CSTVisitor):
        def visit_Assign(self, n: cst.Assign) -> None:
            out.append(n)

    node.visit(_V())
    return out
