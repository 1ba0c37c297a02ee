"""The alias watch's tokens of live state: what tells that a loop changed an object its changeset
did not name, without copying it.

A module's or optimizer's token reads each tensor's memory and in-place version counter, no
bytes (``versions.py`` says which tensors a counter cannot vouch for); other objects are
compared by a captured copy (:func:`clone_state`, :func:`snapshot_equal`).
"""

from __future__ import annotations

import collections
import copy
from typing import Any

from flortrain.checkpoint import versions
from flortrain.checkpoint.capture import capture
from flortrain.checkpoint.kinds import IMMUTABLE, is_numpy_value, is_rng, loaded_torch


def snapshot_equal(a: Any, b: Any) -> bool:
    """Exact comparison of two captured states (used by the alias watch)."""
    torch = loaded_torch()
    if torch is not None and isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(snapshot_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return (
            isinstance(b, list | tuple)
            and len(a) == len(b)
            and all(snapshot_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    try:
        return bool(a == b)
    except Exception:
        return False


def fingerprint(obj: Any, owned: frozenset[int] = frozenset()) -> Any:
    """A cheap token of a live module's or optimizer's state that changes whenever the state does,
    for the alias watch: each tensor by its memory and in-place version counter (no bytes read or
    copied), plain values by value. Tensors written through ``.data`` escape it: a script that
    does so is watched with :func:`clone_state` instead (``static/untracked.py``).

    ``owned``: ids of parameters that belong to a watched module. An optimizer's token leaves
    them out: their values and gradients are that module's state, and its token sees them
    change. Otherwise every loop that runs ``backward()`` would seem to change the optimizer (its
    parameters' gradients moved), and each of its checkpoints would carry the optimizer's state
    as well, which the loop never touched: nanoGPT's micro-step loop staged AdamW's two moments
    beside the model at every checkpoint. Parameters of no module (``SGD([w])``) stay in it."""
    torch = loaded_torch()
    if torch is not None and isinstance(obj, torch.nn.Module):
        return (
            [_fp(t) for t in obj.parameters()],
            [_fp(t.grad) for t in obj.parameters()],
            [_fp(b) for b in obj.buffers()],
            [m.training for m in obj.modules()],
            [p.requires_grad for p in obj.parameters()],
            {name: _fp(_plain_attrs_raw(m, torch)) for name, m in obj.named_modules()},
        )
    if torch is not None and isinstance(obj, torch.optim.Optimizer):
        return (
            [_fp(v) for v in obj.state.values()],
            [_fp({k: v for k, v in g.items() if k != "params"}) for g in obj.param_groups],
            [
                [(_fp(p), _fp(p.grad)) for p in g["params"] if id(p) not in owned]
                for g in obj.param_groups
            ],
        )
    return _fp(obj)


def _plain_attrs_raw(module: Any, torch: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_")
        and k != "training"
        and not isinstance(v, torch.nn.Module | torch.nn.Parameter)
    }


def _fp(v: Any) -> Any:
    torch = loaded_torch()
    if torch is not None and isinstance(v, torch.Tensor):
        try:
            version = v._version
        except RuntimeError:  # an inference tensor: no counter; compare its bytes
            return ("bytes", v.detach().cpu().clone())
        if versions.untrusted(v):  # a kernel writes it behind the counter: compare its bytes
            return ("bytes", v.detach().cpu().clone())
        return (
            "T",
            v.untyped_storage().data_ptr(),
            v.storage_offset(),
            tuple(v.shape),
            v.dtype,
            version,
        )
    if isinstance(v, IMMUTABLE) or is_numpy_value(v):
        return v
    if isinstance(v, dict):
        return ("D", [(k, _fp(x)) for k, x in v.items()])
    if isinstance(v, list | tuple | collections.deque):
        return ("L", [_fp(x) for x in v])
    if isinstance(v, set):
        return ("S", frozenset(v))
    if is_rng(v):
        return ("R", repr(capture(v)))
    return ("O", id(v))


def clone_state(obj: Any) -> Any:
    """A deep copy of an object's captured state, for before/after comparison."""
    return copy.deepcopy(capture(obj))
