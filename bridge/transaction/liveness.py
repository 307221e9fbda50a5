"""Whether a producer group has a live producer, as the coordinator's check-back needs to know.

A producer of a group is *live* while its check consumer is a member of the group's check
consumer group (``<namespace>.transaction-check.<group>``): from its ``start()`` until its
``shutdown()``, or until Kafka's group coordinator ends its session (``session_timeout_ms``
without a heartbeat). That is what the coordinator can know: a check written to the group's
check topic is read by one such member.

Asked of Kafka (``DescribeGroups``) in the background, at most once per
:data:`LIVENESS_FRESH_MS` a group, so that no check waits on the answer.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from bridge.config import ClientConfig
from bridge.kafka.clients import new_admin
from topics.naming import transaction_check_group

logger = logging.getLogger(__name__)

LIVENESS_FRESH_MS: Final = 1000
"""How long an answer about a group is used before Kafka is asked again, ms."""


class ProducerLiveness:
    """Live producers per producer group, from the members of each group's check consumers."""

    def __init__(self, client: ClientConfig, fresh_ms: int = LIVENESS_FRESH_MS) -> None:
        self._client = client
        self._fresh_ms = fresh_ms
        self._admin: AdminClient | None = None
        self._known: dict[str, tuple[bool | None, int]] = {}
        """Producer group -> (live; None: not known), when that was learnt (epoch ms)."""
        self._asking: dict[str, Future[Any]] = {}

    def live(self, group: str, now_ms: int) -> bool | None:
        """True when ``group`` has a live producer, False when it has none, None when that is
        not known (not asked yet, or Kafka did not say). Never waits: an answer older than
        ``fresh_ms`` is used while a fresh one is asked for."""
        asking = self._asking.get(group)
        if asking is not None and asking.done():
            del self._asking[group]
            self._known[group] = (self._answer(group, asking), now_ms)
        known = self._known.get(group)
        if (known is None or now_ms - known[1] >= self._fresh_ms) and group not in self._asking:
            self._ask(group)
        return None if known is None else known[0]

    def _ask(self, group: str) -> None:
        try:
            if self._admin is None:
                self._admin = new_admin(self._client, "bridge-transaction-liveness")
            check_group = transaction_check_group(self._client.namespace, group)
            futures = self._admin.describe_consumer_groups(
                [check_group], request_timeout=self._client.request_timeout_ms / 1000
            )
        except Exception as exc:  # an admin client refused, a group name not allowed
            logger.warning("producer group %s: its live producers cannot be asked: %s", group, exc)
            return
        self._asking[group] = futures[check_group]

    @staticmethod
    def _answer(group: str, future: Future[Any]) -> bool | None:
        try:
            described = future.result()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return False
            logger.info("producer group %s: live producers not known: %s", group, exc)
            return None
        except Exception as exc:
            logger.info("producer group %s: live producers not known: %s", group, exc)
            return None
        return len(described.members) > 0
