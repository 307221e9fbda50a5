"""Whether a producer group has a live producer, as the coordinator's check-back needs to know.

A producer of a group is *live* while its check consumer is a member of the group's check
consumer group (``<namespace>.transaction-check.<group>``): from its ``start()`` until its
``shutdown()``, or until Kafka's group coordinator ends its session (``session_timeout_ms``
without a heartbeat). That is what the coordinator can know: a check written to the group's
check topic is read by one such member.

Asked of Kafka (``ListGroups``, then ``DescribeGroups`` of the group's coordinator) on a thread
of its own, at most once per :data:`LIVENESS_FRESH_MS` a group, so that no check waits on the
answer.

A group its coordinator describes with no member (Empty, Dead) has no live producer. A group no
broker lists is not yet known to have none: while its group coordinator moves (a broker
stopped, the coordinator partition loading on its new leader) every broker that answers leaves
the group out, and librdkafka reports no error when the last broker to answer did not fail
(each broker's answer overwrites the error of the one before). A group that no longer exists
(its last producer left before it committed anything) is left out the same way. So a group
left out has no live producer only once it was left out of consecutive answers (each asked
within ``fresh_ms`` + ``request_timeout_ms`` of the one before, none failing in between)
asked over ``absent_ms`` (the check interval: a producer can answer no check in less); until
then it is not known, and a check is sent as for any group whose producers are not known.

Not with the admin client's ``describe_consumer_groups``: librdkafka's group-coordinator admin
requests abort the process (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt >
0' failed``, librdkafka issue 4605, open in 2.16) when a coordinator lookup is still in flight
as the coordinator comes back, which a broker restart makes likely for a question asked every
second. ``list_groups`` sends its requests to every broker directly and has no such lookup.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
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

    def __init__(
        self,
        client: ClientConfig,
        absent_ms: int,
        fresh_ms: int = LIVENESS_FRESH_MS,
        count_members: Callable[[str], int | None] | None = None,
    ) -> None:
        """``absent_ms``: how long a group must be left out of every answer before it is
        known to have no live producer, ms. ``fresh_ms``: how long an answer is used, ms.
        ``count_members``: asks Kafka how many members a check consumer group has (None: no
        broker lists the group); by default :func:`members` through an admin client of
        ``client``."""
        self._client = client
        self._absent_ms = absent_ms
        self._fresh_ms = fresh_ms
        self._gap_ms = fresh_ms + client.request_timeout_ms
        """The longest time between two questions whose answers left a group out for them
        to count as one absence, ms."""
        self._count_members = count_members or self._members
        self._admin: AdminClient | None = None
        self._admin_lock = threading.Lock()
        self._known: dict[str, tuple[bool | None, int]] = {}
        """Producer group -> (live; None: not known), when the answer was asked (epoch ms)."""
        self._asking: dict[str, tuple[Future[int | None], int]] = {}
        """Producer group -> its question in flight, when it was asked (epoch ms)."""
        self._absent: dict[str, tuple[int, int]] = {}
        """Producer group -> when the first and the last of the consecutive questions whose
        answers all left it out were asked (epoch ms)."""
        self._looked: dict[str, int] = {}
        """Producer group -> when :meth:`live` was last asked about it (epoch ms)."""

    def live(self, group: str, now_ms: int) -> bool | None:
        """True when ``group`` has a live producer, False when it has none, None when that is
        not known (not asked yet, or Kafka did not say). Never waits: an answer older than
        ``fresh_ms`` is used while a fresh one is asked for."""
        self._looked[group] = now_ms
        asking = self._asking.get(group)
        if asking is not None and asking[0].done():
            del self._asking[group]
            future, asked_ms = asking
            self._known[group] = (self._answer(group, future, asked_ms), asked_ms)
        known = self._known.get(group)
        if (known is None or now_ms - known[1] >= self._fresh_ms) and group not in self._asking:
            self._ask(group, now_ms)
        return None if known is None else known[0]

    def forget_older(self, before_ms: int) -> None:
        """Drop what is known of groups not looked at since ``before_ms`` (epoch ms): a group
        whose transactions are all decided is not asked about again."""
        for group in [g for g, t in self._looked.items() if t < before_ms]:
            del self._looked[group]
            self._known.pop(group, None)
            self._absent.pop(group, None)
            if group in self._asking and self._asking[group][0].done():
                del self._asking[group]

    def _members(self, check_group: str) -> int | None:
        with self._admin_lock:  # questions of several groups run at once, on their threads
            if self._admin is None:
                self._admin = new_admin(self._client, "bridge-transaction-liveness")
            admin = self._admin
        return members(admin, check_group, self._client.request_timeout_ms / 1000)

    def _ask(self, group: str, now_ms: int) -> None:
        try:
            check_group = transaction_check_group(self._client.namespace, group)
        except Exception as exc:  # a group name not allowed
            logger.warning("producer group %s: its live producers cannot be asked: %s", group, exc)
            return
        answer: Future[int | None] = Future()

        def ask() -> None:
            try:
                answer.set_result(self._count_members(check_group))
            except BaseException as exc:  # an admin client refused, a broker not answering:
                answer.set_exception(exc)  # handed to _answer, which logs it

        # A daemon thread: a question still waiting on a broker never holds up an exit.
        threading.Thread(target=ask, name=f"bridge-liveness-{group}", daemon=True).start()
        self._asking[group] = (answer, now_ms)

    def _answer(self, group: str, future: Future[int | None], asked_ms: int) -> bool | None:
        try:
            count = future.result()
        except Exception as exc:  # a timeout, a broker that did not answer
            logger.info("producer group %s: live producers not known: %s", group, exc)
            self._absent.pop(group, None)  # Kafka did not answer: the absence starts over
            return None
        if count is not None:  # its coordinator described it
            self._absent.pop(group, None)
            return count > 0
        run = self._absent.get(group)
        since = run[0] if run is not None and asked_ms - run[1] <= self._gap_ms else asked_ms
        self._absent[group] = (since, asked_ms)
        return False if asked_ms - since >= self._absent_ms else None


def members(admin: AdminClient, group: str, timeout_s: float) -> int | None:
    """The number of members of consumer group ``group`` as its coordinator describes it (0:
    Empty, Dead or not found there); None when no broker lists the group. Waits at most
    ``timeout_s`` seconds; raises :class:`KafkaException` when a broker did not answer in that
    time (the answer would be partial)."""
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
    return None
