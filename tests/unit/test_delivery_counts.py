"""The offset-commit metadata of a simple consumer: deliveries a partition's next owner counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.consumer.delivery_counts import MAX_METADATA_CHARS, PREFIX, decode, encode

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=120, deadline=None, database=None, derandomize=True)

bases = st.integers(min_value=0, max_value=2**40)
counts = st.dictionaries(
    st.integers(min_value=0, max_value=5_000), st.integers(min_value=1, max_value=40), max_size=300
)


@PROPERTY
@given(base=bases, offsets=counts)
def test_what_fits_reads_back_and_what_does_not_fit_is_counted(
    base: int, offsets: dict[int, int]
) -> None:
    wanted = {base + d: c for d, c in offsets.items()}
    text, left = encode(base, wanted)
    assert len(text) <= MAX_METADATA_CHARS and text.isascii()
    back = decode(base, text)
    assert len(back) + left == len(wanted)
    assert all(wanted[o] == c for o, c in back.items())
    if back and left:  # the farthest offsets are the ones left out
        assert max(back) < min(set(wanted) - set(back))


@PROPERTY
@given(base=bases, offsets=counts, below=st.integers(min_value=1, max_value=100))
def test_offsets_below_the_committed_one_and_counts_below_one_are_left_out(
    base: int, offsets: dict[int, int], below: int
) -> None:
    wanted = {base + d: c for d, c in offsets.items()}
    text, _ = encode(base + below, {**wanted, base + below - 1: 3, base + below + 10_000: 0})
    back = decode(base + below, text)
    assert all(o >= base + below for o in back)
    assert base + below + 10_000 not in back


def test_runs_are_written_as_ranges() -> None:
    text, left = encode(100, {100: 1, 101: 1, 102: 1, 105: 2, 106: 2, 110: 1})
    assert (text, left) == (PREFIX + "0-2,5-6*2,10", 0)
    assert encode(7, {}) == ("", 0)
    assert encode(7, {3: 1}) == ("", 0)


def test_scattered_offsets_past_the_limit_are_left_out_farthest_first() -> None:
    wanted = {1_000 + 2 * i: 2 for i in range(1_000)}  # no runs: an entry each
    text, left = encode(1_000, wanted)
    back = decode(1_000, text)
    assert left > 0 and len(back) + left == 1_000 and len(text) <= MAX_METADATA_CHARS
    assert sorted(back) == sorted(wanted)[: len(back)]


def test_a_long_run_fits_in_a_few_characters() -> None:
    text, left = encode(0, dict.fromkeys(range(50_000), 1))
    assert (text, left) == (PREFIX + "0-49999", 0)


@PROPERTY
@given(base=bases, text=st.text(max_size=200))
def test_metadata_not_written_here_reads_as_nothing_and_never_raises(base: int, text: str) -> None:
    assert decode(base, text) == {} or text.startswith(PREFIX)
    decode(base, PREFIX + text)  # never raises


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "checkpoint from another tool",
        PREFIX,
        PREFIX + "x",
        PREFIX + "3-1",
        PREFIX + "1*0",
        PREFIX + "0-999999999999",  # would hold a trillion offsets in memory
        PREFIX + "1,,2",
    ],
)
def test_foreign_or_malformed_metadata_is_ignored(text: str | None) -> None:
    assert decode(10, text) == {}
