"""The restore price: what reading a checkpoint back costs, in the seconds it cost to take.

Flor's Eq. 3: restoring a checkpoint takes ``c`` times the time ``M`` it held the record
materializing it, ``c`` being the restore/materialize ratio a replay measured. The record's
period weighs a checkpoint against it (a block cheaper than its restore is not worth one) and
the replay's cost model prices every skipped instance by it, so both take it from here.
"""

from __future__ import annotations


def restore_price(ratio: float, materialize_s: float | None) -> float:
    """Seconds to restore a checkpoint that held the record ``materialize_s`` seconds: ``c``
    times that (Eq. 3), ``c`` being the restore/materialize ratio a replay measured."""
    return ratio * (materialize_s or 0.0)


__all__ = ["restore_price"]
