"""The final window's offset metadata (``bridge.coordinator.delay.fetch``): which records above a
partition's committed offset were delivered out of order, in the offset commit of the same
Kafka transaction.

What it promises: decoding what was encoded gives back exactly the records not done, so a
restart skips every record delivered and no other; bounded input stays far below the broker's
``offset.metadata.max.bytes``; metadata it did not write means nothing is done past the
committed offset, and malformed metadata of its own format is refused with a typed error.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.coordinator.delay.fetch import (
    _OUT_OF_ORDER_MAX,
    METADATA_MAX_CHARS,
    decode_done,
    encode_done,
)
from bridge.errors import WireFormatError

PROPERTY = settings(max_examples=300, derandomize=True, database=None, deadline=None)


@PROPERTY
@given(
    base=st.integers(0, 2**62),
    span=st.integers(2, 10_000_000),
    picks=st.lists(st.integers(1, 10_000_000), max_size=_OUT_OF_ORDER_MAX, unique=True),
)
def test_what_is_encoded_decodes_to_the_same_records_not_done(
    base: int, span: int, picks: list[int]
) -> None:
    high = base + span
    undone = sorted(base + p for p in picks if p < span)
    metadata = encode_done(base, high, undone)
    assert metadata is not None
    assert len(metadata) <= METADATA_MAX_CHARS
    got_high, got_undone = decode_done(base, metadata)
    assert got_high == high
    assert got_undone == {base, *undone}
    # A record is skipped on a restart exactly when it was delivered.
    for offset in {base, base + 1, high - 1, high, *undone[:5]}:
        skipped = offset < got_high and offset not in got_undone
        assert skipped == (base <= offset < high and offset not in {base, *undone})


def test_nothing_done_past_the_committed_offset_writes_no_metadata() -> None:
    assert encode_done(10, 11, []) is None
    assert encode_done(10, 5, []) is None
    assert encode_done(10, 12, []) == "w1:2:"
    assert decode_done(10, "w1:2:") == (12, {10})


@pytest.mark.parametrize("metadata", [None, "", "something else", "w2:5:1"])
def test_metadata_not_written_here_means_nothing_done_past_the_offset(
    metadata: str | None,
) -> None:
    assert decode_done(7, metadata) == (0, set())


@pytest.mark.parametrize("metadata", ["w1:x:1", "w1:5:a", "w1:5", "w1:0:", "w1:5:5", "w1:5:0,2"])
def test_malformed_metadata_of_its_own_format_is_refused(metadata: str) -> None:
    with pytest.raises(WireFormatError, match="offset metadata"):
        decode_done(7, metadata)
