"""DataLoader workers whose random streams no checkpoint holds: persistent workers, or batches
handed out in completion order, over a dataset that draws random numbers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import libcst as cst

from flortrain.check import streams as st
from flortrain.check.finding import Severity
from flortrain.check.rngflow import Draw, Safe, analysis
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit

_PERSISTENT = (
    "keeps each worker process, and its random streams, from epoch to epoch, where no"
    " checkpoint reaches them"
)
_UNORDERED = (
    "hands each batch to whichever worker is free, so which worker's stream augments an"
    " example depends on timing"
)


class PersistentWorkers(Rule):
    code = f"{Family.RANDOMNESS}005"
    name = "persistent-workers"
    severity = Severity.WARNING
    message = "DataLoader worker streams that no checkpoint holds, over random augmentation"
    hint = (
        "use persistent_workers=False (workers then start each epoch from the main process's"
        " stream), keep in_order=True, or draw from a generator made per example from its index"
    )
    doc = (
        "With `persistent_workers=True` the workers, and the random streams the dataset draws"
        " from in them, live from one epoch to the next. flortrain checkpoints the main"
        " process's streams (python's, numpy's, torch's) only; it cannot capture or restore a"
        " worker process's. `flortrain record` warns once for such a loader, and a replay that"
        " restores an epoch's state and runs the next one starts fresh workers whose streams"
        " are where the record's were at the first epoch, so the augmentation can differ there"
        " (`flortrain diff` reports it). With `persistent_workers=False` every epoch's workers"
        " are seeded from the main process's stream, which checkpoints hold, and the replay is"
        " exact. `in_order=False` lets the loader give the next indices to whichever worker has"
        " room, so the worker (and stream) that augments an example depends on timing, in the"
        " record and in every replay; flortrain does nothing about it at run time. Reported"
        " only when the dataset draws from a stream that outlives one example: global streams,"
        " generators kept on the dataset or the module; a generator made in `__getitem__` from"
        " the index is fine. The static pass treats a `persistent_workers` value computed at"
        " run time as true, and cannot see draws in a dataset it cannot resolve (one built by"
        " a factory, or from another package)."
    )
    valid = (
        Valid(
            """
            import numpy as np
            from torch.utils.data import DataLoader, Dataset

            class Aug(Dataset):
                def __getitem__(self, i):
                    return np.random.normal()

            loader = DataLoader(Aug(), num_workers=2, persistent_workers=False)
            """
        ),
        Valid(  # per-example generators: nothing carries over between examples
            """
            import numpy as np
            from torch.utils.data import DataLoader, Dataset

            class Aug(Dataset):
                def __getitem__(self, i):
                    rng = np.random.default_rng(i)
                    return rng.normal()

            loader = DataLoader(Aug(), num_workers=2, persistent_workers=True)
            """
        ),
        Valid(  # no randomness in the dataset
            """
            from torch.utils.data import DataLoader, Dataset

            class Plain(Dataset):
                def __getitem__(self, i):
                    return i * 2

            loader = DataLoader(Plain(), num_workers=2, persistent_workers=True, in_order=False)
            """
        ),
    )
    invalid = (
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, Dataset

            class Aug(Dataset):
                def __getitem__(self, i):
                    return torch.randn(3) + i

            loader = DataLoader(Aug(), batch_size=8, num_workers=4, persistent_workers=True)
            """,
            line=8,
            col=57,
        ),
        Invalid(  # a torchvision random transform handed to the dataset
            """
            import torchvision.transforms as T
            from torch.utils.data import DataLoader, Dataset

            class Images(Dataset):
                def __init__(self, transform):
                    self.transform = transform

                def __getitem__(self, i):
                    return self.transform(self.load(i))

            ds = Images(T.Compose([T.RandomCrop(32), T.ToTensor()]))
            loader = DataLoader(ds, num_workers=2, in_order=False)
            """,
            line=12,
            col=40,
        ),
        Invalid(  # the dataset lives in a project module
            """
            from torch.utils.data import DataLoader
            from data import Noisy

            loader = DataLoader(Noisy(), num_workers=2, persistent_workers=True)
            """,
            line=4,
            col=45,
            files=(
                (
                    "data.py",
                    "import random\nfrom torch.utils.data import Dataset\n\n"
                    "class Noisy(Dataset):\n    def __getitem__(self, i):\n"
                    "        return i + random.random()\n",
                ),
            ),
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        a = analysis(unit)
        for loader in a.regions.loaders:
            if loader.kind is None:
                continue
            persistent = loader.keyword("persistent_workers")
            in_order = loader.keyword("in_order")
            flags: list[tuple[cst.Arg, str]] = []
            if persistent is not None and not _false(persistent.value):
                flags.append((persistent, _PERSISTENT))
            if in_order is not None and _false(in_order.value):
                flags.append((in_order, _UNORDERED))
            if not flags:
                continue
            draw = next(
                (
                    d
                    for d in a.draws
                    if d.region.loader is loader
                    and not (isinstance(d.state, Safe) and d.state.ephemeral)
                ),
                None,
            )
            if draw is None:
                continue
            for arg, why in flags:
                assert arg.keyword is not None
                setting = f"{arg.keyword.value}={unit.source.code(arg.value)}"
                yield Hit(arg, message=f"`{setting}` {why}: {_drawn(unit, draw)}")


def _false(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Name):
        return expr.value in ("False", "None")
    return isinstance(expr, cst.Integer) and expr.evaluated_value == 0


def _drawn(unit: Unit, draw: Draw) -> str:
    f = draw.func
    line = f.unit.where(draw.node)[0]
    where = f"line {line}" if f.unit is unit else f"{os.path.basename(f.unit.path)}:{line}"
    what = st.STREAM_NAMES.get(draw.key, f"`{draw.key}`")
    return f"`{f.name}` draws from {what} ({where})"
