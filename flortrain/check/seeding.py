"""Random streams: which calls draw from a global stream, which seed one, which make a generator
with no seed, and where a seed's value comes from.

Three global streams matter to a training script: torch's default generator, NumPy's legacy
global ``RandomState`` (``np.random.*``) and the ``random`` module's. Each starts from OS entropy
in a fresh process, so a draw before the script seeds it differs run to run. Library helpers
that seed all three (Lightning's ``seed_everything``, transformers' ``set_seed``, ...) are known
by name; the script's own helpers are not matched by name but walked into (:mod:`.flow`).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check.streams import NUMPY_GLOBAL_DRAWS, PYTHON_DRAWS, TORCH_DRAWS
from flortrain.check.unit import Unit
from flortrain.static.expressions import argument
from flortrain.static.program import Scope

TORCH = "torch"
NUMPY = "numpy"
PYTHON = "random"
LABELS = {
    TORCH: "torch's global generator",
    NUMPY: "numpy's global generator (np.random)",
    PYTHON: "the random module's global generator",
}
_ALL = frozenset(LABELS)

#: library helpers that seed torch, numpy and random at once
_LIBRARY_SEEDERS = (
    "lightning.seed_everything",
    "lightning.pytorch.seed_everything",
    "lightning.fabric.seed_everything",
    "lightning.fabric.utilities.seed.seed_everything",
    "lightning.pytorch.utilities.seed.seed_everything",
    "lightning_fabric.utilities.seed.seed_everything",
    "pytorch_lightning.seed_everything",
    "pytorch_lightning.utilities.seed.seed_everything",
    "transformers.set_seed",
    "transformers.trainer_utils.set_seed",
    "transformers.enable_full_determinism",
    "transformers.trainer_utils.enable_full_determinism",
    "accelerate.utils.set_seed",
    "accelerate.utils.random.set_seed",
    "fastai.torch_core.set_seed",
    "mmengine.runner.set_random_seed",
    "mmengine.set_random_seed",
    "detectron2.utils.env.seed_all_rng",
    "monai.utils.set_determinism",
    "ignite.utils.manual_seed",
    "timm.utils.random_seed",
    "keras.utils.set_random_seed",
)

#: calls that seed global streams, by qualified name
SEEDERS: dict[str, frozenset[str]] = {
    "torch.manual_seed": frozenset({TORCH}),
    "torch.random.manual_seed": frozenset({TORCH}),
    "torch.set_rng_state": frozenset({TORCH}),
    "torch.random.set_rng_state": frozenset({TORCH}),
    "numpy.random.seed": frozenset({NUMPY}),
    "numpy.random.set_state": frozenset({NUMPY}),
    "random.seed": frozenset({PYTHON}),
    "random.setstate": frozenset({PYTHON}),
    **{name: _ALL for name in _LIBRARY_SEEDERS},
}

#: seeding calls whose seed is their first argument (or the keyword), for where a seed comes from
_SEED_TAKERS = frozenset(
    {
        "torch.manual_seed",
        "torch.random.manual_seed",
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "numpy.random.seed",
        "numpy.random.default_rng",
        "numpy.random.RandomState",
        "numpy.random.SeedSequence",
        "random.seed",
        "random.Random",
        *_LIBRARY_SEEDERS,
    }
)
#: of those, the ones that seed from OS entropy when given no seed or None
_NONE_IS_ENTROPY = frozenset({"numpy.random.seed", "random.seed"})
#: calls that always reseed from OS entropy or the clock
ENTROPY_SEEDERS = frozenset(
    {"torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all"}
)

#: torch's global-stream draws: the functions both stream analyses know
#: (:mod:`flortrain.check.streams`), and the ``nn.init`` initialisers, which draw too
_TORCH_DRAWS = frozenset(f"torch.{n}" for n in TORCH_DRAWS) | frozenset(
    f"torch.nn.init.{i}"
    for i in (
        "uniform_",
        "normal_",
        "trunc_normal_",
        "xavier_uniform_",
        "xavier_normal_",
        "kaiming_uniform_",
        "kaiming_normal_",
        "orthogonal_",
        "sparse_",
    )
)
#: in-place sampling methods of tensors (no other common type has these names)
_TORCH_DRAW_METHODS = frozenset(
    {
        "normal_",
        "uniform_",
        "bernoulli_",
        "random_",
        "exponential_",
        "cauchy_",
        "log_normal_",
        "geometric_",
    }
)
#: torch.utils.data objects that draw from torch's generator unless given ``generator=``
_TORCH_DATA = {
    "torch.utils.data.random_split": "random_split",
    "torch.utils.data.dataset.random_split": "random_split",
    "torch.utils.data.RandomSampler": "RandomSampler",
    "torch.utils.data.sampler.RandomSampler": "RandomSampler",
}
_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
#: the random module's draws, as :mod:`flortrain.check.streams` names them for both analyses
_PYTHON_DRAWS = frozenset(f"random.{n}" for n in PYTHON_DRAWS)
#: generators that start from OS entropy when made without a seed
_GENERATORS = {
    "numpy.random.default_rng": "np.random.default_rng()",
    "numpy.random.RandomState": "np.random.RandomState()",
    "numpy.random.SeedSequence": "np.random.SeedSequence()",
    "random.Random": "random.Random()",
}


def seeded(unit: Unit, call: cst.Call) -> frozenset[str]:
    """The global streams a library call seeds."""
    out: frozenset[str] = frozenset()
    for q in unit.called(call):
        out |= SEEDERS.get(q, frozenset())
    return out


def draw(unit: Unit, call: cst.Call) -> tuple[str, str] | None:
    """The global stream a call draws from, and how the call is spelled, or None."""
    if argument(call, "generator") is not None:
        return None
    names = unit.called(call)
    for q in names:
        if q in _TORCH_DRAWS:
            return TORCH, q
        if q in _TORCH_DATA:
            return TORCH, _TORCH_DATA[q]
        if q in _LOADERS:
            shuffle = argument(call, "shuffle")
            if (
                shuffle is not None
                and _truthy(shuffle)
                and argument(call, "sampler") is None
                and argument(call, "batch_sampler") is None
            ):
                return TORCH, "DataLoader(shuffle=True)"
            return None
        if q in NUMPY_GLOBAL_DRAWS:
            return NUMPY, "np." + q.split(".", 1)[1]
        if q in _PYTHON_DRAWS:
            return PYTHON, q
    func = call.func
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value in _TORCH_DRAW_METHODS
        and not any(q.startswith("numpy.") for q in names)
    ):
        return TORCH, f"Tensor.{func.attr.value}"
    return None


def unseeded_generator(unit: Unit, call: cst.Call) -> str | None:
    """How a generator made with no seed (or ``None``) is spelled, or None."""
    for q in unit.called(call):
        if q in _GENERATORS:
            arg = seed_argument(call)
            if arg is None or _is_none(arg):
                return _GENERATORS[q]
    return None


def seed_taker(unit: Unit, call: cst.Call) -> str | None:
    """The qualified name of a call that takes a seed as its first argument (``torch.manual_seed``,
    ``random.Random``, ``seed_everything``...), or of ``<generator>.manual_seed``."""
    for q in unit.called(call):
        if q in _SEED_TAKERS:
            return q
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "manual_seed":
        return "Generator.manual_seed"
    return None


def none_is_entropy(name: str) -> bool:
    return name in _NONE_IS_ENTROPY


def seed_argument(call: cst.Call) -> cst.BaseExpression | None:
    """The seed a seeding call is given: its first positional argument, or a keyword
    spelled like a seed."""
    for a in call.args:
        if a.keyword is None and not a.star:
            return a.value
        if a.keyword is not None and a.keyword.value in ("seed", "a", "x", "entropy"):
            return a.value
    return None


def generator_names(unit: Unit, scope: Scope) -> Iterator[str]:
    """Names bound in ``scope`` to a ``torch.Generator(...)``."""
    for name, values in scope.assigned.items():
        for v in values:
            if isinstance(v, cst.Call) and unit.called(v) & {
                "torch.Generator",
                "torch._C.Generator",
            }:
                yield name
                break


def _truthy(expr: cst.BaseExpression) -> bool:
    """Not the literal ``False``/``None``/``0``: a flag that may be on."""
    if isinstance(expr, cst.Name):
        return expr.value not in ("False", "None")
    if isinstance(expr, cst.Integer):
        return expr.value != "0"
    return True


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"
