"""The name of a checkpoint: which block instance (or main-loop boundary) it holds.

A key reads ``BLOCK@MAIN.ENTRY.ITERATION#OCCURRENCE``: the block's id, the main loop it ran in,
which entry into that loop (a script may run its main loop more than once), the iteration, and
the how-manieth instance of the block in that iteration. A boundary is the main loop's own key,
its block being the main loop and its occurrence 0. It is the checkpoints table's key, the name
of the blob file and part of what the blob's digest is bound to, so every key is built and read
here; the store treats it as an opaque string.

Block and main-loop ids may hold ``.`` and ``:`` (``mingpt.trainer:L17``) but never ``@`` or
``#``, so a key is parsed from the first ``@``, the last ``#`` and the last two ``.`` before it.
"""

from __future__ import annotations

from dataclasses import dataclass


class BadKey(ValueError):
    """A string that is not a checkpoint key."""


@dataclass(frozen=True, order=True)
class CheckpointKey:
    block: str
    main: str
    entry: int
    iteration: int
    occurrence: int = 0

    def __post_init__(self) -> None:
        for name in (self.block, self.main):
            if not name or "@" in name or "#" in name:
                raise BadKey(f"not a block or main-loop id: {name!r}")
        if min(self.entry, self.iteration, self.occurrence) < 0:
            raise BadKey(f"negative position in a checkpoint key: {self!r}")

    @classmethod
    def boundary(cls, main: str, entry: int, iteration: int) -> CheckpointKey:
        """The key of main loop ``main``'s boundary before ``iteration`` of entry ``entry``."""
        return cls(main, main, entry, iteration, 0)

    @property
    def is_boundary(self) -> bool:
        return self.block == self.main

    def __str__(self) -> str:
        return f"{self.block}@{self.main}.{self.entry}.{self.iteration}#{self.occurrence}"

    @classmethod
    def parse(cls, text: str) -> CheckpointKey:
        """The key ``text`` names; :class:`BadKey` if it names none."""
        block, at, rest = text.partition("@")
        where, hash_, occurrence = rest.rpartition("#")
        parts = where.rsplit(".", 2)
        if not (at and hash_ and len(parts) == 3):
            raise BadKey(f"not a checkpoint key: {text!r}")
        main, entry, iteration = parts
        numbers = (entry, iteration, occurrence)
        if not all(n.isascii() and n.isdigit() for n in numbers):
            raise BadKey(f"not a checkpoint key: {text!r}")
        key = cls(block, main, int(entry), int(iteration), int(occurrence))
        if str(key) != text:  # leading zeros: another spelling of a key, not a key
            raise BadKey(f"not a checkpoint key: {text!r}")
        return key


def block_of(text: str) -> str:
    """The block id of key ``text``, without checking the rest of it."""
    return text.partition("@")[0]


def occurrence_of(text: str) -> int:
    """The occurrence of key ``text`` within its iteration."""
    return CheckpointKey.parse(text).occurrence


__all__ = ["BadKey", "CheckpointKey", "block_of", "occurrence_of"]
