"""Random streams by name: which calls create a generator, draw from one, or seed one.

DETrain's RANDOM_CREATE and RANDOM_USE statements, for the libraries training scripts use. A
global stream is named by a key in angle brackets (``<numpy>``); a generator object by the
expression that holds it (``self.rng``). Qualified names come from libcst, so
``np.random.default_rng`` and ``from numpy.random import default_rng`` are the same call.
"""

from __future__ import annotations

import libcst as cst

from flortrain.check.unit import Unit

NUMPY, PYTHON, TORCH, CV2, IMGAUG = "<numpy>", "<random>", "<torch>", "<cv2>", "<imgaug>"

#: how messages name a global stream
STREAM_NAMES = {
    NUMPY: "numpy's global stream",
    PYTHON: "python's global `random` stream",
    TORCH: "torch's global stream",
    CV2: "OpenCV's stream (cv2.theRNG)",
    IMGAUG: "imgaug's global stream",
}

#: constructors of generator objects, and what messages call them
CREATORS = {
    "numpy.random.default_rng": "numpy Generator",
    "numpy.random.Generator": "numpy Generator",
    "numpy.random.RandomState": "numpy RandomState",
    "numpy.random.mtrand.RandomState": "numpy RandomState",
    "random.Random": "random.Random",
    "torch.Generator": "torch.Generator",
    "torch._C.Generator": "torch.Generator",
}

_NUMPY_DRAWS = frozenset(
    [
        "rand",
        "randn",
        "randint",
        "random",
        "random_sample",
        "ranf",
        "sample",
        "choice",
        "shuffle",
        "permutation",
        "permuted",
        "normal",
        "uniform",
        "beta",
        "binomial",
        "poisson",
        "exponential",
        "gamma",
        "standard_normal",
        "standard_cauchy",
        "standard_exponential",
        "standard_gamma",
        "standard_t",
        "multivariate_normal",
        "laplace",
        "lognormal",
        "logistic",
        "bytes",
        "random_integers",
        "geometric",
        "dirichlet",
        "multinomial",
        "triangular",
        "integers",
        "chisquare",
        "f",
        "gumbel",
        "hypergeometric",
        "logseries",
        "negative_binomial",
        "noncentral_chisquare",
        "noncentral_f",
        "pareto",
        "power",
        "rayleigh",
        "vonmises",
        "wald",
        "weibull",
        "zipf",
    ]
)
PYTHON_DRAWS = frozenset(
    [
        "random",
        "randint",
        "randrange",
        "choice",
        "choices",
        "shuffle",
        "sample",
        "uniform",
        "gauss",
        "normalvariate",
        "getrandbits",
        "betavariate",
        "expovariate",
        "triangular",
        "lognormvariate",
        "vonmisesvariate",
        "gammavariate",
        "paretovariate",
        "weibullvariate",
        "randbytes",
        "binomialvariate",
    ]
)
TORCH_DRAWS = frozenset(
    [
        "rand",
        "randn",
        "randint",
        "randperm",
        "normal",
        "bernoulli",
        "multinomial",
        "poisson",
        "rand_like",
        "randn_like",
        "randint_like",
    ]
)
#: in-place tensor methods that draw from torch's stream (or from ``generator=``)
TENSOR_DRAWS = frozenset(
    [
        "uniform_",
        "normal_",
        "random_",
        "bernoulli_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
    ]
)
#: methods of a generator object that draw from it
GENERATOR_DRAWS = _NUMPY_DRAWS | PYTHON_DRAWS
#: methods that reseed a generator object in place
RESEEDS = frozenset({"seed", "manual_seed", "set_state", "setstate", "set_random_state"})

#: numpy's global-stream draws (``np.random.rand``): the legacy module functions, that is the
#: draws but for ``integers`` and ``permuted``, which only a ``Generator`` has
NUMPY_GLOBAL_DRAWS = frozenset(f"numpy.random.{n}" for n in _NUMPY_DRAWS - {"integers", "permuted"})

_GLOBAL_DRAWS: dict[str, str] = {
    **dict.fromkeys(NUMPY_GLOBAL_DRAWS, NUMPY),
    **{f"random.{n}": PYTHON for n in PYTHON_DRAWS},
    **{f"torch.{n}": TORCH for n in TORCH_DRAWS},
    "cv2.randn": CV2,
    "cv2.randu": CV2,
    "cv2.randShuffle": CV2,
}
SEEDERS: dict[str, str] = {
    "numpy.random.seed": NUMPY,
    "random.seed": PYTHON,
    "torch.manual_seed": TORCH,
    "torch.random.manual_seed": TORCH,
    "cv2.setRNGSeed": CV2,
    "imgaug.seed": IMGAUG,
    "imgaug.random.seed": IMGAUG,
}
#: torchvision transforms that draw from torch's stream when called
_TV_RANDOM = frozenset(
    [
        "ColorJitter",
        "RandAugment",
        "AutoAugment",
        "TrivialAugmentWide",
        "AugMix",
        "GaussianBlur",
        "ElasticTransform",
    ]
)


def global_draw(unit: Unit, call: cst.Call) -> str | None:
    """The global stream ``call`` draws from (None: not a draw from a global stream)."""
    for q in unit.called(call):
        if q in _GLOBAL_DRAWS:
            return _GLOBAL_DRAWS[q]
    return None


def seeded_stream(unit: Unit, call: cst.Call) -> str | None:
    for q in unit.called(call):
        if q in SEEDERS:
            return SEEDERS[q]
    return None


def creator(unit: Unit, expr: cst.BaseExpression) -> str | None:
    """The kind of generator ``expr`` creates (``default_rng(..)``, ``torch.Generator()
    .manual_seed(..)``), or None."""
    if not isinstance(expr, cst.Call):
        return None
    for q in unit.called(expr):
        if q in CREATORS:
            return CREATORS[q]
    f = expr.func
    if isinstance(f, cst.Attribute) and f.attr.value == "manual_seed":
        return creator(unit, f.value)
    return None


def random_transform(unit: Unit, expr: cst.BaseExpression) -> bool:
    """``expr`` builds a torchvision random transform (or a pipeline holding one)."""
    if not isinstance(expr, cst.Call):
        return False
    for q in unit.called(expr):
        if q.startswith("torchvision.transforms."):
            name = q.rsplit(".", 1)[1]
            if name.startswith("Random") or name in _TV_RANDOM:
                return True
    return any(
        random_transform(unit, el.value)
        for a in expr.args
        if isinstance(a.value, cst.List | cst.Tuple)
        for el in a.value.elements
    )


def imgaug_object(unit: Unit, expr: cst.BaseExpression) -> bool:
    """``expr`` builds an imgaug augmenter, which draws from imgaug's stream when applied."""
    return isinstance(expr, cst.Call) and any(q.startswith("imgaug.") for q in unit.called(expr))
