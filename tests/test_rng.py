"""RNG stream digests: the memo that spares re-hashing an unchanged stream must never hand back
a stale digest (``diff`` compares these digests between a record and its replay)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from flortrain.runtime import rng


def _variants(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The state, then copies that each differ from it in one part of one stream only."""
    name, key, pos, has_gauss, gauss = state["numpy"]
    r = state["random"]
    flipped = state["torch"].clone()
    flipped[-1] ^= 1
    other_key = key.copy()
    other_key[0] ^= 1
    return [
        state,
        {**state, "random": (r[0], (*r[1][:-1], r[1][-1] + 1), r[2])},  # its position only
        {**state, "numpy": (name, other_key, pos, has_gauss, gauss)},
        {**state, "numpy": (name, key, pos + 1, has_gauss, gauss)},
        {**state, "numpy": (name, key, pos, 1 - has_gauss, gauss)},
        {**state, "numpy": (name, key, pos, has_gauss, gauss + 0.5)},  # the cached Gaussian only
        {**state, "torch": flipped},
        state,
    ]


def test_a_memoized_digest_is_the_digest_of_the_state_given() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    memo: dict[str, tuple[Any, str]] = {}
    seen = []
    for state in _variants(rng.capture()):
        got = rng.digest_map(state, memo)
        assert got == rng.digest_map(state)
        seen.append(tuple(sorted(got.items())))
    assert len(set(seen)) == len(seen) - 1  # every variant told apart; the last is the first again


def test_a_stream_the_script_draws_from_gets_a_new_digest_with_the_memo() -> None:
    memo: dict[str, tuple[Any, str]] = {}
    first = rng.digest_map(rng.capture(), memo)
    np.random.standard_normal()  # numpy moves, and caches the second Gaussian of its pair
    second = rng.digest_map(rng.capture(), memo)
    assert second["numpy"] != first["numpy"]
    assert {k: v for k, v in second.items() if k != "numpy"} == {k: v for k, v in first.items() if k != "numpy"}
    torch.rand(3)
    random.random()
    third = rng.digest_map(rng.capture(), memo)
    assert third["torch"] != second["torch"] and third["random"] != second["random"]
    assert third == rng.digest_map(rng.capture())
