"""Shuffle partitions of the Spark jobs: one per core unless BRIDGE_SPARK_PARTITIONS says."""

from __future__ import annotations

import pytest

from spark_jobs.common import ENV_SPARK_PARTITIONS, shuffle_partitions
from topics.errors import InvalidArgumentError


def test_one_partition_per_core_by_default() -> None:
    assert shuffle_partitions({}, 2) == 2
    assert shuffle_partitions({ENV_SPARK_PARTITIONS: " "}, 8) == 8
    assert shuffle_partitions({}, 0) == 1


def test_the_variable_wins() -> None:
    assert shuffle_partitions({ENV_SPARK_PARTITIONS: "16"}, 2) == 16


@pytest.mark.parametrize("value", ["0", "-3", "four", "2.5"])
def test_a_bad_value_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match=ENV_SPARK_PARTITIONS):
        shuffle_partitions({ENV_SPARK_PARTITIONS: value}, 2)
