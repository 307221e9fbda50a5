"""The Kafka consumer settings a push consumer chooses for itself, unless the user set them."""

from __future__ import annotations

import logging
import math
from typing import Any, Final, NamedTuple

from bridge.config import ClientConfig
from bridge.consumer.config import PushConsumerConfig

logger = logging.getLogger(__name__)

_FETCH_WAIT_MAX_MS: Final = 100
"""librdkafka's ``fetch.wait.max.ms`` for push consumers (its default: 500 ms)."""
_DEFAULT_MAX_POLL_INTERVAL_MS: Final = 300_000
"""librdkafka's ``max.poll.interval.ms`` default."""
_MAX_POLL_INTERVAL_LIMIT_MS: Final = 86_400_000
"""The largest ``max.poll.interval.ms`` librdkafka takes."""
_POLL_INTERVAL_MARGIN_S: Final = 30.0
"""An orderly consumer's wait in the revoke callback ends this long before
``max.poll.interval.ms``, so the group does not expel it meanwhile, seconds."""


def fetch_tuning(config: ClientConfig) -> dict[str, Any]:
    """Kafka's fetch wait, shortened unless the user set it: a fetch request spans every
    assigned partition, so a partition resumed after flow control (pause at
    ``pull_threshold_for_queue``) gets records only once the fetch in flight for the
    others (an idle retry topic, say) returns, up to ``fetch.wait.max.ms`` later."""
    if "fetch.wait.max.ms" in config.kafka:
        return {}
    return {"fetch_wait_max_ms": _FETCH_WAIT_MAX_MS}


class GroupTuning(NamedTuple):
    """A CLUSTERING consumer's group settings: Kafka consumer options, and how long the revoke
    callback waits for running listeners (seconds)."""

    options: dict[str, Any]
    revoke_wait_s: float


def group_tuning(
    group: str, config: ClientConfig, settings: PushConsumerConfig, *, orderly: bool
) -> GroupTuning:
    """Concurrent: a revoke waits ``drain_timeout_ms``. Orderly: it waits ``consume_timeout``
    (never let the next owner run a partition while its listener runs here), and
    ``max.poll.interval.ms`` is raised above that, unless the user set it, so the member is
    not expelled meanwhile; the wait itself stays below that interval."""
    if not orderly:
        return GroupTuning({}, settings.drain_timeout_ms / 1000)
    wait_s = settings.consume_timeout * 60
    given = config.kafka.get("max.poll.interval.ms")
    if given is not None:
        try:
            given_s = int(given) / 1000
        except ValueError:  # librdkafka refuses it when the consumer is created
            given_s = math.inf
        orderly_wait_s = max(0.0, min(wait_s, given_s - _POLL_INTERVAL_MARGIN_S))
        if orderly_wait_s < wait_s:
            logger.warning(
                "push consumer %s: max.poll.interval.ms=%s allows an orderly rebalance to "
                "wait only %.0f s for a running listener (consume_timeout: %.0f s)",
                group,
                given,
                orderly_wait_s,
                wait_s,
            )
        return GroupTuning({}, orderly_wait_s)
    session = str(config.kafka.get("session.timeout.ms", "0"))
    session_ms = int(session) if session.isascii() and session.isdigit() else 0
    interval_ms = min(
        _MAX_POLL_INTERVAL_LIMIT_MS,
        max(
            _DEFAULT_MAX_POLL_INTERVAL_MS,
            session_ms,
            math.ceil((wait_s + _POLL_INTERVAL_MARGIN_S) * 1000),
        ),
    )
    orderly_wait_s = min(wait_s, interval_ms / 1000 - _POLL_INTERVAL_MARGIN_S)
    return GroupTuning({"max_poll_interval_ms": interval_ms}, orderly_wait_s)
