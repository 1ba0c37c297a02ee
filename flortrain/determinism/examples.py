"""Per-example generators at run time: what code rewritten by ``--deterministic`` calls.

An *example* is one ``dataset[i]`` a DataLoader fetches or one call a pool runs. Its generators
are seeded from a counter-based hash of (run seed, where in the run it was asked for, its index),
so the numbers it draws depend on none of: the worker that runs it, ``num_workers``,
``persistent_workers``, ``in_order``, thread timing. "Where in the run" is the main-loop
position (loop id, entry, iteration: a record's or replay's session says it, ``flortrain run``
counts it itself) and, in that position, how many times this loader was iterated or this
submission site was reached. Those counts restart every iteration, so a replay that restores an
iteration's blocks or jumps over whole iterations gives the next example the record's key.

DataLoaders are wrapped as they are built (:func:`install`): the sampler hands each index on
with the key of the pass it belongs to, in the main process; the dataset, wherever it runs,
sets the example's generators before calling the original ``__getitem__``, and also seeds the
global streams for the call (and puts them back after), so that library code drawing from them
(a torchvision random transform) is per-example too. A pool callable is wrapped per submission
(:func:`keyed`, :func:`mapped`). The example's generators live in a thread-local, so threads
never share one.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import random
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: the run seed (``record --deterministic --seed``), set by :func:`configure`
run_seed = 0

_local = threading.local()
_counts: dict[Any, int] = {}
_scope: Any = None
#: ``flortrain run``'s own main-loop position ([id, entry, iteration]); a session's wins
_own: list[Any] | None = None
_entries: dict[str, int] = {}


def derive(*parts: Any) -> int:
    """A 63-bit seed from ``parts`` (ints, strings, tuples): the same in every process."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Example:
    """One example's generators, made on first use."""

    __slots__ = ("_numpy", "_python", "_torch", "seed")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._numpy: Any = None
        self._python: random.Random | None = None
        self._torch: Any = None

    def numpy(self) -> Any:
        if self._numpy is None:
            import numpy as np

            self._numpy = np.random.RandomState([self.seed & 0xFFFFFFFF, self.seed >> 32])
        return self._numpy

    def python(self) -> random.Random:
        if self._python is None:
            self._python = random.Random(self.seed)
        return self._python

    def torch(self) -> Any:
        if self._torch is None:
            import torch

            self._torch = torch.Generator().manual_seed(self.seed)
        return self._torch


def current() -> Example | None:
    return getattr(_local, "example", None)


def numpy() -> Any:
    """The current example's numpy generator; outside an example, numpy's global stream."""
    ex = current()
    if ex is not None:
        return ex.numpy()
    import numpy as np

    return np.random.mtrand._rand


def python() -> random.Random:
    ex = current()
    return ex.python() if ex is not None else random._inst


def torch() -> Any:
    """The current example's torch generator; outside one, None (torch's default)."""
    ex = current()
    return ex.torch() if ex is not None else None


class _Running:
    """Run a call as the example ``seed`` (nested examples restore the outer one)."""

    __slots__ = ("_saved", "_streams", "example", "globals")

    def __init__(self, seed: int, seed_globals: bool) -> None:
        self.example = Example(seed)
        self.globals = seed_globals
        self._saved: Example | None = None
        self._streams: dict[str, Any] | None = None

    def __enter__(self) -> Example:
        self._saved = current()
        _local.example = self.example
        if self.globals:
            self._streams = _seed_globals(self.example.seed)
        return self.example

    def __exit__(self, *exc: object) -> None:
        _local.example = self._saved
        if self._streams is not None:
            _restore_globals(self._streams)


def _seed_globals(seed: int) -> dict[str, Any]:
    saved: dict[str, Any] = {"random": random.getstate()}
    random.seed(seed)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        saved["numpy"] = np_random.get_state()
        np_random.seed(seed & 0xFFFFFFFF)
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None:
        saved["torch"] = torch_mod.get_rng_state()
        torch_mod.manual_seed(seed)
    return saved


def _restore_globals(saved: dict[str, Any]) -> None:
    random.setstate(saved["random"])
    if "numpy" in saved:
        sys.modules["numpy.random"].set_state(saved["numpy"])
    if "torch" in saved:
        sys.modules["torch"].set_rng_state(saved["torch"])


# -- where in the run ----------------------------------------------------------------------------


def position() -> tuple[Any, ...] | None:
    """The main-loop position: (loop id, entry, iteration), None outside every main loop."""
    session_mod = sys.modules.get("flortrain.runtime.session")
    s = getattr(session_mod, "current", None) if session_mod is not None else None
    if s is not None:
        return tuple(s.main) if s.main is not None else None
    return tuple(_own) if _own is not None else None


def next_count(what: Any) -> tuple[Any, int]:
    """The position and how many times ``what`` was counted in it before (restarting at 0 in
    every new position)."""
    global _scope
    here = position()
    if here != _scope:
        _scope = here
        _counts.clear()
    n = _counts.get(what, 0)
    _counts[what] = n + 1
    return here, n


def epochs(main_id: str, iterable: Iterable[Any]) -> Iterator[Any]:
    """``flortrain run``'s main ``for`` loop: its position, as a record's session keeps it."""
    global _own
    entry = _entries.get(main_id, 0)
    _entries[main_id] = entry + 1
    _own = [main_id, entry, -1]
    try:
        for i, item in enumerate(iterable):
            _own = [main_id, entry, i]
            yield item
    finally:
        _own = None


def tick(main_id: str) -> bool:
    """``flortrain run``'s main ``while`` loop: one more iteration (entered anew after
    :func:`leave`)."""
    global _own
    if _own is None or _own[0] != main_id:
        entry = _entries.get(main_id, 0)
        _entries[main_id] = entry + 1
        _own = [main_id, entry, -1]
    _own = [main_id, _own[1], _own[2] + 1]
    return True


def leave(main_id: str) -> bool:
    global _own
    _own = None
    return False


# -- pools ---------------------------------------------------------------------------------------


class _Keyed:
    """A callable submitted once: its example's seed was taken at submission."""

    def __init__(self, fn: Callable[..., Any], seed: int) -> None:
        self.fn, self.seed = fn, seed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _Running(self.seed, False):
            return self.fn(*args, **kwargs)


class _Indexed:
    """A callable mapped over items: item ``n``'s seed derives from the map's and ``n``."""

    def __init__(self, fn: Callable[..., Any], seed: int, how: str) -> None:
        self.fn, self.seed, self.how = fn, seed, how

    def __call__(self, *args: Any) -> Any:
        if self.how == "zip":  # an Executor's map: (n, *items)
            n, rest = args[0], args[1:]
        else:  # a Pool's: ((n, item),)
            n, item = args[0]
            rest = tuple(item) if self.how == "star" else (item,)
        with _Running(derive(self.seed, n), False):
            return self.fn(*rest)


def _site_seed(site: str) -> int:
    here, n = next_count(("pool", site))
    return derive(run_seed, "pool", site, here, n)


def keyed(site: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as submitted at ``site`` now (``submit``, ``apply_async``, ``delayed``)."""
    return _Keyed(fn, _site_seed(site))


def mapped(
    site: str, method: Callable[..., Any], fn: Callable[..., Any], *its: Any, **kw: Any
) -> Any:
    """``method(fn, *its, **kw)`` (a pool's map) with each item's call keyed by its position."""
    from concurrent.futures import Executor
    from multiprocessing.pool import Pool

    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if isinstance(owner, Executor):
        return method(_Indexed(fn, _site_seed(site), "zip"), itertools.count(), *its, **kw)
    if isinstance(owner, Pool) and its:
        how = "star" if name.startswith("starmap") else "one"
        return method(_Indexed(fn, _site_seed(site), how), enumerate(its[0]), *its[1:], **kw)
    return method(fn, *its, **kw)


def install_builtin() -> None:
    """Make ``__flortrain_det__`` resolve in every module the rewrite touched."""
    setattr(builtins, "__flortrain_det__", sys.modules[__name__])  # noqa: B010


install_builtin()  # a worker process that unpickles a wrapper gets the name with it
