"""Flor's registry of live modules, optimizers and data loaders.

The changeset rules see names; training state is also reachable through aliases they cannot
see (``for p in params: p.data.add_(..)`` with ``params`` built elsewhere, an optimizer held by a
callback). The registry numbers every ``nn.Module``, ``Optimizer`` and ``DataLoader`` in creation
order (stable across record and replay of a deterministic script) so that:

- an optimizer in a changeset brings the modules whose parameters it updates (Flor's library
  augmentation), and a scheduler brings its optimizer;
- an optimizer that steps during a block joins that block's changeset even if no rule named it;
- for the first instances of each block, modules and optimizers outside the changeset are
  compared before and after, and any that changed join the block's changeset from then on;
- a data loader iterated during a block brings the random generators its iteration advances
  (``DataLoader(.., generator=g)``, a sampler's or a dataset's own generator), which no rule can
  see: ``for x, y in loader`` reads ``loader`` as far as the source says.

It learns an object where it is made: in ``__init__``, and in ``__setstate__`` for one made
without it (``copy.deepcopy``, ``copy.copy``, ``pickle``, ``torch.load`` of a whole module). An
EMA made by ``copy.deepcopy(model)``, or a fold's copy of a template model, is as watched as the
model itself. Only copying and unpickling pay for it, never a training step. A module built by
``__new__`` with its attributes set by hand passes neither; the side-effect audit images such
a module as a plain object (``audit``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from flortrain.checkpoint import versions


class _Dead:
    """Stands for an object that exists on record only (its weak reference is dead at once)."""


def _default_setstate(obj: Any, state: Any) -> None:
    """What unpickling and ``copy`` do with the state of an object whose class has no
    ``__setstate__``: a dict of attributes, or one and a dict of slots."""
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        obj.__dict__.update(state)
    for k, v in (slots or {}).items():
        setattr(obj, k, v)


def kind(obj: Any, torch: Any) -> str:
    """The registry's kind of a live object, as an augmentation key names it (``module#3``)."""
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    return "loader"


class Registry:
    def __init__(self) -> None:
        self._objects: list[weakref.ref[Any]] = []
        self._index: dict[int, int] = {}
        self.paused = 0
        self.stepped: set[int] = set()  # registry ids of optimizers stepped since last reset
        self._last_stepped: Any = None  # the optimizer that stepped last since the reset
        self._last_fused = False  # whether it steps with a fused kernel (``versions``)
        self.iterated: set[int] = set()  # registry ids of data loaders iterated since last reset
        # called with every data loader about to be iterated (probe isolation saves its generators)
        self.on_iterate: Callable[[Any], None] | None = None
        self._roots: tuple[int, list[int]] | None = None
        self._undo: list[Callable[[], None]] = []

    def reset_block(self) -> None:
        """A block instance starts: forget which optimizers stepped and which loaders iterated."""
        self.stepped.clear()
        self._last_stepped = None
        self.iterated.clear()

    def install(self) -> None:
        """Patch ``Module``, ``Optimizer`` and ``DataLoader`` construction (``__init__``, and
        ``__setstate__`` for copies and unpickled objects), hook optimizer steps and loader
        iteration."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def module_made(m: Any) -> None:
            if versions.has_running_stats(m, torch):  # its kernel writes behind the counters
                versions.watch_running_stats(m, torch)

        self._patch_construction(torch.nn.Module, module_made)
        self._patch_construction(torch.optim.Optimizer)
        self._patch_construction(torch.utils.data.DataLoader)
        self._patch_getstate(torch)
        self._patch_iteration(torch)
        self._undo.append(register_optimizer_step_post_hook(self._step_hook(torch)).remove)

    def _patch_construction(self, cls: Any, also: Callable[[Any], None] | None = None) -> None:
        """Register every object of ``cls`` as it is made: by ``__init__``, and by
        ``__setstate__`` for one built with ``__new__`` (``copy.deepcopy``, ``copy.copy``,
        ``pickle``, ``torch.load``; the default ``__setstate__`` where the class has none)."""
        reg = self
        original = cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            reg.add(self)
            if also is not None:
                also(self)

        cls.__init__ = __init__
        self._undo.append(lambda: setattr(cls, "__init__", original))
        setstate = cls.__dict__.get("__setstate__")

        def __setstate__(self: Any, state: Any) -> None:
            if setstate is not None:
                setstate(self, state)
            else:
                _default_setstate(self, state)
            reg.add(self)
            if also is not None:
                also(self)

        cls.__setstate__ = __setstate__
        if setstate is None:
            self._undo.append(lambda: delattr(cls, "__setstate__"))
        else:
            self._undo.append(lambda: setattr(cls, "__setstate__", setstate))

    def _patch_getstate(self, torch: Any) -> None:
        """A pickled module leaves out the running-statistics watch (``versions``)."""
        module_getstate: Callable[[Any], Any] = torch.nn.Module.__getstate__

        def __getstate__(self: Any) -> Any:
            return versions.without_watch(module_getstate(self))

        torch.nn.Module.__getstate__ = __getstate__
        self._undo.append(lambda: setattr(torch.nn.Module, "__getstate__", module_getstate))

    def _patch_iteration(self, torch: Any) -> None:
        """Note every registered data loader iterated (its generators advance)."""
        reg = self
        loader_iter = torch.utils.data.DataLoader.__iter__

        def __iter__(self: Any) -> Any:
            if reg.on_iterate is not None:
                reg.on_iterate(self)
            i = reg.id_of(self)
            if i is not None and not reg.paused:
                reg.iterated.add(i)
            return loader_iter(self)

        torch.utils.data.DataLoader.__iter__ = __iter__
        self._undo.append(lambda: setattr(torch.utils.data.DataLoader, "__iter__", loader_iter))

    def _step_hook(self, torch: Any) -> Callable[[Any, Any, Any], None]:
        """Runs after every optimizer step (9,600 in the fine-tuning benchmark's run), outside
        what record counts as held: the optimizer that stepped last, already noted since the
        block began, is told by identity alone."""

        def on_step(opt: Any, args: Any, kwargs: Any) -> None:
            if opt is not self._last_stepped:
                i = self.id_of(opt)
                if i is not None:
                    self.stepped.add(i)
                self._last_stepped, self._last_fused = opt, versions.fused(opt)
            if self._last_fused:  # its kernel wrote behind the version counters
                versions.after_fused_step(opt, torch)

        return on_step

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def add(self, obj: Any) -> None:
        if self.paused or (id(obj) in self._index and self.get(self._index[id(obj)]) is obj):
            return
        self._index[id(obj)] = len(self._objects)
        self._objects.append(weakref.ref(obj))

    def count(self) -> int:
        return len(self._objects)

    def pad(self, n: int) -> None:
        """Reserve ids for ``n`` objects a skipped block created on record but not on replay, so
        the ids of everything created afterwards stay aligned with the record."""
        dead: weakref.ref[Any] = weakref.ref(_Dead())
        self._objects.extend([dead] * n)

    def place(self, i: int, obj: Any) -> None:
        """Put a restored object at the id its original had on record."""
        if 0 <= i < len(self._objects):
            self._objects[i] = weakref.ref(obj)
            self._index[id(obj)] = i
            self._roots = None

    def id_of(self, obj: Any) -> int | None:
        i = self._index.get(id(obj))
        if i is None or self.get(i) is not obj:
            return None
        return i

    def get(self, i: int) -> Any:
        return self._objects[i]() if 0 <= i < len(self._objects) else None

    def live(self) -> Iterator[tuple[int, Any]]:
        for i, ref in enumerate(self._objects):
            obj = ref()
            if obj is not None:
                yield i, obj

    def root_modules(self) -> list[tuple[int, Any]]:
        """Live modules that are not a submodule of another live module (cached until a module
        or optimizer is created: probes inside batch loops ask for them at every step)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return []  # nothing registered; never import torch for a script that does not
        if self._roots is not None and self._roots[0] == len(self._objects):
            return [(i, m) for i in self._roots[1] if (m := self.get(i)) is not None]
        roots = self._compute_roots(torch)
        self._roots = (len(self._objects), [i for i, _ in roots])  # ids only: no strong refs
        return roots

    def _compute_roots(self, torch: Any) -> list[tuple[int, Any]]:
        modules = [(i, m) for i, m in self.live() if isinstance(m, torch.nn.Module)]
        children: set[int] = set()
        for _, m in modules:
            for sub in m.modules():
                if sub is not m:
                    children.add(id(sub))
        return [(i, m) for i, m in modules if id(m) not in children]

    def optimizers(self) -> list[tuple[int, Any]]:
        torch = sys.modules.get("torch")
        if torch is None:
            return []

        return [(i, o) for i, o in self.live() if isinstance(o, torch.optim.Optimizer)]

    def modules_of(self, optimizer: Any) -> list[tuple[int, Any]]:
        """The root modules owning any parameter this optimizer updates."""
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        return [
            (i, m) for i, m in self.root_modules() if any(id(p) in params for p in m.parameters())
        ]
