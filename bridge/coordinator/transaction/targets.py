"""What the transaction service knows about the real topics it writes to: from the cluster's
metadata, which commits cannot be written (a missing or internal topic, a partition it does not
have, no authorization), so they are set aside before they fail a Kafka transaction.

The same checks tell an operator's replay why a parked message cannot be delivered
(:mod:`bridge.cli.admin.transactions`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from bridge.config import ClientConfig
from bridge.kafka.clients import new_producer
from bridge.message import now_ms
from topics.naming import is_kafka_internal

logger = logging.getLogger(__name__)

_TARGET_CACHE_MS = 30_000
"""How long a real topic's partition count is trusted before it is asked again, ms."""
MISSING_CACHE_MS = 5_000
"""How long a real topic found missing stays missing before it is asked again, ms."""
_FRESH_MS = 1_000
"""A fresh answer about a real topic (after a failure, before a retry) is at most this old."""
_CONFIRM_MISSING_S = 0.75
"""How long an unknown topic is asked about again before it counts as missing, s."""
_TARGET_CACHE_SIZE = 10_000
"""At most this many real topics are remembered (then the answers are asked again)."""


def auto_create_allowed(config: ClientConfig) -> bool:
    """False when the client never creates a topic by writing to it
    (``allow.auto.create.topics=false``); the broker may still refuse when True."""
    return config.kafka.get("allow.auto.create.topics", "true").strip().lower() not in (
        "false",
        "0",
    )


def topic_problem(
    producer: Any, topic: str, timeout_s: float, *, confirm_s: float = 0.0
) -> tuple[str | None, int]:
    """Why records cannot be written to ``topic``, as the cluster's metadata tells (None when
    nothing is known to be wrong), and its partition count (0 when unknown). Raises
    ``KafkaException`` when the broker does not answer within ``timeout_s`` seconds.

    ``producer`` is a confluent-kafka producer *without* a transactional id: its metadata
    request creates a missing topic exactly where writing to it would (broker and client
    allow auto-creation), which a transactional producer's does not. A broker that creates
    it answers "unknown" first and knows it some 50 ms later: an unknown topic is asked
    about again for ``confirm_s`` seconds before it counts as missing (0 when the client
    does not auto-create).
    """
    if is_kafka_internal(topic):
        return f"{topic} is a Kafka internal topic (only the broker writes to it)", 0
    deadline = time.monotonic() + confirm_s
    wait_s = 0.05
    while True:
        info = producer.list_topics(topic, timeout_s).topics.get(topic)
        error = None if info is None else info.error
        unknown = info is None or (
            error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        if not unknown or time.monotonic() + wait_s > deadline:
            break
        time.sleep(wait_s)  # a topic being created: nothing to wait on but time
        wait_s *= 2
    if unknown:
        return f"topic {topic} does not exist (and writing to it does not create it)", 0
    assert info is not None
    if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return f"not authorized to write to topic {topic}", 0
    if error is not None and error.code() == KafkaError.TOPIC_EXCEPTION:
        return f"{topic} is not a valid topic name", 0
    if error is not None:
        return None, 0  # e.g. a leader being elected: let the write find out
    return None, len(info.partitions)


def partition_problem(topic: str, partition: int, partition_count: int) -> str | None:
    """Why ``partition`` (-1: any) of ``topic`` cannot be written, or None."""
    if partition_count > 0 and partition >= partition_count:
        return f"partition {partition} of topic {topic} does not exist (it has {partition_count})"
    return None


def delivery_problem(topic: str, err: KafkaError) -> str:
    """The text of a failed delivery to ``topic``."""
    return f"writing to {topic} failed: {err.str()} ({err.name()})"


class Targets:
    """Answers about real topics, kept for a while (:data:`_TARGET_CACHE_MS`, a missing topic
    :data:`MISSING_CACHE_MS`), so that many records for one missing topic cost one question.
    Asks with a plain producer of its own (see :func:`topic_problem`), made by :meth:`start`."""

    def __init__(self, client: ClientConfig, name: str, timeout_s: Callable[[], float]) -> None:
        self._client = client
        self._name = name
        self._timeout_s = timeout_s
        self._targets: dict[str, tuple[str | None, int, int]] = {}
        """Real topic -> (what is wrong with it or None, partition count, when asked, ms)."""
        self._metadata: Any = None
        """A plain producer that only asks for metadata (see :func:`topic_problem`)."""
        self._metadata_silent_until = 0
        """Until when (epoch ms) the broker is not asked again after it did not answer."""

    def start(self) -> None:
        """Create the producer that asks for metadata."""
        self._metadata = new_producer(self._client, f"{self._name}-metadata")

    def stop(self) -> None:
        """Drop the metadata producer."""
        self._metadata = None

    def problem(self, topic: str, partition: int, *, fresh: bool) -> str | None:
        """Why a record for ``topic`` / ``partition`` cannot be written, from metadata; None
        when nothing is known wrong or the broker does not answer (the write then decides).
        Answers are kept (a topic's partitions :data:`_TARGET_CACHE_MS`, a missing topic
        :data:`MISSING_CACHE_MS`, :data:`_FRESH_MS` when ``fresh``), so many records for
        one missing topic cost one question."""
        now = now_ms()
        known = self._targets.get(topic)
        if known is not None:
            max_age = _TARGET_CACHE_MS if known[0] is None else MISSING_CACHE_MS
            if now - known[2] > (_FRESH_MS if fresh else max_age):
                known = None
        if known is None and now < self._metadata_silent_until:
            return None  # the broker did not answer a moment ago: do not wait on it again
        if known is None:
            confirm_s = _CONFIRM_MISSING_S if auto_create_allowed(self._client) else 0.0
            try:
                problem, count = topic_problem(
                    self._metadata, topic, self._timeout_s(), confirm_s=confirm_s
                )
            except KafkaException as exc:
                logger.info("%s: no metadata for %s (%s)", self._name, topic, exc)
                self._metadata_silent_until = now_ms() + _FRESH_MS
                return None
            if problem is None and count == 0:
                return None  # e.g. being created: the write decides
            if len(self._targets) >= _TARGET_CACHE_SIZE:
                self._targets.clear()
            known = self._targets[topic] = (problem, count, now_ms())
        return known[0] or partition_problem(topic, partition, known[1])

    def remember_refusal(self, topic: str, err: KafkaError, problem: str) -> None:
        """A topic that refuses every write (not authorized) while its metadata looks fine
        (Describe allowed) is remembered as refusing for :data:`MISSING_CACHE_MS`: the commits
        for it meanwhile are set aside before the batch instead of failing it, one at a
        time, for the others."""
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            if len(self._targets) >= _TARGET_CACHE_SIZE:
                self._targets.clear()
            self._targets[topic] = (problem, 0, now_ms())
