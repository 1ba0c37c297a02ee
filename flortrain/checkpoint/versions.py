"""Tensors whose in-place version counter cannot be trusted: torch kernels that write behind it.

Three shortcuts trust ``tensor._version`` to say that a tensor's bytes have not changed: the
materializer stages a large tensor again only when its counter moved (``ChangeTracker``) and
names a module tensor still at its version of the main loop's entry by the hash of its bytes
instead of storing it; a replay hashes a live tensor once per version (``Session.live_object``);
and the alias watch compares version fingerprints instead of copies (``fingerprint.fingerprint``). Every
in-place op dispatched through autograd bumps the counter. Two kinds of torch kernels write
tensors without it (as of torch 2.13):

- **fused optimizers** (``Adam``, ``AdamW``, ``SGD``, ``Adagrad`` with ``fused=True``; nanoGPT
  asks for it on CUDA): the kernel updates parameters and moments in place and bumps only the
  ``step`` counter. Trusting it, a checkpoint would name a parameter "unchanged", and a replay
  would restore the first epoch's weights at every later epoch and say it matched;
- **batch normalization's running statistics** (``BatchNorm*``, ``InstanceNorm*`` with
  ``track_running_stats``, ``SyncBatchNorm``): the native kernel updates ``running_mean`` and
  ``running_var`` in training mode without a bump.

Bumping the counters after such a write is wrong: batch norm's backward saves the running
statistics at their version, and a bump after the forward makes ``backward()`` fail (a
fused step's bump would do the same to a graph kept across the step). So instead the registry
notes the memory these kernels wrote (:func:`note`), after each step of an optimizer with a
fused group and after each training-mode forward of a norm module, and every shortcut treats a
noted tensor as changed (:func:`untrusted`): staged and written whole, hashed again, compared by
its bytes. The set only grows (memory freed and reused by another tensor stays noted), which
costs that tensor its shortcut, never a wrong restore. Writes that escape the counter in the
script's own code (through ``.data`` or a NumPy view) are found statically
(``static/untracked.py``); those inside other libraries are listed in ``docs/limitations.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: addresses (``data_ptr``) of tensors a kernel wrote behind their version counters
_unversioned: set[int] = set()


def untrusted(t: Any) -> bool:
    """Whether ``t``'s version counter may not have moved when its bytes did."""
    return bool(_unversioned) and t.data_ptr() in _unversioned


def note(tensors: Iterable[Any]) -> None:
    """These tensors were written behind their version counters."""
    for t in tensors:
        ptr = t.data_ptr()
        if ptr:
            _unversioned.add(ptr)


def fused(opt: Any) -> bool:
    """Whether any of an optimizer's parameter groups steps with a fused kernel."""
    return any(g.get("fused") for g in opt.param_groups)


def after_fused_step(opt: Any, torch: Any) -> None:
    """Note what a fused step wrote: the parameters of its fused groups, their gradients
    (``maximize`` and gradient scaling may write them) and their state tensors. Noted at every
    step: ``load_state_dict`` may have replaced the state since."""
    for g in opt.param_groups:
        if not g.get("fused"):
            continue
        for p in g["params"]:
            state = opt.state.get(p)
            note(
                [
                    p,
                    *([p.grad] if p.grad is not None else []),
                    *(v for v in (state or {}).values() if isinstance(v, torch.Tensor)),
                ]
            )


def has_running_stats(module: Any, torch: Any) -> bool:
    """A norm module whose forward may update running statistics in place."""
    norm = getattr(torch.nn.modules.batchnorm, "_NormBase", None)
    return norm is not None and isinstance(module, norm)


def _after_norm_forward(m: Any, args: Any, output: Any) -> None:
    if m.training:
        for b in (m.running_mean, m.running_var):
            if b is not None and b.data_ptr() not in _unversioned:
                note([b])


def watch_running_stats(module: Any, torch: Any) -> None:
    """Note ``running_mean`` and ``running_var`` after each training-mode forward of
    ``module``: a forward hook, about a microsecond per call, on norm modules only. It is
    registered when the module is constructed, before its statistics exist, and looks for them
    at each call (``track_running_stats=False`` leaves them None). A copy whose class pickles
    its own way may arrive with the hook in its state: it is not registered twice."""
    if _after_norm_forward not in module._forward_hooks.values():
        module.register_forward_hook(_after_norm_forward)


def without_watch(state: dict[str, Any]) -> dict[str, Any]:
    """A module's pickled state (``__getstate__``) without the running-statistics hook: the
    hook is flortrain's, not the module's. ``torch.save(model, ..)`` must write a file that loads
    without flortrain (a local hook cannot be pickled at all), and a copy is watched anew when
    the registry learns it."""
    hooks = state.get("_forward_hooks")
    if hooks and _after_norm_forward in hooks.values():
        kept = type(hooks)((k, h) for k, h in hooks.items() if h is not _after_norm_forward)
        state = {**state, "_forward_hooks": kept}
    return state
