"""Whether a producer group has a live producer, as the coordinator's check-back needs to know.

A producer of a group is *live* while its check consumer is a member of the group's check
consumer group (``<namespace>.transaction-check.<group>``): from its ``start()`` until its
``shutdown()``, or until Kafka's group coordinator ends its session (``session_timeout_ms``
without a heartbeat). That is what the coordinator can know: a check written to the group's
check topic is read by one such member.

Asked of Kafka (``ListGroups``, then ``DescribeGroups`` of the group's coordinator) on a thread
of its own, at most once per :data:`LIVENESS_FRESH_MS` a group, so that no check waits on the
answer.

Not with the admin client's ``describe_consumer_groups``: librdkafka's group-coordinator admin
requests abort the process (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt >
0' failed``, librdkafka issue 4605, open in 2.16) when a coordinator lookup is still in flight
as the coordinator comes back, which a broker restart makes likely for a question asked every
second. ``list_groups`` sends its requests to every broker directly and has no such lookup.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Final

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
        self._asking: dict[str, Future[int]] = {}

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
        except Exception as exc:  # an admin client refused, a group name not allowed
            logger.warning("producer group %s: its live producers cannot be asked: %s", group, exc)
            return
        answer: Future[int] = Future()
        admin, timeout_s = self._admin, self._client.request_timeout_ms / 1000

        def ask() -> None:
            try:
                answer.set_result(members(admin, check_group, timeout_s))
            except BaseException as exc:  # handed to _answer, which logs it
                answer.set_exception(exc)

        # A daemon thread: a question still waiting on a broker never holds up an exit.
        threading.Thread(target=ask, name=f"bridge-liveness-{group}", daemon=True).start()
        self._asking[group] = answer

    @staticmethod
    def _answer(group: str, future: Future[int]) -> bool | None:
        try:
            count = future.result()
        except Exception as exc:  # a timeout, a broker that did not answer
            logger.info("producer group %s: live producers not known: %s", group, exc)
            return None
        return count > 0


def members(admin: AdminClient, group: str, timeout_s: float) -> int:
    """The number of members of consumer group ``group`` (0 when Kafka knows no such group).
    Waits at most ``timeout_s`` seconds; raises :class:`KafkaException` when a broker did not
    answer in that time (the answer would be partial)."""
    found = admin.list_groups(group, timeout=timeout_s)  # see the module's docstring
    for described in found:
        if described.id == group:
            error = described.error
            if error is not None and error.code() not in (
                KafkaError.NO_ERROR,
                KafkaError.GROUP_ID_NOT_FOUND,
            ):
                raise KafkaException(error)
            return len(described.members)
    return 0
