"""A stand-in for the few torchvision pieces the corpus's scripts use (benchmarks/corpus.py).

torchvision does not import beside this torch build and its data sets cannot be downloaded
here, so the corpus runner puts this package on PYTHONPATH: data sets of seeded synthetic
images of the real shapes (small, so that a script trains in seconds), the transforms those
scripts compose, and ``utils.save_image`` writing a small digest of the image instead of a PNG.
Its generators are private, so a script's own RNG streams are the ones it would have."""

from . import datasets, transforms, utils

__all__ = ["datasets", "transforms", "utils"]
__version__ = "0.0-corpus-shim"
