"""A small reader of real, retry and DLQ topics, for manual checks and the self-check."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import message_from_record
from bridge.config import ClientConfig
from bridge.errors import BrokerUnreachableError, KafkaClientError
from bridge.kafka.clients import new_consumer, new_reader, read_record_at, translate_error
from bridge.message import MessageExt
from topics.catalog import TopicCatalog
from topics.naming import reader_group, to_kafka_topic, validate_user_group


def read_messages(
    config: ClientConfig,
    topics: Sequence[str],
    *,
    group: str | None = None,
    max_messages: int | None = None,
    timeout_ms: int = 10_000,
    from_beginning: bool = True,
    commit: bool = False,
) -> Iterator[MessageExt]:
    """Yield committed messages of ``topics`` (RocketMQ names) until ``max_messages`` were
    read or ``timeout_ms`` passed without a new one.

    The ``timeout_ms`` idle clock starts once the reader has its partitions and has read each
    to the end it had then, so what a topic already holds is read in full however slowly the
    group forms on a busy machine; until then each wait is bounded by ``request_timeout_ms``.

    Without ``group`` a throw-away group reads from the beginning and commits nothing; a
    ``group`` that is one of the bridge's own raises :class:`InvalidTopicNameError`. Raises
    :class:`BrokerUnreachableError` if no broker answers within ``request_timeout_ms``
    (otherwise an unreachable broker would look like an empty topic).
    """
    catalog = TopicCatalog(namespace=config.namespace)
    kafka_topics = [to_kafka_topic(t, config.namespace) for t in topics]
    if group is not None:
        validate_user_group(group, config.namespace)
    consumer = new_consumer(
        config,
        group or reader_group("reader", uuid.uuid4().hex[:12]),
        client_id="bridge-reader",
        auto_offset_reset="earliest" if from_beginning else "latest",
        enable_partition_eof=True,
    )
    count = 0
    try:
        try:
            existing = [
                t
                for t in kafka_topics
                if _partitions(consumer, t, config.request_timeout_ms / 1000)
            ]
        except KafkaException as exc:
            raise translate_error(
                exc,
                f"reading {kafka_topics} from {config.bootstrap_servers}",
                default=BrokerUnreachableError,
            ) from exc
        # No topic to read yet: no group to join, so nothing to catch up with (the topics
        # are read as they are created, within the idle timeout).
        catch_up = _CatchUp(expect_partitions=bool(existing))
        consumer.subscribe(kafka_topics, on_assign=catch_up.assigned, on_revoke=catch_up.revoked)
        idle_s = timeout_ms / 1000
        catch_up_s = max(idle_s, config.request_timeout_ms / 1000)

        def next_deadline() -> float:
            return time.monotonic() + (idle_s if catch_up.done else catch_up_s)

        idle_deadline = next_deadline()
        while max_messages is None or count < max_messages:
            remaining = idle_deadline - time.monotonic()
            if remaining <= 0:
                return
            was_done = catch_up.done
            record = consumer.poll(min(remaining, 0.5))
            if catch_up.done and not was_done:
                idle_deadline = next_deadline()
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    catch_up.reached_end(record.topic() or "", record.partition() or 0)
                    idle_deadline = next_deadline()
                    continue
                if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue  # not created yet: wait for it, as Kafka consumers do
                raise KafkaClientError(f"reading {kafka_topics}: {error.str()}", error)
            count += 1
            idle_deadline = next_deadline()
            if commit:
                consumer.commit(message=record, asynchronous=False)
            yield message_from_record(record, catalog)
    finally:
        consumer.close()


def _partitions(consumer: Consumer, kafka_topic: str, timeout_s: float) -> set[int]:
    """The partitions of ``kafka_topic``, none if it does not exist (a metadata request;
    raises ``KafkaException`` when no broker answers within ``timeout_s``)."""
    info = consumer.list_topics(kafka_topic, timeout=timeout_s).topics.get(kafka_topic)
    return set() if info is None or info.error is not None else set(info.partitions)


class _CatchUp:
    """Which assigned partitions a reader has not yet read to their end; ``done`` once it
    has partitions (or an empty assignment, or expects none: its topics do not exist yet)
    and each reported its end."""

    def __init__(self, *, expect_partitions: bool) -> None:
        self._assigned = not expect_partitions
        self._behind: set[tuple[str, int]] = set()

    @property
    def done(self) -> bool:
        return self._assigned and not self._behind

    def assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = True
        self._behind |= {(tp.topic, tp.partition) for tp in partitions}

    def revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = False  # until the group hands out partitions again
        self._behind -= {(tp.topic, tp.partition) for tp in partitions}

    def reached_end(self, topic: str, partition: int) -> None:
        self._behind.discard((topic, partition))


def _scanner(config: ClientConfig) -> Consumer:
    """A consumer of a throw-away group that commits nothing and reports partition ends."""
    group = reader_group("reader", uuid.uuid4().hex[:12])
    return new_reader(config, group, "bridge-reader")


def read_to_end(config: ClientConfig, kafka_topic: str, timeout_ms: int = 10_000) -> Iterator[Any]:
    """Every committed record of ``kafka_topic`` (a Kafka name), partition by partition, up to
    the end each partition has now; nothing if the topic does not exist. Raises
    :class:`KafkaClientError` if the end is not reached within ``timeout_ms`` of the last
    record."""
    consumer = _scanner(config)
    try:
        open_partitions = _partitions(consumer, kafka_topic, config.request_timeout_ms / 1000)
        if not open_partitions:
            return
        consumer.assign([TopicPartition(kafka_topic, p, OFFSET_BEGINNING) for p in open_partitions])
        deadline = time.monotonic() + timeout_ms / 1000
        while open_partitions:
            if time.monotonic() > deadline:
                raise KafkaClientError(
                    f"reading {kafka_topic}: partitions {sorted(open_partitions)} did not reach "
                    f"their end within {timeout_ms} ms"
                )
            record = consumer.poll(0.2)
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(record.partition())
                    continue
                raise KafkaClientError(f"reading {kafka_topic}: {error.str()}", error)
            deadline = time.monotonic() + timeout_ms / 1000
            yield record
    finally:
        consumer.close()


def read_message_at(
    config: ClientConfig, topic: str, partition: int, offset: int, timeout_ms: int = 10_000
) -> MessageExt:
    """The committed message at ``offset`` of ``partition`` of ``topic`` (a RocketMQ name).

    Raises :class:`KafkaClientError` if it cannot be read within ``timeout_ms``.
    """
    kafka_topic = to_kafka_topic(topic, config.namespace)
    consumer = _scanner(config)
    try:
        tp = TopicPartition(kafka_topic, partition, offset)
        record = read_record_at(consumer, tp, timeout_ms / 1000)
    finally:
        consumer.close()
    if record is None or record.offset() != offset:
        raise KafkaClientError(
            f"no message at {kafka_topic}[{partition}]@{offset} within {timeout_ms} ms"
        )
    return message_from_record(record, TopicCatalog(namespace=config.namespace))
