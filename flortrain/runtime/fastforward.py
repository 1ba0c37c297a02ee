"""Fast-forward at run time: the check a statement the static pass found skippable must pass
before a pseudoresume leaves it out (:mod:`flortrain.static.fastforward`).

The static pass sees names, not values. A name the statement calls must hold a module whose
call draws nothing and changes nothing: a ``torch.nn.Module`` in eval mode, every submodule in
eval mode and running PyTorch's own ``forward`` (a script's ``forward`` may do anything), with
no forward hooks anywhere. A name it iterates, indexes or calls a method of must hold such a
module or a plain container or a tensor
(iterating a DataLoader draws its base seed from torch's global stream), all the way down: what
the statement binds from it is then plain as well. Anything else, or a name not found, runs the
statement.
"""

from __future__ import annotations

import builtins
import sys
from types import FrameType
from typing import Any

_LEAVES = (str, bytes, int, float, bool, complex, range, type(None))
_NESTED = (list, tuple, dict)


def _lookup(frame: FrameType, name: str) -> tuple[bool, Any]:
    for ns in (frame.f_locals, frame.f_globals):
        if name in ns:
            return True, ns[name]
    return hasattr(builtins, name), getattr(builtins, name, None)


def _pure_module(torch: Any, m: Any) -> bool:
    """Whether calling ``m`` draws nothing and changes nothing: eval mode and torch's own code."""
    if not isinstance(m, torch.nn.Module):
        return False
    hooks = torch.nn.modules.module
    if getattr(hooks, "_global_forward_hooks", None) or getattr(
        hooks, "_global_forward_pre_hooks", None
    ):
        return False
    for sub in m.modules():
        forward = type(sub).forward
        if sub.training or not getattr(forward, "__module__", "").startswith("torch."):
            return False
        if sub._forward_hooks or sub._forward_pre_hooks:
            return False
    return True


def skippable(frame: FrameType, modules: tuple[str, ...], containers: tuple[str, ...]) -> bool:
    """Whether the statement running in ``frame`` may be left out (the values its static
    verdict assumed are there)."""
    torch = sys.modules.get("torch")
    for name in modules:
        found, v = _lookup(frame, name)
        if not found or torch is None or not _pure_module(torch, v):
            return False
    for name in containers:
        found, v = _lookup(frame, name)
        if not found or not (_plain(torch, v, 4) or (torch is not None and _pure_module(torch, v))):
            return False
    return True


def _plain(torch: Any, v: Any, depth: int) -> bool:
    """Whether ``v`` holds only numbers, strings, tensors and arrays, in lists, tuples and dicts
    (``depth`` levels deep at most): what the statement binds from it is plain too."""
    if isinstance(v, _LEAVES):
        return True
    if torch is not None and isinstance(v, torch.Tensor):
        return True
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.ndarray | np.generic):
        return True
    if not isinstance(v, _NESTED) or depth == 0:
        return False
    items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
    return all(_plain(torch, x, depth - 1) for x in items)
