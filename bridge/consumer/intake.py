"""What a push consumer makes of the records one poll brings: messages to hold, by partition.

Each record is handled on its own: a record Kafka reports an error for is logged, one that
cannot be decoded (a header name that is not UTF-8, a malformed retry record: a
:class:`~bridge.errors.WireFormatError` or an :class:`~bridge.errors.InvalidArgumentError`) is
held under a placeholder to be quarantined, one the subscription's filter does not take (its
tag, or its SQL92 expression on the properties) is skipped, and a partition that holds all it
may (``pull_threshold_for_queue``, ``pull_threshold_size_for_queue``) takes no more of the
poll: it is sought back, and Kafka brings the rest again once it resumes. Any other exception
is a fault of the code, not of a record: the poll's partitions are sought back (nothing of it
is lost or quarantined) and it is raised, for the poll loop to log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError, TopicPartition

from bridge.codec import read_headers, undecoded_message
from bridge.consumer.context import ConsumerContext
from bridge.consumer.counters import Count
from bridge.consumer.model import TagFilter
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Headerless
from bridge.consumer.send_back import RETRY_PROPERTIES
from bridge.consumer.sql92 import PropertyLookup, SqlFilter
from bridge.message import DEAD_LETTER_PROPERTIES, MessageConst, MessageExt, parse_count
from topics.errors import InvalidArgumentError, MalformedRecordError, WireFormatError
from topics.naming import DLQ_GROUP_TOPIC_PREFIX

logger = logging.getLogger(__name__)

Key = tuple[str, int]
"""A partition: (Kafka topic, partition)."""

_RECORD_ERRORS_IGNORED: Final = frozenset({KafkaError._PARTITION_EOF})
_RETRY_PATH_ONLY: Final = RETRY_PROPERTIES | frozenset(DEAD_LETTER_PROPERTIES)
"""Headers only the retry path writes (what a replay to the origin topic drops). On a real
topic (not a retry topic or a DLQ) they come from another Kafka client (a record copied out
of a retry topic or DLQ by a Kafka tool, a header of its own under one of these names): a
record there is a first delivery, and trusting them would count failures it never had
(straight to the DLQ at ``RECONSUME_TIME`` 16), send its retries to a topic it was never read
from (``RETRY_TOPIC``), or name another origin in its dead-letter metadata."""


class Incoming:
    """One partition's share of a poll, in offset order: messages to hold (with their sizes in
    bytes and records), those of them to consume, and records to quarantine (held under a
    placeholder until Kafka acknowledges their copy). ``room_count`` and ``room_bytes``: what
    the partition may still hold; once that is taken, the rest of the poll is left to Kafka
    (``cut``: the partition was sought back to the first record not taken)."""

    __slots__ = (
        "bytes",
        "can_cut",
        "cut",
        "msgs",
        "poison",
        "records",
        "room_bytes",
        "room_count",
        "sizes",
        "work",
    )

    def __init__(self, room_count: int, room_bytes: int) -> None:
        self.msgs: list[MessageExt] = []
        self.sizes: list[int] = []
        self.records: list[Any] = []
        self.work: list[MessageExt] = []
        self.poison: list[tuple[Any, Exception]] = []
        self.room_count = room_count
        self.room_bytes = room_bytes
        self.bytes = 0
        self.cut = False
        self.can_cut = True

    def hold_poison(self, record: Any, reason: Exception) -> None:
        offset = record.offset()
        self.msgs.append(
            MessageExt(
                "", msg_id=f"{record.topic()}-{record.partition()}-{offset}", queue_offset=offset
            )
        )
        self.sizes.append(0)
        self.records.append(record)
        self.poison.append((record, reason))


class Intake:
    """Sorts polled records into :class:`Incoming` shares of the partitions in ``queues``.

    ``kafka``: the consumer, to seek a full partition back; ``topic_names``: the RocketMQ name
    of each Kafka topic consumed; ``retry_kafka_topic``: the group's retry topic, if read."""

    def __init__(
        self,
        context: ConsumerContext,
        queues: dict[Key, ProcessQueue],
        kafka: Any,
        topic_names: dict[str, str],
        retry_kafka_topic: str,
    ) -> None:
        self._context = context
        self._queues = queues
        self._kafka = kafka
        self._topic_names = topic_names
        self._retry_kafka_topic = retry_kafka_topic
        self._missing_topics: set[str] = set()
        self._foreign_retry_topics: set[str] = set()

    def sort(self, records: list[Any]) -> dict[Key, Incoming]:
        """Each partition's share of ``records``, each record handled on its own: one that
        cannot be handled is to be quarantined with the reason, and the rest proceed.

        What is the same for a partition (its queue and share, its topic's RocketMQ name,
        filter and whether it is the retry topic) is looked up when the partition changes from
        one record to the next, not per record: a poll brings runs of one partition. Copies read
        from the retry topic are not filtered again (they passed the filter once, and RocketMQ's
        broker does not filter them by default either)."""
        batches: dict[Key, Incoming] = {}
        queues = self._queues
        last_topic: str | None = None
        last_partition = -1
        key: Key = ("", -1)
        pq: ProcessQueue | None = None
        incoming: Incoming | None = None
        name = ""
        tags: frozenset[str] | None = None
        sql: Callable[[PropertyLookup], bool] | None = None
        retry = False
        first_delivery = False
        deserializers = self._context.deserializers
        for record in records:
            try:
                error = record.error()
                if error is not None:
                    self._record_error(record, error)
                    continue
                kafka_topic: str = record.topic()
                partition: int = record.partition()
                if partition != last_partition or kafka_topic != last_topic:
                    last_topic, last_partition = kafka_topic, partition
                    key = (kafka_topic, partition)
                    pq = queues.get(key)
                    incoming = batches.get(key)
                    name = self._topic_names.get(kafka_topic, kafka_topic)
                    retry = kafka_topic == self._retry_kafka_topic
                    # A DLQ subscribed to (%DLQ%<group>, RocketMQ's way of handling dead
                    # letters) holds letters whose retry-path headers the project wrote.
                    first_delivery = not retry and not name.startswith(DLQ_GROUP_TOPIC_PREFIX)
                    sub = self._context.subscriptions.get(name)
                    chosen = (
                        sub.filter
                        if sub is not None and not retry and sub.kafka_topic == kafka_topic
                        else None
                    )
                    tags = chosen.tags if isinstance(chosen, TagFilter) else None
                    sql = chosen.matches if isinstance(chosen, SqlFilter) else None
                if pq is None or pq.dropped:
                    continue  # revoked meanwhile: the next owner reads it
                if incoming is None:
                    incoming = self._incoming(key, batches)
                if incoming.cut or (
                    (
                        len(incoming.msgs) >= incoming.room_count
                        or incoming.bytes >= incoming.room_bytes
                    )
                    and self._cut(record, incoming)
                ):
                    continue  # fetched again once the partition resumes
                try:
                    headers = read_headers(record)
                except MalformedRecordError as exc:
                    # A header name that is not UTF-8. The list confluent-kafka keeps
                    # afterwards holds a NULL that crashes the process when read: never read
                    # them again.
                    reason = MalformedRecordError(f"{exc}; quarantined without them")
                    incoming.hold_poison(Headerless(record), reason)
                    continue
                if first_delivery and headers:
                    for header, _ in headers:
                        if header in _RETRY_PATH_ONLY:
                            headers = self._first_delivery(record, headers)
                            break
                msg = undecoded_message(
                    record, name, kafka_topic, partition, headers, first_delivery=first_delivery
                )
                if retry:
                    malformed = _retry_origin(msg)
                    if malformed is not None:
                        incoming.hold_poison(record, malformed)
                        continue
                elif (tags is not None and msg.tags not in tags) or (
                    sql is not None and not sql(msg.get_property)
                ):
                    pq.skip(msg.queue_offset)
                    self._context.counters.add(Count.FILTERED)
                    continue
                if deserializers:  # run where the listener reads msg.value, not here
                    deserializers.defer(msg, record.key(), headers)
                size = len(msg.body)
                if headers:
                    for header, value in headers:
                        size += len(header) + (len(value) if value is not None else 0)
                incoming.msgs.append(msg)
                incoming.sizes.append(size)
                incoming.records.append(record)
                incoming.work.append(msg)
                incoming.bytes += size
            except (WireFormatError, InvalidArgumentError) as exc:
                self._isolate(record, exc, batches)
            except Exception:
                # A fault of the code, not of the record: quarantining would blame every
                # record it meets. Nothing of this poll is held; it is fetched again.
                self._read_again(records)
                raise
        return batches

    def _read_again(self, records: list[Any]) -> None:
        """Seek each partition of ``records`` (one poll) back to its first record of them, so
        that none of them is skipped: Kafka brings them again on a later poll."""
        first: dict[Key, int] = {}
        for record in records:
            if record.error() is None:
                key = (record.topic(), record.partition())
                first[key] = min(first.get(key, record.offset()), record.offset())
        for (topic, partition), offset in first.items():
            try:
                self._kafka.seek(TopicPartition(topic, partition, offset))
            except Exception as exc:  # revoked meanwhile: its next owner reads it
                logger.warning(
                    "push consumer %s: cannot seek %s[%d] back to %d: %s",
                    self._context.group,
                    topic,
                    partition,
                    offset,
                    exc,
                )

    def _incoming(self, key: Key, batches: dict[Key, Incoming]) -> Incoming:
        """``key``'s share of the poll being received."""
        incoming = batches.get(key)
        if incoming is None:
            pq = self._queues[key]
            settings = self._context.settings
            incoming = batches[key] = Incoming(
                settings.pull_threshold_for_queue - pq.held,
                (settings.pull_threshold_size_for_queue << 20) - pq.held_bytes,
            )
        return incoming

    def _cut(self, record: Any, incoming: Incoming) -> bool:
        """The partition of ``record`` holds all it may: leave ``record`` and the rest of the
        poll to Kafka (seek back to it; it is fetched again once the partition resumes), so
        a partition goes over its thresholds by one record at most. False (the record is
        held after all) if the seek fails."""
        if not incoming.can_cut:
            return False
        try:
            self._kafka.seek(TopicPartition(record.topic(), record.partition(), record.offset()))
        except Exception as exc:
            logger.warning(
                "push consumer %s: cannot seek %s[%d] back to %d, holding beyond its "
                "thresholds: %s",
                self._context.group,
                record.topic(),
                record.partition(),
                record.offset(),
                exc,
            )
            incoming.can_cut = False
            return False
        incoming.cut = True
        return True

    def _isolate(self, record: Any, exc: Exception, batches: dict[Key, Incoming]) -> None:
        """``record`` raised while being received: quarantine it with the reason."""
        logger.warning(
            "push consumer %s: cannot handle %s[%s]@%s, quarantining it",
            self._context.group,
            record.topic(),
            record.partition(),
            record.offset(),
            exc_info=True,
        )
        key = (record.topic(), record.partition())
        pq = self._queues.get(key)
        if pq is None or pq.dropped:
            return
        # Its headers were read (a record whose headers raise is handled before): reading
        # them again for the copy is safe.
        self._incoming(key, batches).hold_poison(record, exc)

    def _first_delivery(
        self, record: Any, headers: list[tuple[str, bytes | None]]
    ) -> list[tuple[str, bytes | None]]:
        """``headers`` of a record of a real topic without those only the retry path writes
        (see :data:`_RETRY_PATH_ONLY`): it is consumed, retried and dead-lettered as the first
        delivery it is. Logged as a warning once per topic, then at debug level."""
        kept = [(name, value) for name, value in headers if name not in _RETRY_PATH_ONLY]
        ignored = sorted({name for name, _ in headers if name in _RETRY_PATH_ONLY})
        topic: str = record.topic()
        level = logging.DEBUG if topic in self._foreign_retry_topics else logging.WARNING
        self._foreign_retry_topics.add(topic)
        logger.log(
            level,
            "push consumer %s: %s[%s]@%s is a first delivery: ignoring its headers %s, which "
            "only retry and dead-letter copies carry (further ones of this topic are logged at "
            "debug level)",
            self._context.group,
            topic,
            record.partition(),
            record.offset(),
            ", ".join(ignored),
        )
        return kept

    def _record_error(self, record: Any, error: KafkaError) -> None:
        if error.code() in _RECORD_ERRORS_IGNORED:
            return
        group = self._context.group
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            topic = record.topic() or error.str()
            if topic not in self._missing_topics:
                self._missing_topics.add(topic)
                logger.warning("push consumer %s: topic %s does not exist (yet)", group, topic)
            return
        logger.warning("push consumer %s: %s", group, error.str())


def _retry_origin(msg: MessageExt) -> MalformedRecordError | None:
    """Give a message read from the group's retry topic the topic it was first sent to
    (``RETRY_TOPIC``); or why it must be quarantined instead (a malformed retry record)."""
    origin = msg.get_property(MessageConst.RETRY_TOPIC)
    times = msg.get_property(MessageConst.RECONSUME_TIME)
    if not origin:
        return MalformedRecordError("a retry record without RETRY_TOPIC")
    if not isinstance(origin, str):
        return MalformedRecordError(f"a retry record with RETRY_TOPIC={origin!r}, not text")
    if parse_count(times) is None:
        return MalformedRecordError(f"a retry record with RECONSUME_TIME={times!r}, not a count")
    msg.topic = origin
    return None
