"""flortrain: hindsight logging for PyTorch training scripts.

Record a training run once (``flortrain record train.py``); later add logging statements to the
script and ``flortrain replay train.py`` prints what they would have printed during the original run,
bit-identical, by skipping every memoized loop it can.

Importing this package never imports torch: the static side (``instrument``, ``check``) must stay
light enough for a pre-commit hook. The runtime imports torch lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
