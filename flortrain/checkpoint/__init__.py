"""Checkpointing: what a block instance or an iteration boundary holds, when to take it, and how
it reaches the store.

Deciding is apart from doing, the way ``torch.distributed.checkpoint`` separates a planner from
a storage writer: ``period.py`` decides whether a checkpoint is taken, from the estimate the
materializer prepares; capture, the codec, staging and the writer execute what was decided and
never call back into the policy. ``key.py`` names every checkpoint. Kept free of imports so that
a light process (the launcher, ``commands/record.py``) can use the key without torch.
"""
