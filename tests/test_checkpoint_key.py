"""A checkpoint key built from its parts parses back to them, and nothing else parses."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flortrain.checkpoint.key import BadKey, CheckpointKey, block_of

# block and main-loop ids as the static pass makes them (`L17`, `mingpt.trainer:L17`), and any
# other text without the two separators
ids = st.one_of(
    st.builds(
        "{}{}{}".format,
        st.sampled_from(["", "mingpt.trainer:", "pkg.sub_1:"]),
        st.sampled_from("LM"),
        st.integers(min_value=1, max_value=99_999),
    ),
    st.text(min_size=1, max_size=24).filter(lambda s: "@" not in s and "#" not in s),
)
positions = st.integers(min_value=0, max_value=10**9)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(ids, ids, positions, positions, positions)
def test_a_key_round_trips_through_its_text(
    block: str, main: str, entry: int, iteration: int, occurrence: int
) -> None:
    key = CheckpointKey(block, main, entry, iteration, occurrence)
    text = str(key)
    assert CheckpointKey.parse(text) == key
    assert block_of(text) == block


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(ids, positions, positions)
def test_a_boundary_is_its_main_loop_s_own_key(main: str, entry: int, iteration: int) -> None:
    key = CheckpointKey.parse(str(CheckpointKey.boundary(main, entry, iteration)))
    assert key.is_boundary and (key.block, key.main, key.occurrence) == (main, main, 0)


def test_the_text_of_a_key() -> None:
    assert (
        str(CheckpointKey("mingpt.trainer:L17", "M3", 1, 40, 2)) == "mingpt.trainer:L17@M3.1.40#2"
    )
    assert CheckpointKey.parse("L5@M1.0.3#0") == CheckpointKey("L5", "M1", 0, 3, 0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "L5",
        "L5@M1.0.3",
        "L5@M1.0#0",
        "@M1.0.3#0",
        "L5@.0.3#0",
        "L5@M1.0.-3#0",
        "L5@M1.0.03#0",
        "L5@M1.0.3#x",
        "L5@M1.0.3#٣",
        "L5@M#1.0.3#0",
    ],
)
def test_what_is_not_a_key_is_refused(text: str) -> None:
    with pytest.raises(BadKey):
        CheckpointKey.parse(text)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_any_text_parses_to_a_key_that_spells_it_or_is_refused(text: str) -> None:
    try:
        key = CheckpointKey.parse(text)
    except BadKey:
        return
    assert str(key) == text
