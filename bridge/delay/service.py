"""The coordinator's delay services: ``ScheduleDeliveryService`` (delay levels) and
``TimerService`` (timer messages), on one engine.

Each partition of the SCHEDULE and timer topics is a FIFO queue of fixed delay: its records are
due, in order, a fixed time after the broker stored them (LogAppendTime). The engine reads each
partition from its committed offset; when the head record is not due yet, it keeps what it
fetched and pauses the partition until the head is due. So memory holds at most a batch per
partition, whatever is waiting, and recovery after a crash is reading from the committed
offsets: nothing to rebuild.

Every batch is one Kafka transaction: the delivered (or re-routed) records and the offsets
that say they are done. A crash at any point delivers each message exactly once (G5). After a
failed transaction or a new assignment, a partition is read again from its committed offset,
and nothing of it is processed before that seek succeeded.

Isolation: a message that cannot be delivered for a reason that will not go away by itself
(internal, missing or deleted topic, partition out of range, record too large for the topic,
authorization) does not hold the others back. Cheap checks against topic metadata catch most
before the transaction; otherwise the failed transaction's delivery reports name the record.
It then goes to the timer topic to be tried again after a back-off (``DELIVERY_ATTEMPTS`` and
``DELIVERY_ERROR`` record why), and after ``delivery_attempts`` tries to QUARANTINE with the
reason. Transient failures (broker unreachable, timeouts) are retried as they are.

Guarantees kept here (see ``docs/guarantees.md``): G2, G3, G5, G9.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from bridge.codec import (
    PreparedRecord,
    decode_envelope,
    decode_headers,
    encode_envelope,
    real_record,
)
from bridge.delay.routing import SEND_ID_HEADER, TIMER_ROUTING_HEADER
from bridge.delay_policy import DelayPolicy
from bridge.errors import WireFormatError
from bridge.kafka.batch_writer import TransactionBatch
from bridge.kafka.clients import new_admin, new_consumer
from bridge.kafka.quarantine import QUARANTINE_OMITTED_BYTES, quarantine_copy, read_headers
from bridge.kafka.service import ServiceConfig, TransactionalService
from bridge.kafka.transactional import (
    DELIVERY_ATTEMPTS,
    DELIVERY_ERROR,
    MAX_DELIVERY_ERROR_CHARS,
    REMOVED_ON_DELIVERY,
    is_permanent_delivery_error,
)
from bridge.lifecycle import FatalServiceError
from bridge.message import DELAY_PROPERTIES, MessageConst, now_ms
from topics.catalog import SystemTopic
from topics.naming import is_kafka_internal

logger = logging.getLogger(__name__)

__all__ = ["REMOVED_ON_DELIVERY", "ScheduleDeliveryService", "TimerService"]

_BATCH = 2000
_MAX_POLL_WAIT_MS = 50
_METADATA_MAX_AGE_S = 1.0
"""How old the partition count of a target topic may be before it is asked again, s."""
_METADATA_RECHECK_S = 0.2
"""A target that looks missing or too small is asked again if its answer is older, s."""
_REPOSITION_RETRY_S = 0.2
"""Wait between tries to read committed offsets when the group coordinator does not answer."""
_SLOW_ACK_S = 0.4
"""A delivery still unacknowledged this long after the broker answered the rest of its Kafka
transaction is set aside for a back-off instead of holding the transaction (and every other
due message) for the whole ``message.timeout.ms``, s. Doubles from a message's fourth
unacknowledged try on, so that a target that is only slow is delivered in the end."""
_SLOW_ACK_MAX_SHARE = 0.1
_SMALL_TRANSACTION = 10
"""Early set-aside of fresh deliveries is for a few stragglers: in a transaction of more than
:data:`_SMALL_TRANSACTION` records, when more than :data:`_SLOW_ACK_MAX_SHARE` of them (and more
than one) are still unacknowledged, the broker is busy rather than one target stuck, and the
commit waits for them."""
_MAX_BACKOFF_MS = 60_000
"""The longest back-off between two deliveries of a message that keeps timing out, ms."""
_FAILURES: Final = (KafkaException, BufferError)
"""What a failed Kafka transaction of these services raises (see
:func:`~bridge.kafka.batch_writer.as_kafka_exception`)."""
RECORD_ERRORS: Final = (WireFormatError, ValueError, TypeError, SystemError, ArithmeticError)
"""What decoding one malformed record can raise (its own fault: it is quarantined)."""

Headers = list[tuple[str, bytes | None]]
Key = tuple[int, int]
"""(partition, offset) of a fetched record."""
_MISSING: Final = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
_NOT_RECORD_ERRORS: Final = frozenset(
    {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._FENCED}
)
"""Report errors that say what happened to the transaction, not to the record."""
_UNKNOWN_TARGET: Final = (1 << 31, None)
"""What :meth:`_FifoDelayService._target` says when it cannot tell: try to deliver."""


@dataclass(slots=True)
class Held:
    """A fetched record, its headers read once (see :func:`read_headers`)."""

    record: Any
    partition: int
    offset: int
    headers: Headers
    header_error: str | None
    """Why the headers could not be read (then ``headers`` is empty)."""
    due_ms: int = 0
    send_key: tuple[int, bytes] | None = None
    """Identifies its send (see :func:`_send_key`), once it is due."""


@dataclass(slots=True)
class _Unit:
    """A due record and what it becomes in the Kafka transaction."""

    held: Held
    record: PreparedRecord | None
    """What it is written as (None for a duplicate)."""
    real: bool = False
    """``record`` is the delivery to the message's real topic (which may refuse it)."""
    suspect: bool = False
    """Its delivery failed in a transaction with other failures: it goes alone next time."""
    aside: bool = False
    duplicate: bool = False
    """A second copy of a record delivered already: consumed, nothing written."""


def _attempts(raw: str | bytes | None) -> int:
    try:
        return max(int(raw), 0) if raw else 0
    except ValueError:
        return 0


DUPLICATE_WINDOW_MS: Final = 600_000
"""How long a delivered send is remembered to recognise a second copy of it, ms."""
_DUPLICATE_MEMORY: Final = 100_000
"""At most this many delivered sends are remembered per service."""


def _send_key(held: Held) -> tuple[int, bytes] | None:
    """(partition, send id) of a record a producer wrote (see
    :data:`bridge.delay.routing.SEND_ID_HEADER`); None for the coordinator's own copies,
    records of other clients and records whose headers could not be read."""
    for name, raw in held.headers:
        if name == SEND_ID_HEADER and raw:
            return (held.partition, raw)
    return None


class _FifoDelayService(TransactionalService):
    """Reads FIFO partitions of fixed delay; subclasses say what a due record becomes."""

    kind: str = ""
    system: SystemTopic = SystemTopic.SCHEDULE

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(self.kind, config)
        self.policy: DelayPolicy = config.client.delay_policy
        self.topic = config.catalog.topic(self.system)
        self.timer_topic = config.catalog.topic(SystemTopic.TIMER)
        self._held: dict[int, deque[Held]] = {}
        """Fetched records not due yet, per partition, in offset order (at most a batch)."""
        self._paused: set[int] = set()
        self._next_offset: dict[int, int | None] = {}
        """Assigned partitions -> the next offset to take; None until a seek to the committed
        offset succeeded (after an assignment or a failed transaction)."""
        self._reposition_after = 0.0
        self._culprits: dict[Key, str] = {}
        """(partition, offset) -> why its delivery failed: moved aside on the next pass."""
        self._suspects: set[Key] = set()
        self._slow: dict[Key, str] = {}
        """Records whose delivery timed out (a transient reason): sent back for a back-off
        on the next pass, without holding the others."""
        self._timeouts: dict[Key, int] = {}
        """Failed transactions in which a record timed out with nothing to compare it to."""
        self._shrink: dict[Key, tuple[int, str]] = {}
        """Records whose bridge-made copy (back-off or quarantine) the broker refused for good:
        (1: quarantine it; 2: quarantine it without its value and headers, why)."""
        self._topics: dict[str, tuple[int | None, str | None, float]] = {}
        """Target topic -> (partition count or None if missing, why it cannot be written,
        when asked in monotonic s)."""
        self._auto_create = True
        self.delivered = 0
        """Messages delivered to their real topics (for tests and metrics)."""
        self.moved_aside = 0
        """Messages sent back to wait after a failed delivery, or quarantined."""
        self.dropped = 0
        """Fetched records thrown away to be read again (stale after a rebalance or rewind)."""
        self.duplicates = 0
        """Second copies of one send, consumed without a delivery."""
        self._delivered_recently: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        """Sends delivered (or moved on) in the last :data:`DUPLICATE_WINDOW_MS`, with
        when, epoch ms."""

    def partition_delay_ms(self, partition: int) -> int:
        """How long records wait in ``partition``, ms."""
        raise NotImplementedError

    def process(self, held: Held, now: int) -> tuple[PreparedRecord, bool]:
        """What the due record becomes, and whether that is its delivery to its real topic.
        Raises one of :data:`RECORD_ERRORS` if malformed."""
        raise NotImplementedError

    # --- lifecycle ----------------------------------------------------------------------
    def on_start(self) -> None:
        client = self.config.client
        self.start_producer()
        self._consumer = new_consumer(
            client,
            self.group_id,
            client_id=self.name,
            fetch_wait_max_ms=_MAX_POLL_WAIT_MS,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(self.config.session_timeout_ms // 6, 500),
            # Bounded prefetch: what waits stays in Kafka, not here.
            queued_max_messages_kbytes=8192,
            # Static membership: a coordinator restarted with the same id takes its
            # partitions back at once instead of after the session timeout.
            group_instance_id=self.group_instance_id,
        )
        self._auto_create = self._topics_created_on_demand()
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _topics_created_on_demand(self) -> bool:
        """Whether producing to a missing topic creates it (the broker's
        ``auto.create.topics.enable`` and the client's ``allow.auto.create.topics``)."""
        if str(self.client.kafka.get("allow.auto.create.topics", "true")).lower() == "false":
            return False
        try:
            admin = new_admin(self.client, f"{self.name}-config")
            brokers = admin.list_topics(timeout=self.timeout_s).brokers
            resource = ConfigResource(ResourceType.BROKER, str(next(iter(brokers))))
            entries = admin.describe_configs([resource], request_timeout=self.timeout_s)
            config = entries[resource].result(timeout=self.timeout_s)
            entry = config.get("auto.create.topics.enable")
            return entry is None or str(entry.value).lower() == "true"
        except Exception as exc:  # unknown: let the producer find out
            logger.info("%s: broker's auto.create.topics.enable unknown: %s", self.name, exc)
            return True

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            # Records fetched before this assignment may already sit in the batch being
            # read: nothing of the partition is taken before a seek to its committed offset.
            self._next_offset[tp.partition] = None
            self._held.pop(tp.partition, None)
            self._paused.discard(tp.partition)
        self._reposition_after = 0.0
        started = time.monotonic()
        pending = 0
        try:
            for tp in consumer.committed(partitions, self.timeout_s):
                low, high = consumer.get_watermark_offsets(tp, cached=False, timeout=5)
                pending += max(high - max(tp.offset, low), 0)
        except KafkaException as exc:  # only for the log line: never fail an assignment
            logger.info("%s: could not count waiting messages: %s", self.name, exc)
            pending = -1
        logger.info(
            "%s: assigned %s partitions %s, about %d messages waiting (%.2f s)",
            self.name, self.topic, [tp.partition for tp in partitions], pending,
            time.monotonic() - started,
        )  # fmt: skip

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        for partition in revoked:
            self._next_offset.pop(partition, None)
            self._held.pop(partition, None)
            self._paused.discard(partition)
        self._culprits = {k: v for k, v in self._culprits.items() if k[0] not in revoked}
        self._suspects = {k for k in self._suspects if k[0] not in revoked}
        self._slow = {k: v for k, v in self._slow.items() if k[0] not in revoked}
        self._timeouts = {k: v for k, v in self._timeouts.items() if k[0] not in revoked}
        self._shrink = {k: v for k, v in self._shrink.items() if k[0] not in revoked}

    # --- main loop ------------------------------------------------------------------------
    def run_once(self) -> None:
        consumer = self._consumer
        if consumer is None or not self.producer_ready():
            return
        self._reposition(consumer)
        now = now_ms()
        next_due = min((held[0].due_ms for held in self._held.values() if held), default=None)
        wait_ms = _MAX_POLL_WAIT_MS if next_due is None else min(_MAX_POLL_WAIT_MS, next_due - now)
        fetched: list[Any] = []
        first = consumer.poll(max(wait_ms, 0) / 1000)
        if first is not None:
            fetched = [first, *consumer.consume(_BATCH, 0)]
        try:
            resume = self._take(fetched)
        except FatalServiceError:
            raise
        except BaseException:
            # Records were taken from Kafka and maybe from memory without being committed:
            # read them again rather than let a later batch commit past them.
            self._rewind_all()
            raise
        if resume is None:
            return  # rewound: every partition is read again from its committed offset
        for partition in resume:
            expected = self._next_offset.get(partition)
            if expected is not None:
                self._resume(consumer, TopicPartition(self.topic, partition, expected))

    def _take(self, fetched: list[Any]) -> list[int] | None:
        """Keep the fetched records, deliver those due; return the partitions to fetch again
        (their held records are all gone), or None if a failed transaction rewound them."""
        for record in fetched:
            self._accept(record)
        now = now_ms()
        due: list[Held] = []
        resume = []
        for partition, held in list(self._held.items()):
            while held and held[0].due_ms <= now:
                due.append(held.popleft())
            if held and partition not in self._paused:
                # The head is not due: stop fetching this partition until it is (it is FIFO,
                # so nothing behind it is due either); what was fetched waits here.
                self._pause([TopicPartition(self.topic, partition)])
            elif not held:
                del self._held[partition]
                if partition in self._paused:
                    resume.append(partition)
        if due and not self._deliver(due, now):
            return None
        return resume

    def _accept(self, record: Any) -> None:
        """Keep a fetched record, unless it is stale: of a partition no longer (or newly)
        assigned and not repositioned yet, or from before the last seek."""
        error = record.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return
            self.check_fencing(error)
            if error.fatal():  # the consumer cannot go on: stop rather than idle unseen
                raise FatalServiceError(f"{self.name}: Kafka consumer failed: {error.str()}")
            logger.warning("%s: consumer error %s", self.name, error.str())
            return
        partition = record.partition()
        offset = record.offset()
        expected = self._next_offset.get(partition)
        if expected is None or offset < expected:
            self.dropped += 1
            return
        self._next_offset[partition] = offset + 1
        headers, header_error = read_headers(record)
        held = Held(record, partition, offset, headers, header_error)
        held.due_ms = self.due_at(held)
        self._held.setdefault(partition, deque()).append(held)

    def due_at(self, held: Held) -> int:
        """When ``held`` is due, epoch ms: a fixed time after it was stored."""
        return int(held.record.timestamp()[1]) + self.partition_delay_ms(held.partition)

    # --- rewind ---------------------------------------------------------------------------
    def _rewind_all(self) -> None:
        """After a failed transaction: forget what was fetched and read every owned partition
        again from its committed offset."""
        self._held.clear()
        for partition in self._next_offset:
            self._next_offset[partition] = None
        self._reposition_after = 0.0
        if self._consumer is not None:
            self._reposition(self._consumer)

    def _reposition(self, consumer: Consumer) -> None:
        """Seek the partitions waiting for it to their committed offsets. A partition whose
        committed offset cannot be read now is paused and waits (nothing of it is taken), so
        no later batch can commit past what a failed one left undone."""
        pending = [p for p, expected in self._next_offset.items() if expected is None]
        if not pending or time.monotonic() < self._reposition_after:
            return
        tps = [TopicPartition(self.topic, p) for p in pending]
        try:
            committed = consumer.committed(tps, self.timeout_s)
        except KafkaException as exc:
            logger.warning(
                "%s: cannot read committed offsets of partitions %s (%s); they wait",
                self.name, pending, exc,
            )  # fmt: skip
            self._reposition_after = time.monotonic() + _REPOSITION_RETRY_S
            self._pause([tp for tp in tps if tp.partition not in self._paused])
            return
        for tp in committed:
            if tp.error is not None or tp.partition not in self._next_offset:
                continue
            self._held.pop(tp.partition, None)
            start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            if self._resume(consumer, TopicPartition(self.topic, tp.partition, start)):
                self._next_offset[tp.partition] = max(tp.offset, 0)
        if any(expected is None for expected in self._next_offset.values()):
            self._reposition_after = time.monotonic() + _REPOSITION_RETRY_S

    def _pause(self, tps: list[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None or not tps:
            return
        try:
            consumer.pause(tps)
            self._paused.update(tp.partition for tp in tps)
        except KafkaException as exc:  # revoked meanwhile
            logger.info("%s: pause failed: %s", self.name, exc)

    def _resume(self, consumer: Consumer, at: TopicPartition) -> bool:
        """Fetch ``at.partition`` from ``at.offset`` on. The seek also wakes the fetcher at
        once: after a plain resume of the only fetchable partition librdkafka's broker
        thread fetches again only when its idle wait ends (0.25 to 1 s later)."""
        try:
            consumer.resume([TopicPartition(self.topic, at.partition)])
            self._paused.discard(at.partition)
            consumer.seek(at)
        except KafkaException as exc:
            logger.info("%s: seek of partition %d failed: %s", self.name, at.partition, exc)
            return False
        return True

    # --- delivery -------------------------------------------------------------------------
    def _deliver(self, due: list[Held], now: int) -> bool:
        """Commit what the due records become; False if a transaction failed (then every
        partition was rewound). A suspect goes in a transaction of its own, so a record that
        fails alone is known to be the culprit; partitions of a failed transaction are not
        committed further in this pass (FIFO), the others are."""
        segments: list[list[_Unit]] = [[]]
        in_this_pass: set[tuple[int, bytes]] = set()
        for held in due:
            held.send_key = key = _send_key(held)
            if key is not None and (key in in_this_pass or self._seen_since(key, now)):
                # librdkafka's idempotent producer can store one send twice when a send times
                # out during a leader change (its epoch bump; confluentinc/librdkafka#4953):
                # the second copy is consumed and not delivered again.
                logger.warning(
                    "%s: %s[%d]@%d is a second copy of a message delivered already; skipped",
                    self.name, self.topic, held.partition, held.offset,
                )  # fmt: skip
                segments[-1].append(_Unit(held, None, duplicate=True))
                continue
            if key is not None:
                in_this_pass.add(key)
            unit = self._unit(held, now)
            if unit.suspect:
                segments += [[unit], []]
            else:
                segments[-1].append(unit)
        failed: set[int] = set()
        for segment in segments:
            units = [u for u in segment if u.held.partition not in failed]
            if units and not self._commit(units, now):
                failed.update(u.held.partition for u in units)
        if failed:
            self._rewind_all()
        return not failed

    def _unit(self, held: Held, now: int) -> _Unit:
        key = (held.partition, held.offset)
        shrink = self._shrink.get(key)
        if shrink is not None:
            stage, why = shrink
            return _Unit(held, self._quarantined(held, why, keep_value=stage < 2), aside=True)
        problem = self._culprits.get(key)
        if problem is not None:
            return _Unit(held, self._aside(held, problem, now), aside=True)
        problem = self._slow.get(key)
        if problem is not None:
            return _Unit(held, self._aside(held, problem, now, transient=True), aside=True)
        try:
            record, real = self.process(held, now)
        except RECORD_ERRORS as exc:
            return _Unit(held, self._quarantined(held, str(exc) or type(exc).__name__))
        problem = self._target_problem(record) if real else None
        if problem is not None:
            return _Unit(held, self._aside(held, problem, now), aside=True)
        return _Unit(held, record, real, suspect=key in self._suspects)

    def _quarantined(self, held: Held, reason: str, *, keep_value: bool = True) -> PreparedRecord:
        if held.header_error is not None:
            reason += f"; copied without its headers, which could not be read ({held.header_error})"
        return quarantine_copy(
            self.config.catalog,
            held.record,
            reason,
            self.name,
            headers=held.headers,
            keep_value=keep_value,
        )

    def _aside(
        self, held: Held, problem: str, now: int, *, transient: bool = False
    ) -> PreparedRecord:
        """Where a message whose delivery failed for ``problem`` goes: back to wait in the
        timer topic for a back-off, or QUARANTINE once it failed ``delivery_attempts`` times
        for a permanent reason. A ``transient`` failure (a timeout) counts in
        ``DELIVERY_ATTEMPTS`` (its back-off doubles, up to :data:`_MAX_BACKOFF_MS`) but never
        quarantines the message by itself."""
        try:
            msg = decode_envelope(held.record.value())
            attempts = _attempts(msg.get_property(DELIVERY_ATTEMPTS)) + 1
            if not transient and attempts >= self.config.delivery_attempts:
                logger.warning("%s: delivery failed %d times: %s", self.name, attempts, problem)
                return self._quarantined(held, f"delivery failed {attempts} times: {problem}")
            backoff_ms = min(
                self.config.delivery_backoff_ms * 2 ** min(attempts - 1, 30), _MAX_BACKOFF_MS
            )
            deliver_ms = now + backoff_ms
            props = {k: v for k, v in msg.properties.items() if k not in DELAY_PROPERTIES}
            props[DELIVERY_ATTEMPTS] = str(attempts)
            props[DELIVERY_ERROR] = problem[:MAX_DELIVERY_ERROR_CHARS]
            props[MessageConst.TIMER_DELIVER_MS] = str(deliver_ms)
            value = encode_envelope(
                msg.msg_id, msg.body, props, msg.born_timestamp_ms, msg.born_host
            )
        except RECORD_ERRORS as exc:
            return self._quarantined(held, f"{problem}; then {exc}")
        logger.warning(
            "%s: delivery of %s failed (%s); attempt %d%s in %d ms",
            self.name, msg.msg_id, problem, attempts + 1,
            "" if transient else f" of {self.config.delivery_attempts}", backoff_ms,
        )  # fmt: skip
        tier = self.policy.route(deliver_ms, now, self.policy.tier_count) or 0
        headers: Headers = [(TIMER_ROUTING_HEADER, str(deliver_ms).encode())]
        return PreparedRecord(
            self.timer_topic, held.record.key(), value, headers, msg.msg_id, 0, tier
        )

    def _target_problem(self, out: PreparedRecord) -> str | None:
        """Why ``out`` cannot be delivered, from (cached) metadata, or None if it may be."""
        topic, partition = out.kafka_topic, out.partition
        if is_kafka_internal(topic):
            return f"{topic} is an internal topic of Kafka"
        count, problem = self._target(topic, partition)
        if problem is not None:
            return problem
        if count is None:
            return None if self._auto_create else f"topic {topic} does not exist"
        if partition >= count:
            return f"partition {partition} of {topic} is out of range: it has {count}"
        return None

    def _target(
        self, topic: str, partition: int, *, fresh: bool = False
    ) -> tuple[int | None, str | None]:
        """(partitions of ``topic`` or None if it does not exist, why it cannot be written
        or None), asked at most every :data:`_METADATA_MAX_AGE_S` and again sooner when it
        looks missing or too small. When metadata cannot be had, the producer finds out."""
        count, problem, asked = self._topics.get(topic, (None, None, -1e9))
        age = time.monotonic() - asked
        looks_wrong = count is None or partition >= count or problem is not None
        if fresh or age > _METADATA_MAX_AGE_S or (looks_wrong and age > _METADATA_RECHECK_S):
            try:
                meta = self._producer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            except KafkaException as exc:
                logger.info("%s: no metadata for %s: %s", self.name, topic, exc)
                return _UNKNOWN_TARGET
            error = None if meta is None else meta.error
            if meta is None or (error is not None and error.code() in _MISSING):
                count, problem = None, None
            elif error is None:
                count, problem = len(meta.partitions), None
            elif error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                count, problem = None, f"topic {topic}: {error.str()}"
            else:  # e.g. a leader being elected: not this message's fault
                return _UNKNOWN_TARGET
            self._topics[topic] = (count, problem, time.monotonic())
        return count, problem

    def _commit(self, units: list[_Unit], now: int) -> bool:
        """One Kafka transaction: the records ``units`` become and their offsets."""
        producer = self._producer
        if self._consumer is None:
            return False
        batch = TransactionBatch()
        owners: list[int] = []
        """Record index -> index in ``units`` of the unit it belongs to."""
        for index, unit in enumerate(units):
            if unit.record is not None:
                batch.add(unit.record)
                owners.append(index)

        def refused(at: int, record: PreparedRecord, exc: KafkaException) -> PreparedRecord | None:
            return self._replace_refused(units[owners[at]], record, exc, now)

        def positions() -> list[TopicPartition]:
            offsets = {unit.held.partition: unit.held.offset + 1 for unit in units}
            return [TopicPartition(self.topic, p, o) for p, o in offsets.items()]

        def patience(_: TransactionBatch) -> None:
            slow = self._unacknowledged(units, batch, owners)
            if slow:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"set aside: {'; '.join(slow.values())}")
                )

        def failed(failure: KafkaException) -> None:
            self.transaction_failed(failure)
            producer.poll(0)  # the reports of what the abort purged

        if not self.write(
            batch,
            on_failure=failed,
            offsets=positions,
            before_commit=patience,
            on_refused=refused,
            failures=_FAILURES,
        ):
            assert batch.failure is not None
            self._blame(units, batch, owners, batch.failure)
            return False
        for unit in units:
            key = (unit.held.partition, unit.held.offset)
            for pending in (self._culprits, self._slow, self._shrink, self._timeouts):
                pending.pop(key, None)
            self._suspects.discard(key)
            self.delivered += unit.real
            self.moved_aside += unit.aside
            if unit.duplicate:
                self.duplicates += 1
            else:
                self._remember(unit.held, now)
        return True

    def _seen_since(self, key: tuple[int, bytes], now: int) -> bool:
        """True if the send ``key`` was delivered within :data:`DUPLICATE_WINDOW_MS`."""
        seen = self._delivered_recently.get(key)
        return seen is not None and seen >= now - DUPLICATE_WINDOW_MS

    def _remember(self, held: Held, now: int) -> None:
        """Remember a committed producer record's send for :data:`DUPLICATE_WINDOW_MS`."""
        key = held.send_key
        if key is None:
            return
        recent = self._delivered_recently
        recent[key] = now
        recent.move_to_end(key)
        while recent and (
            len(recent) > _DUPLICATE_MEMORY
            or next(iter(recent.values())) < now - DUPLICATE_WINDOW_MS
        ):
            recent.popitem(last=False)

    def _unacknowledged(
        self, units: list[_Unit], batch: TransactionBatch, owners: list[int]
    ) -> dict[Key, str]:
        """Wait (serving delivery reports) until every record of ``batch`` is acknowledged or
        failed, and return the records whose real delivery the broker has not acknowledged
        within their patience (:data:`_SLOW_ACK_S`) of answering the transaction's offset
        commit: they are marked to be set aside, and the transaction is to be aborted. Empty
        when all were acknowledged or failed (the commit says which), or when all are slow
        alike (a slow broker: the commit waits for them). ``owners`` maps a record's index to
        its unit's."""
        answered = time.monotonic()
        limit_s = self.client.send_msg_timeout_ms / 1000
        tries: dict[int, int] = {}
        expected = set(range(len(batch)))
        reports = batch.reports
        units_sent = set(owners)
        while True:
            pending = expected - reports.keys()
            if not pending:
                return {}
            waited = time.monotonic() - answered
            if waited >= limit_s:
                return {}
            if waited >= _SLOW_ACK_S:
                slow: dict[Key, str] = {}
                for at in sorted(pending):
                    index = owners[at]
                    unit = units[index]
                    if not unit.real:
                        continue
                    out = batch.records[at]
                    if index not in tries:
                        tries[index] = self._tries(unit.held)
                    if waited >= min(
                        _SLOW_ACK_S * float(1 << min(max(tries[index] - 3, 0), 10)), limit_s
                    ):
                        held = unit.held
                        slow[(held.partition, held.offset)] = (
                            f"{_where(out.kafka_topic, out.partition)}: not acknowledged within "
                            f"{waited * 1000:.0f} ms while the broker answered the rest of its "
                            "Kafka transaction (timed out)"
                        )
                # The offset commit answered, so the broker lives: a record alone in its
                # transaction or one that timed out before is set aside; several fresh ones
                # all slow look like a slow broker: the commit waits for them. So does a large
                # transaction (a burst, a backlog) with more than a few stragglers: its
                # deliveries are acknowledged in waves, and setting the later waves aside would
                # make them late by a back-off.
                fresh = [
                    i
                    for i in tries
                    if tries[i] == 0 and (units[i].held.partition, units[i].held.offset) in slow
                ]
                few = len(units_sent) <= _SMALL_TRANSACTION or len(slow) <= max(
                    1, int(len(units_sent) * _SLOW_ACK_MAX_SHARE)
                )
                if slow and (
                    not fresh or (few and (len(slow) < len(units_sent) or len(units_sent) == 1))
                ):
                    for key, why in slow.items():
                        self._slow[key] = why
                    logger.warning("%s: deliveries set aside: %s", self.name, sorted(slow.values()))
                    return slow
            self._producer.poll(0.01)

    @staticmethod
    def _tries(held: Held) -> int:
        """How many deliveries of ``held`` failed before (its ``DELIVERY_ATTEMPTS``)."""
        try:
            return _attempts(decode_envelope(held.record.value()).get_property(DELIVERY_ATTEMPTS))
        except RECORD_ERRORS:
            return 0

    def _replace_refused(
        self, unit: _Unit, failed: PreparedRecord, exc: KafkaException, now: int
    ) -> PreparedRecord | None:
        """Another form of ``unit``'s record, which the producer refused for good before
        sending it (e.g. a partition the client knows is out of range, or a record above the
        producer's ``message.max.bytes``), so that the transaction stays intact: a real
        delivery becomes its back-off copy, a bridge-made copy a smaller form. None when
        there is none (the transaction then fails)."""
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or not is_permanent_delivery_error(err):
            return None
        problem = f"{_where(failed.kafka_topic, failed.partition)}: {err.str()} ({err.name()})"
        if unit.real:
            unit.record = self._aside(unit.held, problem, now)
            unit.real = False
        else:
            stage, why = self._escalate(unit, failed, problem)
            if stage > 2:
                return None
            unit.record = self._quarantined(unit.held, why, keep_value=stage < 2)
        unit.aside = True
        return unit.record

    def _escalate(self, unit: _Unit, failed: PreparedRecord, problem: str) -> tuple[int, str]:
        """Record that ``unit``'s bridge-made output ``failed`` for good (``problem``) and
        return what replaces it: (1: quarantine, 2: quarantine without value and headers,
        3: nothing smaller exists; why)."""
        key = (unit.held.partition, unit.held.offset)
        quarantine_topic = self.config.catalog.topic(SystemTopic.QUARANTINE)
        if failed.kafka_topic != quarantine_topic:
            stage = 1
        else:
            smallest = any(k == QUARANTINE_OMITTED_BYTES for k, _ in failed.headers)
            stage = 3 if smallest else 2
        before = self._shrink.get(key, (0, ""))[1] or self._culprits.get(key) or self._slow.get(key)
        why = f"{before}; then " if before else ""
        why += f"its copy to {failed.kafka_topic} failed: {problem}"
        if stage > 2:
            logger.error(
                "%s: even the smallest quarantine copy of %s[%d]@%d is refused (%s): "
                "fix the %s topic", self.name, self.topic, key[0], key[1], problem,
                quarantine_topic,
            )  # fmt: skip
            return stage, why
        self._shrink[key] = (stage, why)
        logger.warning("%s: %s[%d]@%d: %s", self.name, self.topic, key[0], key[1], why)
        return stage, why

    def _blame(
        self, units: list[_Unit], batch: TransactionBatch, owners: list[int], exc: KafkaException
    ) -> None:
        """Find the deliveries that failed a transaction for a permanent reason. Alone on
        its target in the transaction, a record is the culprit; several on one target (a
        batch the broker refused as a whole) are suspects, each tried alone next time.

        A bridge-made output (back-off or quarantine copy) refused for good is replaced by a
        smaller form next time. A real delivery that timed out while other outputs of the
        transaction were acknowledged, or alone, goes back for a back-off (transient); one
        that timed out with all the others twice in a row is tried alone."""
        blamed: dict[int, str] = {}
        reports = batch.reports
        acknowledged = any(err is None for err, _ in reports.values())
        timed_out: set[int] = set()
        for at, (err, partition) in reports.items():
            index = owners[at]
            out = batch.records[at]
            if err is None:
                continue
            where = _where(out.kafka_topic, partition if partition >= 0 else out.partition)
            problem = f"{where}: {err.str()} ({err.name()})"
            if not units[index].real:
                if is_permanent_delivery_error(err):
                    self._escalate(units[index], out, problem)
                continue
            if is_permanent_delivery_error(err):
                blamed[index] = problem
            elif (
                err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._UNKNOWN_TOPIC)
                and not self._auto_create
                and self._target(out.kafka_topic, out.partition, fresh=True) == (None, None)
            ):
                blamed[index] = f"topic {out.kafka_topic} does not exist"
            elif err.code() not in _NOT_RECORD_ERRORS:
                timed_out.add(index)
                key = (units[index].held.partition, units[index].held.offset)
                if acknowledged or len(units) == 1:
                    self._slow[key] = problem
                else:
                    self._timeouts[key] = self._timeouts.get(key, 0) + 1
                    if self._timeouts[key] >= 2:
                        self._suspects.add(key)
        if timed_out:
            logger.warning(
                "%s: deliveries timed out: %s", self.name,
                sorted(f"{self.topic}[{units[i].held.partition}]@{units[i].held.offset}"
                       for i in timed_out),
            )  # fmt: skip
        error = exc.args[0] if exc.args else None
        if not blamed and isinstance(error, KafkaError) and is_permanent_delivery_error(error):
            # The transaction failed for a record's reason (a partition it could not add,
            # e.g. not authorized) but the reports only say "purged", for the innocent
            # records added in the same request too: each unacknowledged one is a suspect.
            unacknowledged = {owners[at] for at in batch.unacknowledged()}
            for index, unit in enumerate(units):
                real = unit.record if unit.real else None
                if real is not None and index in unacknowledged:
                    key = (unit.held.partition, unit.held.offset)
                    where = _where(real.kafka_topic, real.partition)
                    if len(units) == 1:
                        self._culprits[key] = f"{where}: {error.str()} ({error.name()})"
                    else:
                        self._suspects.add(key)
        targets: dict[str, list[int]] = {}
        for index in blamed:
            targets.setdefault(blamed[index].split(":", 1)[0], []).append(index)
        for indexes in targets.values():
            for index in indexes:
                key = (units[index].held.partition, units[index].held.offset)
                if len(indexes) == 1 or len(units) == 1:
                    self._culprits[key] = blamed[index]
                else:
                    self._suspects.add(key)
        if blamed:
            logger.warning("%s: failed deliveries: %s", self.name, sorted(set(blamed.values())))

    def deliver(self, held: Held) -> tuple[PreparedRecord, bool]:
        """The real-topic record of a delayed message that is due."""
        msg = decode_envelope(held.record.value())
        return real_record(msg, self.config.catalog.namespace, REMOVED_ON_DELIVERY), True


def _where(topic: str, partition: int) -> str:
    return f"{topic}[{partition}]" if partition >= 0 else topic


class ScheduleDeliveryService(_FifoDelayService):
    """RocketMQ's ``ScheduleMessageService``: partition ``L - 1`` of SCHEDULE holds delay
    level ``L``; each record is delivered the level's delay after it was stored."""

    kind = "schedule"
    system = SystemTopic.SCHEDULE

    def partition_delay_ms(self, partition: int) -> int:
        delays = self.policy.level_delays_ms
        return delays[min(partition, len(delays) - 1)]

    def process(self, held: Held, now: int) -> tuple[PreparedRecord, bool]:
        return self.deliver(held)


class TimerService(_FifoDelayService):
    """RocketMQ 5's timer: a record in tier ``k`` waits ``precision * 2**k``, then goes to the
    largest tier that does not pass its delivery time, or to its real topic when due."""

    kind = "timer"
    system = SystemTopic.TIMER

    def partition_delay_ms(self, partition: int) -> int:
        return self.policy.tier_delay_ms(partition)

    def due_at(self, held: Held) -> int:
        """Out of its tier, a record close to its time waits here for the exact time rather
        than another hop (records behind it, FIFO, wait at most the hold window more)."""
        tier_due = super().due_at(held)
        try:
            deliver_ms = self._deliver_ms(held)
        except RECORD_ERRORS:
            return tier_due  # process() quarantines it
        return self.policy.exit_time_ms(tier_due, deliver_ms)

    @staticmethod
    def _deliver_ms(held: Held) -> int:
        raw = decode_headers(held.headers).get(TIMER_ROUTING_HEADER)
        if raw is None:  # written by another client, or headers unreadable: the envelope has it
            raw = decode_envelope(held.record.value()).get_property(TIMER_ROUTING_HEADER) or "0"
        return int(raw)

    def process(self, held: Held, now: int) -> tuple[PreparedRecord, bool]:
        deliver_ms = self._deliver_ms(held)
        tier = self.policy.route(deliver_ms, now, self.policy.tier_count)
        if tier is None:
            return self.deliver(held)
        # A hop is the coordinator's own copy, written once in a Kafka transaction: without
        # the producer's send id, it can never pass for a second copy of that send.
        headers: Headers = [
            (k, v) for k, v in held.headers if k not in (TIMER_ROUTING_HEADER, SEND_ID_HEADER)
        ]
        headers.append((TIMER_ROUTING_HEADER, str(deliver_ms).encode()))
        hop = PreparedRecord(
            self.topic,
            held.record.key(),
            held.record.value(),
            headers,
            f"{self.topic}-{held.partition}-{held.offset}",
            0,
            tier,
        )
        return hop, False
