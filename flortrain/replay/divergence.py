"""What diverged between two runs of one script, by name: the state part and the tensor in it,
or the random stream.

A checkpoint's digests (:mod:`flortrain.checkpoint.codec`) hold one entry per part
(``extra:module#0``) and one per tensor below it (``extra:module#0/weight``); a main-loop
boundary's hold one per global random stream. ``diff`` compares a replay with its record and
``verify`` two records and their resumes, both through these functions, so both name a
divergence the same way: ``module#0.weight``, ``opt.state.0.momentum_buffer``, ``rng.torch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from flortrain.runtime import rng

#: (main id, entry, iteration): a main-loop boundary
Boundary = tuple[str, int, int]


def part_name(key: str) -> str:
    """How a digest's key is shown: ``extra:module#0/state.weight`` as ``module#0.weight``,
    ``.../grads.weight`` as ``module#0.weight.grad`` (a captured object's ``state`` and
    ``grads``, :mod:`flortrain.checkpoint.capture`)."""
    name = key.split(":", 1)[1] if ":" in key else key
    part, _, path = name.partition("/")
    if path.startswith("state."):
        path = path.removeprefix("state.")
    elif path.startswith("grads."):
        path = path.removeprefix("grads.") + ".grad"
    return f"{part}.{path}" if path else part


def stream_name(stream: str) -> str:
    """How a random stream is shown: ``torch`` as ``rng.torch``."""
    return f"rng.{stream}"


def _comparable(a: str, b: str) -> bool:
    # digests made different ways (the blob format's, or the fallback walk's when one run's
    # payload held something the format does not take) are not comparable
    return a[:1] == b[:1]


def state_differences(ra: Mapping[str, str], rb: Mapping[str, str]) -> list[str]:
    """The parts whose digests differ, in ``ra``'s order, each as the first of its tensors that
    differs where one does (a part whose skeleton alone differs, a changed flag or step count,
    is named itself). Keys are compared only where both runs have them."""
    # a tensor two parts hold (a parameter in its module and in its optimizer's ``params``) is
    # named by its module's key
    by_module = {d: k for k, d in ra.items() if "/" in k and k.startswith("extra:module#")}
    out: list[str] = []
    for key, da in ra.items():
        if "/" in key or key not in rb or not _comparable(da, rb[key]) or da == rb[key]:
            continue
        prefix = key + "/"
        tensor = next(
            (
                k
                for k, d in ra.items()
                if k.startswith(prefix) and k in rb and _comparable(d, rb[k]) and d != rb[k]
            ),
            None,
        )
        name = part_name(by_module.get(ra[tensor], tensor) if tensor else key)
        if name not in out:
            out.append(name)
    return out


def moving_streams(ra: Mapping[Boundary, Mapping[str, str]]) -> set[str]:
    """The streams that move during a run. A stream counts once it moves: it is not compared
    at a boundary where it is absent (its module was not imported yet) or where the run had not
    touched it since the process started; that state is OS entropy, different in every process,
    and a script that seeds inside its main loop (``random.seed(run)``) never draws from it."""
    return {
        s
        for s in {s for d in ra.values() for s in d}
        if len({d[s] for d in ra.values() if s in d}) > 1
    }


def stream_differences(
    ra: Mapping[Boundary, Mapping[str, str]],
    rb: Mapping[Boundary, Mapping[str, str]],
    moving: set[str] | None = None,
) -> tuple[int, list[tuple[Boundary, list[str]]]]:
    """How many boundaries both runs reached, and at which of them streams that move in ``ra``
    differ (their names), in boundary order."""
    moving = moving_streams(ra) if moving is None else moving
    both = sorted(set(ra) & set(rb))
    out = []
    for key in both:
        a, b = ra[key], rb[key]
        differ = sorted(
            s for s in moving if s in a and s in b and a[s] != rng.UNTOUCHED and a[s] != b[s]
        )
        if differ:
            out.append((key, [stream_name(s) for s in differ]))
    return len(both), out


def loads_boundaries(hashes: Mapping[Boundary, str]) -> dict[Boundary, dict[str, str]]:
    """The store's boundary digests (``iteration_hashes``), decoded."""
    return {k: json.loads(v) for k, v in hashes.items()}
