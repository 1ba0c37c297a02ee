"""Worker seeding that is wrong (from the worker id only) or missing (OpenCV, imgaug)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import streams as st
from flortrain.check.finding import Severity
from flortrain.check.rngflow import Origin, analysis, where_drawn
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.seeds import RUN, WID, seeds
from flortrain.check.unit import Unit


class WorkerSeeding(Rule):
    code = f"{Family.RANDOMNESS}004"
    name = "worker-seeding"
    severity = Severity.ERROR
    message = "worker seeding that repeats the same numbers"
    hint = (
        "seed each worker from torch: `seed = torch.initial_seed() % 2**32` (or"
        " get_worker_info().seed) in worker_init_fn, for every library the dataset draws from"
    )
    doc = (
        "Torch seeds each DataLoader worker process from a base seed it draws anew every epoch:"
        " python's `random` and torch get `base_seed + worker_id`, numpy's global stream"
        " (torch >= 1.9) a hash of both. A `worker_init_fn` that reseeds a library from the"
        " worker id alone (`np.random.seed(worker_id)`), or from the id and a value fixed for"
        " the run (`args.seed + worker_id`), throws that away: every epoch's workers repeat the"
        " same numbers, and with the id alone every run does too, whatever the script's seed."
        " Seeds derived from `torch.initial_seed()` or `get_worker_info().seed` are right. Torch"
        " does not reseed OpenCV's `cv2.theRNG` (`cv2.randn`, `cv2.randu`, `cv2.randShuffle`)"
        " nor imgaug's global stream (an `imgaug` augmenter applied in the worker), so without"
        " `cv2.setRNGSeed`/`imgaug.seed` in `worker_init_fn` (or in the region itself) every"
        " worker starts from the same state. albumentations is not reported: 1.x draws from"
        " python's and numpy's streams, which torch reseeds, and whether 2.x's own per-pipeline"
        " generators are reseeded per worker depends on its version, which the static pass"
        " does not see. Nor can it see a seed computed by code outside the project."
    )
    valid = (
        Valid(
            """
            import numpy as np
            import torch
            from torch.utils.data import DataLoader

            def seed_worker(worker_id):
                seed = torch.initial_seed() % 2**32
                np.random.seed(seed)

            loader = DataLoader(range(8), num_workers=2, worker_init_fn=seed_worker)
            """
        ),
        Valid(
            """
            import random
            from torch.utils.data import DataLoader, get_worker_info

            loader = DataLoader(
                range(8), num_workers=2, worker_init_fn=lambda w: random.seed(get_worker_info().seed)
            )
            """
        ),
        Valid(  # torch (>= 1.9) has already reseeded numpy's stream when this runs
            """
            import numpy as np
            from torch.utils.data import DataLoader

            def init(worker_id):
                np.random.seed(np.random.get_state()[1][0] + worker_id)

            loader = DataLoader(range(8), num_workers=2, worker_init_fn=init)
            """
        ),
        Valid(  # OpenCV reseeded per worker
            """
            import cv2
            import torch
            from torch.utils.data import DataLoader, Dataset

            class Noise(Dataset):
                def __getitem__(self, i):
                    return cv2.randn(self.buf, 0, 1)

            def init(worker_id):
                cv2.setRNGSeed(torch.initial_seed() % 2**31)

            loader = DataLoader(Noise(), num_workers=2, worker_init_fn=init)
            """
        ),
    )
    invalid = (
        Invalid(
            """
            import numpy as np
            from torch.utils.data import DataLoader

            loader = DataLoader(
                range(8), num_workers=2, worker_init_fn=lambda wid: np.random.seed(wid)
            )
            """,
            line=5,
            col=57,
        ),
        Invalid(  # through a helper, from the id and a constant of the run
            """
            import random
            import numpy as np
            from torch.utils.data import DataLoader

            SEED = 42

            def set_seed(seed):
                random.seed(seed)
                np.random.seed(seed)

            def init(worker_id):
                set_seed(SEED + worker_id)

            loader = DataLoader(range(8), num_workers=4, worker_init_fn=init)
            """,
            line=9,
        ),
        Invalid(  # imgaug's stream is not reseeded by torch
            """
            import imgaug.augmenters as iaa
            from torch.utils.data import Dataset

            class Images(Dataset):
                def __init__(self):
                    self.seq = iaa.Sequential([iaa.Fliplr(0.5)])

                def __getitem__(self, i):
                    return self.seq(image=self.images[i])
            """,
            line=9,
            col=16,
        ),
        Invalid(  # OpenCV's stream, in a project module's dataset
            """
            from torch.utils.data import DataLoader
            from data import Noise

            loader = DataLoader(Noise(), num_workers=2)
            """,
            line=4,
            col=21,
            files=(
                (
                    "data.py",
                    "import cv2\n\nclass Noise:\n    def __getitem__(self, i):\n"
                    "        return cv2.randu(self.buf, 0, 1)\n",
                ),
            ),
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        a = analysis(unit)
        seen: set[int] = set()
        for draw in a.draws:
            if draw.region.elsewhere:
                continue
            if isinstance(draw.state, Origin) and draw.key in (st.CV2, st.IMGAUG):
                if id(draw.anchor) in seen:
                    continue
                seen.add(id(draw.anchor))
                call = draw.node
                name = draw.func.unit.source.code(call.func) if isinstance(call, cst.Call) else ""
                yield Hit(
                    draw.anchor,
                    message=f"`{name}` draws from {st.STREAM_NAMES[draw.key]}"
                    f" {where_drawn(unit, draw)}: {draw.state.reason}",
                )
        for loader in a.regions.loaders:
            if loader.kind is None:
                continue
            arg = loader.keyword("worker_init_fn")
            for init in loader.init_fns:
                params = init.params
                bound = {p: ({WID} if i == 0 else {RUN}) for i, p in enumerate(params)}
                for node, text, src in seeds(a.regions, init, bound, 0):
                    where = node if init.unit is unit and node is not None else arg
                    if where is None or id(where) in seen:
                        continue
                    seen.add(id(where))
                    yield Hit(where, message=_message(text, src))


def _message(text: str, src: set[str]) -> str:
    if WID in src and RUN not in src:
        return (
            f"`{text}` seeds from the worker id only: every epoch's workers, in every run"
            " whatever its seed, repeat the same numbers"
        )
    if WID in src:
        return (
            f"`{text}` seeds from the worker id and values fixed for the run: every epoch's"
            " workers repeat the same numbers"
        )
    return f"`{text}` gives every worker the same seed: all workers draw the same numbers"
