"""``--deterministic``: DETrain's per-example generators and the deterministic settings.

``rewrite`` is the static side (no torch): the draws the RNG-safety analysis finds in data-parallel
regions are rewritten to draw from the current example's generators. ``examples`` is what the
rewritten code calls at run time, ``settings`` what the training process applies before the
script runs. docs/determinism.md describes the mechanism.
"""

#: the largest run seed (``--seed``): torch's generators take 64 bits
MAX_SEED = (1 << 64) - 1
