"""Shuffle partitions of the Spark jobs: 4 unless BRIDGE_SPARK_PARTITIONS says."""

from __future__ import annotations

import pytest

from spark_jobs.common import DEFAULT_SPARK_PARTITIONS, ENV_SPARK_PARTITIONS, shuffle_partitions
from topics.errors import InvalidArgumentError


def test_four_partitions_by_default() -> None:
    assert shuffle_partitions({}) == DEFAULT_SPARK_PARTITIONS == 4
    assert shuffle_partitions({ENV_SPARK_PARTITIONS: " "}) == 4


def test_the_variable_wins() -> None:
    assert shuffle_partitions({ENV_SPARK_PARTITIONS: "16"}) == 16


@pytest.mark.parametrize("value", ["0", "-3", "four", "2.5"])
def test_a_bad_value_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match=ENV_SPARK_PARTITIONS):
        shuffle_partitions({ENV_SPARK_PARTITIONS: value})
