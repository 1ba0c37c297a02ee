"""DataLoaders under ``--deterministic``: every index travels with the key of its pass.

``DataLoader.__init__`` is wrapped (:func:`install`) so that a map-style dataset's loader gets
a :class:`KeyedSampler` (or :class:`KeyedBatchSampler`) around the sampler it would have built,
and a :class:`KeyedDataset` around the dataset. The sampler runs in the main process: at each
pass (``iter(loader)``) it takes the pass's seed from the run seed, the loader's identity (where
and in which order it was built) and the main-loop position, and yields ``(seed, index, k)``
(``k``: how many times that index came before in the pass, 0 but for sampling with
replacement). The dataset, in whichever worker process or thread fetches it, runs the original
``dataset[index]`` as the example ``derive(seed, index, k)``. A persistent worker holds no state
an example's numbers depend on, so ``persistent_workers=True`` replays exactly.

An ``IterableDataset`` has no indices to key: it is left as it is (docs/determinism.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from typing import Any

from flortrain.determinism import examples

_installed: dict[str, Any] = {}


class KeyedDataset:
    """``dataset`` fetched by ``(seed, index, k)`` keys, each as its own example."""

    #: what the record's runtime asks of a loader's dataset: its examples' numbers are their own
    #: (a persistent worker carries nothing over between epochs)
    keyed_examples = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, key: tuple[int, Any, int]) -> Any:
        seed, index, k = key
        with examples._Running(examples.derive(seed, index, k), True):
            return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):  # unpickling; ``__getitems__`` batches
            raise AttributeError(name)
        return getattr(self.dataset, name)


class _Pass:
    """The keys of one pass over a sampler."""

    def __init__(self, ident: tuple[Any, ...]) -> None:
        here, n = examples.next_count(("loader", ident))
        self.seed = examples.derive(examples.run_seed, "loader", ident, here, n)
        self.seen: dict[Any, int] = {}

    def key(self, index: Any) -> tuple[int, Any, int]:
        try:
            k = self.seen.get(index, 0)
            self.seen[index] = k + 1
        except TypeError:  # an unhashable index
            k = 0
        return self.seed, index, k


class KeyedSampler:
    """A sampler whose indices carry their pass's key. ``shuffles``: the sampler is the
    ``RandomSampler`` a ``shuffle=True`` loader builds, whose order is then drawn from the pass's
    own generator, not from torch's global stream (which a loader's iterator also draws its
    workers' base seed from, once per epoch without persistent workers, once in all with them:
    the order would depend on ``persistent_workers``)."""

    def __init__(
        self, sampler: Any, ident: tuple[Any, ...], shuffles: bool = False, seeds: Any = None
    ) -> None:
        self.sampler, self.ident, self.shuffles = sampler, ident, shuffles
        #: the loader's own generator of its workers' base seeds, reseeded at every pass, after
        #: the loader's iterator drew from it (or did not: a persistent one draws once), so that
        #: its state after a pass is the pass's whatever iterator the loader made before
        self.seeds = seeds

    def _start(self) -> _Pass:
        p = _Pass(self.ident)
        if self.seeds is not None:
            self.seeds.manual_seed(examples.derive(p.seed, "workers"))
        return p

    def __iter__(self) -> Iterator[tuple[int, Any, int]]:
        p = self._start()
        if self.shuffles:
            import torch

            self.sampler.generator = torch.Generator().manual_seed(examples.derive(p.seed, "order"))
        for index in self.sampler:
            yield p.key(index)

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name in ("sampler", "ident", "shuffles", "seeds") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.sampler, name)


class KeyedBatchSampler(KeyedSampler):
    """A batch sampler given by the script: each batch's indices carry their pass's key."""

    def __iter__(self) -> Iterator[list[tuple[int, Any, int]]]:  # type: ignore[override]
        p = self._start()
        for batch in self.sampler:
            yield [p.key(index) for index in batch]


def _keyed_arguments(bound: inspect.BoundArguments, ident: tuple[Any, ...]) -> None:
    """Put the keyed sampler and dataset in ``bound`` (a DataLoader's arguments)."""
    import torch
    from torch.utils.data import RandomSampler, SequentialSampler

    a = bound.arguments
    dataset = a["dataset"]
    seeds = None
    if a.get("generator") is None:  # the workers' base seeds, drawn from the loader's own
        seeds = a["generator"] = torch.Generator()
    if a.get("batch_sampler") is not None:
        a["batch_sampler"] = KeyedBatchSampler(a["batch_sampler"], ident, False, seeds)
    else:
        sampler = a.get("sampler")
        shuffles = sampler is None and bool(a.get("shuffle"))
        if sampler is None:
            sampler = RandomSampler(dataset) if shuffles else SequentialSampler(dataset)
        a["sampler"] = KeyedSampler(sampler, ident, shuffles, seeds)
        a["shuffle"] = None
    a["dataset"] = KeyedDataset(dataset)


def install() -> None:
    """Wrap ``DataLoader.__init__`` (once) so map-style loaders key their examples."""
    if _installed:
        return
    from torch.utils.data import DataLoader, IterableDataset

    original = DataLoader.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        dataset = bound.arguments.get("dataset")
        if not isinstance(dataset, IterableDataset | KeyedDataset):
            here, n = examples.next_count("loader built")
            _keyed_arguments(bound, (here, n))
        original(*bound.args, **bound.kwargs)

    DataLoader.__init__ = __init__  # type: ignore[method-assign]
    _installed["DataLoader"] = original
