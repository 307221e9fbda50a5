"""A coordinator (or ``bridge topics create --system``) whose level or tier count differs
from the one a spread SCHEDULE or timer topic was laid out for: before the spread layout a
larger count was refused (the topic had fewer partitions than levels or tiers), which
``ClientConfig.timer_max_delay_ms`` still promises; now the topic is expanded and the
records waiting in its lanes past the first are read as other levels or tiers."""

from __future__ import annotations

import pytest

from bridge import ClientConfig
from bridge.errors import TopicProvisioningError
from bridge.kafka.admin import TopicAdmin
from topics.catalog import SystemTopic

pytestmark = pytest.mark.broker

DAY_MS = 86_400_000


def _partitions(config: ClientConfig, system: SystemTopic) -> int:
    return TopicAdmin(config).list_topics()[config.catalog().topic(system)]


def test_another_tier_count_is_refused_on_a_spread_timer_topic(
    kafka_bootstrap: str, namespace: str
) -> None:
    laid_out = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, timer_partitions_per_tier=2
    )
    TopicAdmin(laid_out).ensure_system_topics(laid_out.catalog())
    assert _partitions(laid_out, SystemTopic.TIMER) == 36  # 18 tiers x 2
    longer = laid_out.replace(timer_max_delay_ms=7 * DAY_MS)  # 20 tiers
    with pytest.raises(TopicProvisioningError, match="tier"):
        TopicAdmin(longer).ensure_system_topics(longer.catalog())
    assert _partitions(laid_out, SystemTopic.TIMER) == 36


def test_appended_levels_are_refused_on_a_spread_schedule_topic(
    kafka_bootstrap: str, namespace: str
) -> None:
    laid_out = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, delay_partitions_per_level=2
    )
    TopicAdmin(laid_out).ensure_system_topics(laid_out.catalog())
    assert _partitions(laid_out, SystemTopic.SCHEDULE) == 36  # 18 levels x 2
    appended = laid_out.replace(message_delay_level=laid_out.message_delay_level + " 3h 4h")
    with pytest.raises(TopicProvisioningError, match="level"):
        TopicAdmin(appended).ensure_system_topics(appended.catalog())
    assert _partitions(laid_out, SystemTopic.SCHEDULE) == 36
