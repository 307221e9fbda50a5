"""The coordinator's side of recall: the timer service reads the namespace's recall topic and
skips, at its final delivery, a timer message whose recall applies
(:func:`~bridge.delay.recall.recall_applies`); its offsets are committed as a delivery's, in
the same Kafka transaction as the deliveries beside it, so it is never delivered later nor
after a restart.

:class:`RecallWatch` knows every applying marker stored before its *horizon*: the latest
broker append time it read in the recall topic (one partition, whose append times do not go
back: every record stored before one it read was read too). Before the final deliveries of a
pass, the timer service asks for a horizon of at least ``due - RECALL_MARGIN_MS`` for the
latest of them (:meth:`TimerRecalls.prepare`); when the horizon is behind, the watch writes a
tick (an empty record) and reads up to it. A tick stamped at ``T`` serves every delivery due up
to ``T + RECALL_MARGIN_MS``, so while timers come due one after another a tick is written
about once per margin. A (re)started coordinator's horizon starts at nothing: its first final
delivery reads the whole topic first.

Restart cost: the topic is ``compact,delete`` (retention ``timer_max_delay_ms`` + 7 days,
hourly segments). Every tick has one key (:data:`~bridge.delay.recall.TICK_KEY`), so the log
cleaner keeps the last tick of the rolled segments, and a start reads the markers of the
retention plus the ticks of about the last hour (a few thousand per coordinator process).
Without it, a start read every tick of the retention: one a margin per process while timers
come due, some 860,000 per process for the default 3-day timers. 1 million tiny records took
9.2 s to read on the shared 2-core test machine; three processes' ticks (about 2.6 million,
some 24 s by that rate) outlast the default ``request_timeout_ms`` (10 s), so every timer
waited through failed passes after a start.
Compaction cannot cost a guarantee: it drops a record only when a later one of its key exists,
each marker has a key of its own (:func:`~bridge.delay.recall.marker_key`), and a tick's
only use is its stamp, read by the coordinator that wrote it from the active segment, or
from a later record of the partition if the cleaner got there first (every record before a
later one is read too, and that one's stamp is later still).

Memory: only markers that apply are kept, each until its message was skipped in a committed
transaction or until :data:`RECALL_KEPT_MS` after its time (a marker of a message that another
coordinator process delivers, or that was never sent): so a coordinator holds the recalls of
the messages not yet due, and those of other processes' messages of the last week.
"""

from __future__ import annotations

import heapq
import logging
import time
import uuid
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from bridge.config import ClientConfig
from bridge.coordinator.delay.held import Held
from bridge.delay.recall import (
    RECALL_MARGIN_MS,
    TICK_KEY,
    read_marker,
    recall_applies,
    tick_headers,
)
from bridge.delay_policy import DelayPolicy
from bridge.kafka.clients import new_consumer, new_producer
from bridge.observability.metrics import active_metrics
from topics.naming import reader_group

__all__ = ["RECALL_KEPT_MS", "RecallWatch", "TimerRecalls"]

logger = logging.getLogger(__name__)

RECALL_KEPT_MS: Final = 7 * 86_400_000
"""An applying marker whose message was not skipped here is forgotten this long after the
message's time, ms (7 days: the week the timer topic keeps a record past the longest timer, so
a message that still comes after that is one whose record Kafka may have deleted). Shorter,
and a coordinator far behind its timers (down for hours, then working through the backlog)
would deliver recalled messages whose markers it had forgotten."""
_NOTHING: Final = -(1 << 62)
_POLL_S: Final = 0.05
_BROKER_CLOCK_WAIT_S: Final = 0.05
"""Between ticks while the broker's clock is behind what a delivery needs, s."""
RECALL_FETCH_WAIT_MS: Final = 500
"""How long the reader's fetch waits at the broker for records, ms (librdkafka's default). A
tick or marker written meanwhile ends the wait at once, so it does not delay a read (a tick
written and read back: 52 ms at the median either way, on a local broker); the reader's
other requests (an offset lookup after the topic was created again, metadata refreshes) are
rare enough to wait behind a fetch. Librdkafka fetches an assigned partition whether or not
it is polled: with fetches that did not wait (10 ms), an idle coordinator's reader sent the
broker about 85 requests a second, and an idle coordinator cost a local broker 3.7-4.3 s of CPU
a minute more than it spent alone; 1.5-2.4 s with this wait
(``BENCH_DELAYS_ROWS=quiet python -m bench delays``)."""
AHEAD_MS: Final = 200
"""A timer in the final window this close to its time gets its tick ahead of it, ms, if the
horizon does not cover it yet: the tick's round trip is then spent before the time rather
than added to the delivery (``python -m bench delays``, 200 idle timers at 100 ms precision
on a shared 2-core machine: p99 lateness 66-79 ms without it, 55 ms with it, 48-61 ms in
runs of the release before recall)."""


class RecallWatch:
    """The applying recall markers of one namespace's recall topic ``topic`` (partition 0),
    read with its own consumer; ticks written with its own producer. Used by one thread (the
    timer service's); :meth:`start` before, :meth:`stop` after."""

    def __init__(self, client: ClientConfig, topic: str, name: str) -> None:
        self._client = client
        self._topic = topic
        self._name = name
        self._timeout_s = client.request_timeout_ms / 1000
        self._producer: Any = None
        self._consumer: Consumer | None = None
        self._horizon = _NOTHING
        """Every marker the broker stored before this time (epoch ms, its clock) was read."""
        self._read_to = -1
        """The highest offset read."""
        self._recalled: set[tuple[str, int]] = set()
        """(message id, due ms) of the markers read that apply."""
        self._expiry: list[tuple[int, str]] = []
        """Heap of (due ms, message id) of :attr:`_recalled`."""
        self._warned_timestamps = False

    @property
    def horizon_ms(self) -> int:
        """Every marker the broker stored before this time (epoch ms) was read."""
        return self._horizon

    def start(self) -> None:
        """Make the producer and the reader; nothing is read before the first
        :meth:`ensure`."""
        self._producer = new_producer(self._client, client_id=f"{self._name}-recall")
        self._consumer = new_consumer(
            self._client,
            reader_group("recall", uuid.uuid4().hex),
            f"{self._name}-recall-reader",
            fetch_wait_max_ms=RECALL_FETCH_WAIT_MS,
        )
        self._consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])

    def stop(self) -> None:
        """Close both clients (idempotent)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(1)

    def ensure(self, needed_ms: int) -> None:
        """Return once every marker the broker stored before ``needed_ms`` (epoch ms) was
        read: at once when the horizon is there already, else after a tick (more while the
        broker's clock is behind ``needed_ms``). Raises :class:`KafkaException` when that
        does not happen within ``request_timeout_ms`` (the deliveries wait for the next
        pass)."""
        if self._horizon >= needed_ms:
            return
        deadline = time.monotonic() + self._timeout_s
        while True:
            offset, stamped = self._tick(deadline)
            self._rewind_if_recreated(offset)
            self._read_through(offset, deadline)
            self._horizon = max(self._horizon, stamped)
            if self._horizon >= needed_ms:
                return
            if time.monotonic() >= deadline:
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        f"{self._topic}: the broker's clock ({stamped}) stayed behind "
                        f"{needed_ms} (a delivery's time less {RECALL_MARGIN_MS} ms)",
                    )
                )
            time.sleep(_BROKER_CLOCK_WAIT_S)

    def advance(self) -> None:
        """Write one tick and read up to it (a horizon for the deliveries about to come),
        within ``request_timeout_ms``; raises :class:`KafkaException` if it cannot."""
        deadline = time.monotonic() + self._timeout_s
        offset, stamped = self._tick(deadline)
        self._rewind_if_recreated(offset)
        self._read_through(offset, deadline)
        self._horizon = max(self._horizon, stamped)

    def _rewind_if_recreated(self, offset: int) -> None:
        """A tick written after every record read has a higher offset; one at ``offset`` or
        below it means the partition's offsets started again (the topic was deleted and
        created again, e.g. by a producer's first recall after an operator removed it): read
        it from its beginning, or its markers below the old offsets would never be read. The
        markers read before stay kept (their producers were told the recall applied)."""
        if offset > self._read_to:
            return
        consumer = self._consumer
        if consumer is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "the recall watch is stopped"))
        logger.warning(
            "%s: %s starts again at offset %d (read up to %d before): reading it from its "
            "beginning",
            self._name,
            self._topic,
            offset,
            self._read_to,
        )
        self._read_to = -1
        self._horizon = _NOTHING
        consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])

    def applies(self, message_id: str, due_ms: int) -> bool:
        """Whether a marker read recalls the message ``message_id`` due at ``due_ms``."""
        return (message_id, due_ms) in self._recalled

    def forget(self, message_id: str, due_ms: int) -> None:
        """The message was skipped in a committed transaction: its marker is no longer
        needed."""
        self._recalled.discard((message_id, due_ms))

    def expire(self, now_ms: int) -> None:
        """Forget markers whose message's time is more than :data:`RECALL_KEPT_MS` before
        ``now_ms``."""
        expiry = self._expiry
        while expiry and expiry[0][0] < now_ms - RECALL_KEPT_MS:
            due, message_id = heapq.heappop(expiry)
            self._recalled.discard((message_id, due))

    def _tick(self, deadline: float) -> tuple[int, int]:
        """Write a tick; return its offset and the broker's append time of it."""
        producer = self._producer
        if producer is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "the recall watch is stopped"))
        outcome: list[Any] = []

        def report(err: KafkaError | None, kmsg: Any) -> None:
            outcome.append(err if err is not None else kmsg)

        producer.produce(
            self._topic,
            key=TICK_KEY,
            value=None,
            partition=0,
            headers=tick_headers(),
            on_delivery=report,
        )
        while not outcome and time.monotonic() < deadline:
            producer.flush(min(max(deadline - time.monotonic(), 0.0), 0.1))
        if not outcome:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"{self._topic}: tick not acknowledged")
            )
        if isinstance(outcome[0], KafkaError):
            raise KafkaException(outcome[0])
        kmsg = outcome[0]
        kind, stamped = kmsg.timestamp()
        metrics = active_metrics()
        if metrics is not None:
            metrics.recall_ticks.labels(self._client.namespace).inc()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise KafkaException(
                KafkaError(
                    KafkaError.INVALID_CONFIG,
                    f"{self._topic} does not stamp records with the broker's clock "
                    "(message.timestamp.type must be LogAppendTime): recalls cannot be "
                    "honoured, and timers are not delivered until it is fixed",
                )
            )
        return int(kmsg.offset()), int(stamped)

    def _read_through(self, offset: int, deadline: float) -> None:
        """Read the recall topic up to and including ``offset``."""
        consumer = self._consumer
        if consumer is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "the recall watch is stopped"))
        while self._read_to < offset:
            if time.monotonic() >= deadline:
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        f"{self._topic}: not read up to offset {offset} in time",
                    )
                )
            for record in consumer.consume(1000, _POLL_S):
                error = record.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    continue
                self._take(record)

    def _take(self, record: Any) -> None:
        """One record of the recall topic: a marker that applies is kept; every record
        (tick or marker) moves the horizon to its append time."""
        self._read_to = max(self._read_to, record.offset())
        kind, stamped = record.timestamp()
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            if not self._warned_timestamps:
                self._warned_timestamps = True
                logger.warning(
                    "%s: %s has records not stamped by the broker; they are ignored",
                    self._name,
                    self._topic,
                )
            return
        self._horizon = max(self._horizon, stamped)
        marker = read_marker(record.key(), record.headers())
        if marker is None:
            return
        message_id, due_ms = marker
        if recall_applies(stamped, due_ms) and (message_id, due_ms) not in self._recalled:
            self._recalled.add((message_id, due_ms))
            heapq.heappush(self._expiry, (due_ms, message_id))


class TimerRecalls:
    """What the timer service asks of recalls, over a :class:`RecallWatch`: is a due record's
    final delivery recalled (:meth:`recalled`), after :meth:`prepare` read the markers it
    needs."""

    def __init__(self, watch: RecallWatch, policy: DelayPolicy) -> None:
        self.watch = watch
        self._policy = policy

    def _final_due(self, held: Held, now: int) -> int | None:
        """The time of ``held`` when taking it now is its final delivery, else None (a hop,
        or a record whose time could not be read)."""
        exact = held.exact_ms
        if exact is None:
            return None
        policy = self._policy
        return exact if policy.route(exact, now, policy.tier_count) is None else None

    def prepare(self, due: list[Held], now: int) -> None:
        """Read the markers of every final delivery among ``due`` (taken at ``now``, epoch
        ms) before any of them is written. Raises :class:`KafkaException` when they cannot
        be read in time."""
        latest = max(
            (d for d in (self._final_due(h, now) for h in due) if d is not None), default=None
        )
        if latest is not None:
            self.watch.expire(now)
            self.watch.ensure(latest - RECALL_MARGIN_MS)

    def ahead(self, next_exact_ms: int | None, now: int) -> None:
        """Before the final delivery due at ``next_exact_ms`` (the earliest of the final
        window; None: none), at ``now`` (epoch ms): once it is :data:`AHEAD_MS` away and the
        horizon does not cover it, tick now so that :meth:`prepare` finds it covered. A
        failure is only logged: :meth:`prepare` tries again, and stops the delivery if it
        fails too."""
        if (
            next_exact_ms is None
            or next_exact_ms - now > AHEAD_MS
            or self.watch.horizon_ms >= next_exact_ms - RECALL_MARGIN_MS
        ):
            return
        try:
            self.watch.advance()
        except KafkaException as exc:
            logger.info("recall tick ahead of a delivery failed: %s", exc)

    def recalled(self, held: Held, now: int) -> bool:
        """Whether taking ``held`` at ``now`` is its final delivery and a recall applies to
        it."""
        due = self._final_due(held, now)
        if due is None:
            return False
        key = held.record.key()
        if not key:
            return False
        try:
            message_id = bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            return False
        return self.watch.applies(message_id, due)

    def handled(self, held: Held) -> None:
        """``held`` was skipped in a committed transaction."""
        key = held.record.key()
        if key and held.exact_ms is not None:
            self.watch.forget(bytes(key).decode("utf-8", "replace"), held.exact_ms)
