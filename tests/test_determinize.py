"""The static half of ``--deterministic``: which draws the rewrite puts on per-example
generators, and that every edit keeps its line (block ids, probes and tracebacks depend on it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from flortrain.determinism.rewrite import determinize
from tests.protocol import flortrain

SCRIPT = textwrap.dedent(
    """\
    import random
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Aug(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return self.jitter(torch.zeros(3)) + random.random()

        def jitter(self, x):
            return x.normal_() + torch.rand(
                3,
            )


    class Seeded(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            np.random.seed(i)
            return np.random.rand()


    def noisy(x):
        return x + np.random.normal()


    loader = DataLoader(Aug(), batch_size=2)
    other = DataLoader(Seeded(), batch_size=2)
    main_noise = np.random.rand()
    with ThreadPoolExecutor(2) as ex:
        out = list(ex.map(noisy, range(4)))
        fut = ex.submit(noisy, 1.0)
    """
)


def test_region_draws_are_rewritten_and_lines_kept() -> None:
    r = determinize("train.py", SCRIPT)
    before, after = SCRIPT.splitlines(), r.text.splitlines()
    assert len(before) == len(after)
    changed = {i + 1: a for i, (b, a) in enumerate(zip(before, after, strict=True)) if a != b}
    # a dataset loaded in the main process (num_workers=0) draws per example too, through a
    # method it calls; a draw seeded by the call itself and one in the main thread stay
    assert changed == {
        14: "        return self.jitter(torch.zeros(3)) + __flortrain_det__.python().random()",
        17: "        return x.normal_(generator=__flortrain_det__.torch()) + torch.rand(",
        19: "         generator=__flortrain_det__.torch())",
        32: "    return x + __flortrain_det__.numpy().normal()",
        39: '    out = list(__flortrain_det__.mapped("<module>#0", ex.map, noisy, range(4)))',
        40: '    fut = ex.submit(__flortrain_det__.keyed("<module>#1", noisy), 1.0)',
    }
    assert (r.draws, r.pools, r.left) == (4, 2, ())
    compile(r.text, "train.py", "exec")


def test_main_loops_count_their_iterations_only_when_asked() -> None:
    text = "for epoch in range(2):\n    for step in range(3):\n        pass\n"
    assert determinize("t.py", text).text == text
    counted = determinize("t.py", text, count_main_loops=True).text
    assert counted.splitlines()[0] == 'for epoch in __flortrain_det__.epochs("M1", range(2)):'


def test_instrument_shows_the_rewrite(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    shown = flortrain(tmp_path, "instrument", "--deterministic", "train.py")
    assert shown.code == 0, shown.err
    assert "x + __flortrain_det__.numpy().normal()" in shown.out
    assert "4 draw(s) in data-parallel regions rewritten" in shown.err
    plain_shown = flortrain(tmp_path, "instrument", "train.py")
    assert "__flortrain_det__" not in plain_shown.out
