"""A generator created outside a data-parallel region and drawn from inside it (DETrain)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import streams as st
from flortrain.check.finding import Severity
from flortrain.check.regions import Kind
from flortrain.check.rngflow import Draw, Origin, analysis, where_drawn
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit

_COPIED = "every worker gets a copy of the same stream"
_SHARED = "the threads share it, so each draw depends on thread timing"
_CONSEQUENCE = {
    Kind.LOADER: _COPIED,
    Kind.PROCESSES: _COPIED,
    Kind.LOADER_THREADS: _SHARED,
    Kind.THREADS: _SHARED,
    Kind.REPLICAS: _SHARED,
}


def describe(unit: Unit, draw: Draw) -> str:
    state = draw.state
    assert isinstance(state, Origin)
    if draw.key.startswith("<"):
        call = draw.node
        name = draw.func.unit.source.code(call.func) if isinstance(call, cst.Call) else "a call"
        return (
            f"`{name}` draws from {st.STREAM_NAMES[draw.key]} {where_drawn(unit, draw)}:"
            f" {state.reason}"
        )
    return (
        f"`{draw.key}` (created at {state.where(unit)}, outside the region) draws"
        f" {where_drawn(unit, draw)}: {_CONSEQUENCE[draw.region.kind]}"
    )


class SharedGenerator(Rule):
    code = f"{Family.RANDOMNESS}001"
    name = "shared-generator"
    severity = Severity.ERROR
    message = "a generator created outside a data-parallel region draws inside it"
    hint = (
        "create the generator inside the region from the example index (and epoch), or"
        " reseed it per worker in worker_init_fn from torch.initial_seed()"
    )
    doc = (
        "DETrain's RNG-safety analysis, flow-sensitive and interprocedural. Regions are what"
        " DataLoader workers run (a Dataset's `__getitem__`/`__iter__`/`__getitems__` and"
        " everything they call, transforms kept on `self`, `collate_fn`, `worker_init_fn`),"
        " what `ThreadPoolExecutor`/`multiprocessing.Pool` map or submit, what `joblib.delayed`"
        " wraps, and an `nn.DataParallel` module's `forward`. A generator made outside the"
        " region (`default_rng`, `RandomState`, `random.Random`, `torch.Generator`) is copied"
        " into every worker process, so all workers draw the same numbers, or shared by"
        " threads, so draws depend on timing. A generator created inside the region, after its"
        " creation, is safe. Global streams depend on how the region runs: DataLoader worker"
        " processes reseed python's, torch's and (torch >= 1.9, per `torch_version`) numpy's"
        " stream per worker, so those are safe there; pools and threads reseed nothing;"
        " DataParallel replicas draw torch numbers from their own device's stream (not"
        " reported) but share numpy's and python's. A dataset whose loaders are all"
        " `num_workers=0` runs in the main process and is not a region; a Dataset subclass"
        " with no loader in its file is assumed to be loaded by worker processes. The static"
        " pass cannot know a `num_workers` computed at run time (it assumes workers), a"
        " generator reached through a container, `setattr` or a base class of another"
        " package, nor a seed set in a worker by code it does not see (OpenCV and imgaug"
        " streams are RNG004's)."
    )
    valid = (
        Valid(
            """
            import numpy as np
            from torch.utils.data import Dataset

            class Aug(Dataset):
                def __init__(self, seed):
                    self.seed = seed

                def __getitem__(self, i):
                    rng = np.random.default_rng([self.seed, i])
                    return rng.normal()
            """
        ),
        Valid(  # torch reseeds numpy's global stream in each DataLoader worker process
            """
            import numpy as np
            from torch.utils.data import DataLoader, Dataset

            class Aug(Dataset):
                def __getitem__(self, i):
                    return np.random.normal()

            loader = DataLoader(Aug(), num_workers=4)
            """
        ),
        Valid(  # num_workers=0: the main process loads, there is no region
            """
            import numpy as np
            from torch.utils.data import DataLoader

            class Aug:
                def __init__(self):
                    self.rng = np.random.default_rng(0)

                def __getitem__(self, i):
                    return self.rng.normal()

            loader = DataLoader(Aug(), batch_size=4)
            """
        ),
        Valid(  # reseeded per worker in worker_init_fn
            """
            import numpy as np
            import torch
            from torch.utils.data import DataLoader, Dataset, get_worker_info

            class Aug(Dataset):
                def __init__(self):
                    self.rng = np.random.default_rng(0)

                def __getitem__(self, i):
                    return self.rng.normal()

            def init(worker_id):
                info = get_worker_info()
                info.dataset.rng = np.random.default_rng(info.seed)

            loader = DataLoader(Aug(), num_workers=2, worker_init_fn=init)
            """
        ),
        Valid(  # reseeded per worker by a method of the dataset
            """
            import numpy as np
            from torch.utils.data import DataLoader, Dataset, get_worker_info

            class Aug(Dataset):
                def __init__(self):
                    self.rng = np.random.RandomState(0)

                def reseed(self, seed):
                    self.rng.seed(seed % 2**32)

                def __getitem__(self, i):
                    return self.rng.rand()

            def init(worker_id):
                info = get_worker_info()
                info.dataset.reseed(info.seed)

            loader = DataLoader(Aug(), num_workers=2, worker_init_fn=init)
            """
        ),
        Valid(  # created lazily inside the region: after its creation it is safe
            """
            import numpy as np
            from torch.utils.data import Dataset

            class Aug(Dataset):
                def __init__(self):
                    self.rng = None

                def __getitem__(self, i):
                    if self.rng is None:
                        self.rng = np.random.default_rng(i)
                    return self.rng.normal()
            """
        ),
        Valid(  # an IterableDataset seeding its own generator per worker
            """
            import numpy as np
            from torch.utils.data import IterableDataset, get_worker_info

            class Stream(IterableDataset):
                def __init__(self):
                    self.rng = np.random.default_rng(0)

                def __iter__(self):
                    rng = np.random.default_rng(get_worker_info().seed)
                    while True:
                        yield rng.normal()
            """
        ),
        Valid(  # the generator is passed in, created inside the task
            """
            import numpy as np
            from concurrent.futures import ThreadPoolExecutor

            def work(rng):
                return rng.normal()

            def task(i):
                return work(np.random.default_rng(i))

            with ThreadPoolExecutor(4) as ex:
                out = list(ex.map(task, range(8)))
            """
        ),
    )
    invalid = (
        Invalid(
            """
            import numpy as np
            from torch.utils.data import Dataset

            class Aug(Dataset):
                def __init__(self):
                    self.rng = np.random.default_rng(0)

                def __getitem__(self, i):
                    return self.rng.normal()
            """,
            line=9,
            col=16,
        ),
        Invalid(  # drawn before the region makes its own: flow-sensitive
            """
            import numpy as np
            from torch.utils.data import Dataset

            class Aug(Dataset):
                def __init__(self):
                    self.rng = np.random.default_rng(0)

                def __getitem__(self, i):
                    x = self.rng.normal()
                    self.rng = np.random.default_rng(i)
                    return x + self.rng.normal()
            """,
            line=9,
        ),
        Invalid(  # only one branch creates it: after the `if`, it may be the outside one
            """
            import numpy as np
            from torch.utils.data import Dataset

            class Aug(Dataset):
                def __init__(self):
                    self.rng = np.random.RandomState(0)

                def __getitem__(self, i):
                    if i % 2:
                        self.rng = np.random.RandomState(i)
                    return self.rng.rand()
            """,
            line=11,
        ),
        Invalid(  # through a method and a transform kept on self, into a parameter
            """
            import random
            from torch.utils.data import DataLoader

            class Jitter:
                def __call__(self, x, rng):
                    return x + rng.random()

            class Pairs:
                def __init__(self, rng):
                    self.rng = rng
                    self.tf = Jitter()

                def __getitem__(self, i):
                    return self._load(i)

                def _load(self, i):
                    return self.tf(i, self.rng)

            loader = DataLoader(Pairs(random.Random(3)), num_workers=2)
            """,
            line=6,
        ),
        Invalid(  # numpy's global stream is shared by threads
            """
            import numpy as np
            from concurrent.futures import ThreadPoolExecutor

            def noisy(x):
                return x + np.random.normal()

            pool = ThreadPoolExecutor(4)
            futures = [pool.submit(noisy, x) for x in range(8)]
            """,
            line=5,
            col=16,
        ),
        Invalid(  # a module's generator, drawn in a project function the dataset calls
            """
            from torch.utils.data import Dataset
            from aug import jitter

            class Aug(Dataset):
                def __getitem__(self, i):
                    return jitter(i)
            """,
            line=6,
            col=16,
            files=(
                (
                    "aug.py",
                    "import numpy as np\n_rng = np.random.default_rng(0)\n\n"
                    "def jitter(x):\n    return x + _rng.normal()\n",
                ),
            ),
        ),
        Invalid(  # a torch.Generator drawn through generator= in a pool's worker
            """
            import torch
            from multiprocessing import Pool

            g = torch.Generator().manual_seed(0)

            def sample(n):
                return torch.randperm(n, generator=g)

            with Pool(2) as p:
                p.map(sample, [4, 5])
            """,
            line=7,
            col=12,
        ),
        Invalid(  # DataParallel replicas share numpy's stream
            """
            import numpy as np
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    return x * np.random.rand()

            model = nn.DataParallel(Net())
            """,
            line=6,
            col=20,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        seen: set[tuple[int, str]] = set()
        for draw in analysis(unit).draws:
            if draw.region.elsewhere or not isinstance(draw.state, Origin):
                continue
            if draw.key in (st.CV2, st.IMGAUG):
                continue
            key = (id(draw.anchor), draw.key)
            if key in seen:
                continue
            seen.add(key)
            yield Hit(draw.anchor, message=describe(unit, draw))
