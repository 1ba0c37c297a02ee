"""A seed taken from the clock, the process id or OS entropy: seeded, yet different every run."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import seeding
from flortrain.check.finding import Severity
from flortrain.check.flow import callee, every_call
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.seed_origin import origin, seed_param
from flortrain.check.unit import Unit
from flortrain.static.arguments import bind_params
from flortrain.static.program import Scope


class VolatileSeed(Rule):
    code = f"{Family.RANDOMNESS}003"
    name = "volatile-seed"
    severity = Severity.ERROR
    message = "seed taken from the clock, the process id or OS entropy"
    hint = "seed with a fixed number or a command-line argument, and log it"
    doc = (
        "A seed from `time.time()`, `os.getpid()`, `uuid4()`, `hash()` of a string (randomised"
        " per process) or no seed at all (`random.seed()`, `np.random.seed(None)`,"
        " `torch.seed()`, `Generator.seed()`) seeds the stream, so name-matching linters are"
        " satisfied, but differs every run. The pass follows the seed through simple"
        " assignments (`seed = int(time.time())`, `self.seed = ...`) and into the script's own"
        " helpers' parameters (`set_seed(int(time.time()))`). A seed read from the environment"
        " is treated like a command-line argument, an input of the run, and not reported;"
        " `os.environ.get('SEED')` or `os.getenv('SEED')` with no default, passed straight to a"
        " seeding call, is, because an unset variable gives None and None means OS entropy."
        " What it cannot know: values that arrive through a parser or a config file"
        " (`args.seed`, whose default may be the clock), containers, and callers the pass cannot"
        " resolve; both arms of a conditional assignment count (`seed = s if s else time.time()`"
        " is reported)."
    )
    valid = (
        Valid("import torch\ntorch.manual_seed(0)\n"),
        Valid("import os\nimport random\nrandom.seed(int(os.environ['SEED']))\n"),
        Valid("import os\nimport random\nrandom.seed(os.environ.get('SEED', '0'))\n"),
        Valid("import numpy as np\nnp.random.seed(1234)\n"),
        Valid("import random\n\n\ndef set_seed(seed):\n    random.seed(seed)\n\n\nset_seed(7)\n"),
    )
    invalid = (
        Invalid("import time\nimport torch\ntorch.manual_seed(int(time.time()))\n", line=3),
        Invalid("import os\nimport torch\nseed = os.getpid()\ntorch.manual_seed(seed)\n", line=4),
        Invalid("import random\nrandom.seed()\n", line=2),
        Invalid("import numpy as np\nnp.random.seed(None)\n", line=2),
        Invalid(
            "import random\nimport time\n\n\ndef set_seed(seed):\n    random.seed(seed)\n\n\n"
            "set_seed(int(time.time()))\n",
            line=9,
        ),
        Invalid(
            "import time\nimport torch\n\n\nclass Run:\n    def __init__(self):\n"
            "        self.seed = time.time_ns() % 2**32\n\n    def start(self):\n"
            "        torch.manual_seed(self.seed)\n",
            line=10,
            col=9,
        ),
        Invalid("import torch\ng = torch.Generator()\ng.seed()\n", line=3),
        Invalid("import os\nimport random\nrandom.seed(os.environ.get('SEED'))\n", line=3),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        generators: dict[str, set[str]] = {}
        for scope, call in every_call(unit):
            if scope.qualname not in generators:
                generators[scope.qualname] = set(seeding.generator_names(unit, scope))
            found = _judge(unit, scope, call, generators[scope.qualname])
            if found is not None:
                yield Hit(call, message=found)


def _judge(unit: Unit, scope: Scope, call: cst.Call, generators: set[str]) -> str | None:
    names = unit.called(call)
    if names & seeding.ENTROPY_SEEDERS:
        return "seed taken from OS entropy (`torch.seed()`), different every run"
    func = call.func
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value == "seed"
        and isinstance(func.value, cst.Name)
        and func.value.value in generators
        and not call.args
    ):
        return "`Generator.seed()` seeds from OS entropy, different every run"
    taker = seeding.seed_taker(unit, call)
    if taker is not None:
        seed = seeding.seed_argument(call)
        if seed is None or (isinstance(seed, cst.Name) and seed.value == "None"):
            if seeding.none_is_entropy(taker):
                return "seeding with no seed (or None) takes OS entropy, different every run"
            return None
        where = origin(unit, scope, seed)
        return None if where is None else f"seed taken from {where}, different every run"
    target = callee(unit, scope, call)
    if target is None:
        return None
    param = seed_param(target[0], target[1])
    if param is None:
        return None
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    bound = bind_params(call, target[1], receiver if target[1].cls else None).get(param)
    if bound is None:
        return None
    where = origin(unit, scope, bound)
    if where is None:
        return None
    return f"seed passed to `{target[1].qualname}` taken from {where}, different every run"
