"""The names of tensor bytes: the content addresses of the store's objects
(``objects/ab/<name>``), the names by which a checkpoint refers to a tensor kept from the main
loop's entry, and the per-tensor digests ``diff`` compares.

A name is the 128-bit XXH3 of the bytes, in hex. Hashing is the largest per-byte cost a
checkpoint has, paid by the writer on cores training keeps busy (``checkpoint/period.py``), on the
training thread to name a frozen table, and by every replay to verify each object it reads; XXH3
is over an order of magnitude cheaper per byte than sha256.

What the name is for decides what hash it needs. It is not a signature: the store is the user's
own, and the blob that refers to an object is itself named by a sha256 (``store.checkpoints.write_durably``)
that a replay verifies before reading anything it refers to. The name must (1) tell two different
tensors apart, so that an object written for one is never restored as another, and (2) catch bytes
damaged on disk (a bit flip, a truncation), so that a damaged object is a missing checkpoint,
never a wrong one. A 128-bit hash of XXH3's quality does both: the chance that any two of a
billion distinct tensors share a name is about 1e-21, and it changes with every bit of its input.
A collision crafted on purpose is outside what it guards against, as the store's files are
writable by their owner anyway.
"""

from __future__ import annotations

from typing import Any

import xxhash


def name(data: Any) -> str:
    """The name of a buffer's bytes (anything with the buffer protocol: bytes, a memoryview of
    the staging arena, a tensor's numpy view)."""
    return xxhash.xxh3_128_hexdigest(data)


def verifies(data: Any, expected: str) -> bool:
    """Whether bytes read back are the ones named ``expected``."""
    return name(data) == expected
