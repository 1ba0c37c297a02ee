"""A draw from a random stream that nothing seeded on the path before it."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import seeding
from flortrain.check.finding import Severity
from flortrain.check.flow import Step, steps
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit

_SET_SEED = (
    "seed.py",
    "import random\nimport numpy as np\nimport torch\n\n\ndef set_seed(seed):\n"
    "    random.seed(seed)\n    np.random.seed(seed)\n    torch.manual_seed(seed)\n",
)


class UnseededRandomness(Rule):
    code = f"{Family.RANDOMNESS}002"
    name = "unseeded-randomness"
    severity = Severity.ERROR
    message = "draw from a random stream that nothing seeds before it"
    hint = "seed the stream first (torch.manual_seed, np.random.seed, random.seed or a set_seed helper)"
    doc = (
        "torch's, NumPy's and the `random` module's global generators start from OS entropy in"
        " a fresh process, so a draw before the script seeds them (`torch.randn`,"
        " `DataLoader(shuffle=True)`, `random_split` without `generator=`, `np.random.*`,"
        " `random.*`) differs from run to run and a replay cannot reproduce it. The pass walks"
        " the script in execution order, into its own functions and the project modules it"
        " imports, so a seed set inside a `set_seed()` helper counts, as do library helpers such"
        " as Lightning's `seed_everything` and transformers' `set_seed`. It reports each stream"
        " once, at its first unseeded draw, and every NumPy or `random.Random` generator made"
        " without a seed. What it cannot know: both arms of an `if` are taken as run (a seed"
        " under a condition counts); calls into libraries and callables passed as arguments are"
        " not followed (a framework that seeds for you looks unseeded: `# noqa: RNG002`);"
        " functions the walk never calls but the path can still run (`__getitem__` of a"
        " Dataset it makes, a callback it hands on) are judged by whether the script seeds the"
        " stream anywhere, and functions it never names are not judged; draws hidden in"
        " module construction (`nn.Linear` initialising its weights), dropout, sampling"
        " through `torch.distributions` or augmentation libraries are not counted. A"
        " `torch.Generator()` made without `manual_seed` is not reported: it starts from a fixed"
        " default seed, so it is reproducible (if every such generator yields the same stream)."
    )
    valid = (
        Valid("import torch\ntorch.manual_seed(0)\nx = torch.randn(3)\n"),
        Valid(
            "import random\n\n\ndef set_seed(s):\n    random.seed(s)\n\n\n"
            "def main():\n    set_seed(0)\n    random.shuffle([1, 2])\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
        Valid(
            "import torch\nfrom seed import set_seed\nset_seed(1)\nx = torch.rand(2)\n",
            files=(_SET_SEED,),
        ),
        Valid(
            "import torch\nfrom pkg.setup import setup\nsetup()\nx = torch.rand(2)\n",
            files=(
                ("pkg/__init__.py", ""),
                (
                    "pkg/setup.py",
                    "from pkg.seeding import set_seed\n\n\ndef setup():\n    set_seed(0)\n",
                ),
                ("pkg/seeding.py", _SET_SEED[1]),
            ),
        ),
        Valid("import numpy as np\nrng = np.random.default_rng(0)\nx = rng.normal()\n"),
        Valid(
            "import torch\nfrom torch.utils.data import DataLoader\ng = torch.Generator()\n"
            "g.manual_seed(0)\nloader = DataLoader([1, 2], shuffle=True, generator=g)\n"
        ),
        Valid(
            "import numpy as np\nimport torch\n\n\nclass Noisy(torch.utils.data.Dataset):\n"
            "    def __getitem__(self, i):\n        return np.random.rand()\n\n\n"
            "if __name__ == '__main__':\n    np.random.seed(0)\n"
            "    for x in torch.utils.data.DataLoader(Noisy()):\n        print(x)\n"
        ),
        Valid(
            "import numpy as np\nimport torch\n\n\nclass Noisy(torch.utils.data.Dataset):\n"
            "    def __getitem__(self, i):\n        return np.random.rand()\n\n\n"
            "def prepare():\n    print('preparing')\n\n\n"
            "if __name__ == '__main__':\n    prepare()\n"
        ),
        Valid(
            "import lightning as L\nimport numpy as np\nL.seed_everything(3)\n"
            "x = np.random.rand()\n"
        ),
    )
    invalid = (
        Invalid("import torch\nx = torch.randn(3)\ntorch.manual_seed(0)\n", line=2, col=5),
        Invalid(
            "import numpy as np\nimport torch\ntorch.manual_seed(0)\nx = np.random.normal()\n",
            line=4,
            col=5,
        ),
        Invalid(
            "import random\n\n\ndef set_seed(s):\n    random.seed(s)\n\n\n"
            "def main():\n    random.shuffle([1, 2])\n    set_seed(0)\n\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=9,
            col=5,
        ),
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader\n"
            "loader = DataLoader([1, 2], shuffle=True)\n",
            line=3,
            col=10,
        ),
        Invalid("import numpy as np\nrng = np.random.default_rng()\n", line=2, col=7),
        Invalid(
            "import torch\nimport seed\nx = torch.rand(2)\nseed.set_seed(1)\n",
            line=3,
            col=5,
            files=(_SET_SEED,),
        ),
        Invalid(
            "import numpy as np\nimport torch\n\n\nclass Noisy(torch.utils.data.Dataset):\n"
            "    def __getitem__(self, i):\n        return np.random.rand()\n\n\n"
            "if __name__ == '__main__':\n    torch.manual_seed(0)\n"
            "    for x in torch.utils.data.DataLoader(Noisy()):\n        print(x)\n",
            line=7,
            col=16,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        seeded: set[str] = set()
        reported: set[str] = set()
        path = steps(unit)
        anywhere = {s for step in path if isinstance(step.node, cst.Call) for s in _seeds(step)}
        for step in path:
            if not isinstance(step.node, cst.Call):
                continue
            seeded |= _seeds(step)
            found = seeding.draw(step.unit, step.node)
            if found is None:
                continue
            stream, spelled = found
            if stream in reported or stream in (seeded if step.reached else anywhere):
                continue
            reported.add(stream)
            yield Hit(
                step.anchor,
                message=f"draw from {seeding.LABELS[stream]} (`{spelled}`) with no seeding"
                " of it on the path before",
            )
        for call in unit.calls:
            made = seeding.unseeded_generator(unit, call)
            if made is not None:
                yield Hit(
                    call, message=f"generator `{made}` made with no seed starts from OS entropy"
                )


def _seeds(step: Step) -> frozenset[str]:
    assert isinstance(step.node, cst.Call)
    return seeding.seeded(step.unit, step.node)
