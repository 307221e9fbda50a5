"""Where Kafka places a group or transactional id, as the local broker's readiness probes
compute it: one probe per partition of ``__consumer_offsets`` and ``__transaction_state``."""

from __future__ import annotations

import pytest

from bridge.runtime.local_kafka import coordinator_partition, java_string_hash, probe_keys


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        # Java's String.hashCode overflows: these are the values a JVM prints.
        ("rocketmq-kafka-bridge", -287279035),
        ("polygenelubricants", -(2**31)),
        ("\u00e9t\u00e9", 227742),
        ("\U0001f600", 1772899),  # one code point, two UTF-16 code units
    ],
)
def test_java_string_hash_matches_the_jvm(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_min_value_hash_goes_to_partition_zero_as_kafka_utils_abs_does() -> None:
    # Utils.abs(Integer.MIN_VALUE) is 0, not a negative number.
    assert coordinator_partition("polygenelubricants", 7) == 0
    assert coordinator_partition("rocketmq-kafka-bridge", 10) == 287279035 % 10


@pytest.mark.parametrize("partitions", [1, 3, 10, 50])
def test_probe_keys_cover_every_partition_once(partitions: int) -> None:
    keys = probe_keys("bridge-local-ready", partitions)
    assert sorted(keys) == list(range(partitions))
    for partition, key in keys.items():
        assert coordinator_partition(key, partitions) == partition
