"""Settings of the spread layout refused when the config is made, not at the first delayed
send or at a coordinator's start."""

from __future__ import annotations

import pytest

from bridge import ClientConfig
from bridge.errors import InvalidArgumentError
from topics.catalog import SystemTopic


def test_a_schedule_topic_too_large_for_the_catalog_is_refused_by_the_config() -> None:
    with pytest.raises(InvalidArgumentError, match=r"per_level .* 12800 partitions"):
        ClientConfig(
            bootstrap_servers="localhost:9092",
            message_delay_level=" ".join(["1s"] * 200),
            delay_partitions_per_level=64,
        )
    # The same table with fewer partitions per level is fine, and so is its catalog.
    fits = ClientConfig(
        bootstrap_servers="localhost:9092",
        message_delay_level=" ".join(["1s"] * 200),
        delay_partitions_per_level=50,
    )
    schedule = fits.catalog().spec(SystemTopic.SCHEDULE)
    assert schedule.partitions == fits.delay_policy.schedule_partitions == 10_000
