"""Delivery in the delay services: what the due records become, written with their offsets
in Kafka transactions (a crash at any point delivers each message exactly once, G5), and the
second copies of one send recognised and consumed without a delivery.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import PreparedRecord
from bridge.coordinator.delay.fetch import Fetcher
from bridge.coordinator.delay.held import RECORD_ERRORS, DelayCounts, DelaySettings, Held, Key
from bridge.coordinator.delay.isolation import Isolation, Unit, located
from bridge.coordinator.delay.recall_watch import TimerRecalls
from bridge.coordinator.delay.records import failed_deliveries, send_key
from bridge.kafka.batch_writer import Check, Refused, TransactionBatch
from bridge.message import now_ms
from bridge.observability.metrics import active_metrics
from topics.catalog import SystemTopic

__all__ = ["DUPLICATE_WINDOW_MS", "Delivery", "Write", "send_key"]

logger = logging.getLogger(__name__)

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
_FAILURES: Final = (KafkaException, BufferError)
"""What a failed Kafka transaction of these services raises (see
:func:`~bridge.kafka.batch_writer.as_kafka_exception`)."""
DUPLICATE_WINDOW_MS: Final = 600_000
"""How long a delivered send is remembered to recognise a second copy of it, ms."""
_DUPLICATE_MEMORY: Final = 100_000
"""At most this many delivered sends are remembered per service."""


class Write(Protocol):
    """Write a batch in one Kafka transaction of the service's producer (see
    :meth:`~bridge.kafka.service.TransactionalService.write`); True once committed."""

    def __call__(
        self,
        batch: TransactionBatch,
        *,
        on_failure: Callable[[KafkaException], None] | None = None,
        offsets: Callable[[], list[TopicPartition]] | None = None,
        before_commit: Check | None = None,
        on_refused: Refused | None = None,
        failures: tuple[type[BaseException], ...] = ...,
    ) -> bool: ...


class Delivery:
    """Writes what the due records of a delay service become, and remembers the sends it
    delivered for :data:`DUPLICATE_WINDOW_MS`. The records come from ``fetcher``, what each
    becomes from ``isolation``; they are written with ``write`` (``transaction_failed``
    aborts a failed transaction or replaces the producer) through the producer and consumer
    the two callables give. ``due_at`` says when a record was due (its lateness is
    measured); what was written is counted in ``counts``. ``recalls`` (the timer service's)
    says which final deliveries were recalled in time: those are committed without a
    record."""

    def __init__(
        self,
        settings: DelaySettings,
        *,
        fetcher: Fetcher,
        isolation: Isolation,
        counts: DelayCounts,
        due_at: Callable[[Held], int],
        write: Write,
        transaction_failed: Callable[[KafkaException], None],
        producer: Callable[[], Any],
        consumer: Callable[[], Consumer | None],
        recalls: TimerRecalls | None = None,
    ) -> None:
        self._name = settings.name
        self._kind = settings.kind
        self._topic = settings.topic
        self._config = settings.config
        self._client = settings.config.client
        self._fetcher = fetcher
        self._isolation = isolation
        self._counts = counts
        self._due_at = due_at
        self._write = write
        self._transaction_failed = transaction_failed
        self._producer = producer
        self._consumer = consumer
        self._recalls = recalls
        self._delivered_recently: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        """Sends delivered (or moved on) in the last :data:`DUPLICATE_WINDOW_MS`, with
        when, epoch ms."""

    def deliver(self, due: list[Held], now: int) -> bool:
        """Commit what the due records become; False if a transaction failed (then every
        partition was rewound). A suspect goes in a transaction of its own, so a record that
        fails alone is known to be the culprit; partitions of a failed transaction are not
        committed further in this pass (FIFO), the others are."""
        segments: list[list[Unit]] = [[]]
        in_this_pass: set[tuple[int, bytes]] = set()
        recalls = self._recalls
        if recalls is not None:
            # Every marker stored before these are due is read before any is written.
            recalls.prepare(due, now)
        for held in due:
            held.send_key = key = send_key(held)
            if key is not None and (key in in_this_pass or self._seen_since(key, now)):
                # librdkafka's idempotent producer can store one send twice when a send times
                # out during a leader change (its epoch bump; confluentinc/librdkafka#4953):
                # the second copy is consumed and not delivered again.
                logger.warning(
                    "%s: %s[%d]@%d is a second copy of a message delivered already; skipped",
                    self._name,
                    self._topic,
                    held.partition,
                    held.offset,
                )
                segments[-1].append(Unit(held, None, duplicate=True))
                continue
            if key is not None:
                in_this_pass.add(key)
            if recalls is not None and recalls.recalled(held, now):
                logger.info(
                    "%s: %s[%d]@%d was recalled; not delivered",
                    self._name,
                    self._topic,
                    held.partition,
                    held.offset,
                )
                segments[-1].append(Unit(held, None, recalled=True))
                continue
            unit = self._isolation.unit(held, now)
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
            self._fetcher.rewind_all()
        return not failed

    def _commit(self, units: list[Unit], now: int) -> bool:
        """One Kafka transaction: the records ``units`` become and their offsets."""
        producer = self._producer()
        if self._consumer() is None:
            return False
        batch = TransactionBatch()
        owners: list[int] = []
        """Record index -> index in ``units`` of the unit it belongs to."""
        for index, unit in enumerate(units):
            if unit.record is not None:
                batch.add(unit.record)
                owners.append(index)

        def refused(at: int, record: PreparedRecord, exc: KafkaException) -> PreparedRecord | None:
            return self._isolation.replace_refused(units[owners[at]], record, exc, now)

        def positions() -> list[TopicPartition]:
            return self._fetcher.positions([unit.held for unit in units])

        def patience(_: TransactionBatch) -> None:
            slow = self._unacknowledged(units, batch, owners)
            if slow:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"set aside: {'; '.join(slow.values())}")
                )

        def failed(failure: KafkaException) -> None:
            error = failure.args[0] if failure.args else None
            if (
                isinstance(error, KafkaError)
                and error.code() == KafkaError.OFFSET_METADATA_TOO_LARGE
            ):
                # A broker whose offset.metadata.max.bytes is below what the final window
                # writes: deliver in offset order from now on rather than fail again.
                self._fetcher.keep_order(error.str())
            self._transaction_failed(failure)
            producer.poll(0)  # the reports of what the abort purged

        if not self._write(
            batch,
            on_failure=failed,
            offsets=positions,
            before_commit=patience,
            on_refused=refused,
            failures=_FAILURES,
        ):
            assert batch.failure is not None
            self._isolation.blame(units, batch, owners, batch.failure)
            return False
        self._fetcher.committed([unit.held for unit in units])
        metrics = active_metrics()
        recalls = self._recalls
        for unit in units:
            self._isolation.settled((unit.held.partition, unit.held.offset))
            self._counts.delivered += unit.real
            if metrics is not None and unit.real:
                ns, kind = self._client.namespace, self._kind
                metrics.delay_deliveries.labels(ns, kind).inc()
                late_ms = max(now_ms() - self._due_at(unit.held), 0)
                metrics.delay_lateness.labels(ns, kind).observe(late_ms / 1000)
            elif (
                metrics is not None
                and unit.record is not None
                and unit.record.kafka_topic == (self._config.catalog.topic(SystemTopic.QUARANTINE))
            ):
                metrics.quarantined.labels(self._client.namespace, "delay").inc()
            self._counts.moved_aside += unit.aside
            if unit.recalled:
                self._counts.recalled += 1
                if recalls is not None:
                    recalls.handled(unit.held)
                if metrics is not None:
                    metrics.delay_recalled.labels(self._client.namespace).inc()
            if unit.duplicate:
                self._counts.duplicates += 1
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
        self, units: list[Unit], batch: TransactionBatch, owners: list[int]
    ) -> dict[Key, str]:
        """Wait (serving delivery reports) until every record of ``batch`` is acknowledged or
        failed, and return the records whose real delivery the broker has not acknowledged
        within their patience (:data:`_SLOW_ACK_S`) of answering the transaction's offset
        commit: they are marked to be set aside, and the transaction is to be aborted. Empty
        when all were acknowledged or failed (the commit says which), or when all are slow
        alike (a slow broker: the commit waits for them). ``owners`` maps a record's index to
        its unit's."""
        answered = time.monotonic()
        limit_s = self._client.send_msg_timeout_ms / 1000
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
                            f"{located(out.kafka_topic, out.partition)}: not acknowledged within "
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
                        self._isolation.slow(key, why)
                    logger.warning(
                        "%s: deliveries set aside: %s", self._name, sorted(slow.values())
                    )
                    return slow
            self._producer().poll(0.01)

    @staticmethod
    def _tries(held: Held) -> int:
        """How many deliveries of ``held`` failed before (its ``DELIVERY_ATTEMPTS``)."""
        try:
            return failed_deliveries(held)
        except RECORD_ERRORS:
            return 0
