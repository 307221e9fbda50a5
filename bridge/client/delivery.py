"""The delivery-report pump: :class:`DeliveryPump`, a confluent-kafka producer and the serving
of its delivery reports.

Reports are served three ways: on the sending threads every few asynchronous sends
(:meth:`DeliveryPump.serve_reports`), by the pump's delivery thread while senders are quiet,
and by a thread waiting for its own acknowledgements (``flush``: a sync send, a batch). A
thread-local guard knows whether a thread is serving reports now, so inside one of its
report callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from bridge.client.send_results import SyncWaiter
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, KafkaClientError, SendTimeoutError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_producer, produce_record
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S: Final = 0.02
"""How often the delivery thread checks whether senders went quiet, seconds."""
_REPORTS_EVERY_SENDS: Final = 32
"""Asynchronous sends serve waiting delivery reports every this many sends: each poll hands
the GIL around, so serving after every send costs more than the reports themselves."""
SYNC_FLUSH_SLICE_S: Final = 0.005
"""A thread waiting for its acknowledgements flushes in slices this long, seconds (flush
skips linger.ms)."""
REPORT_GRACE_S: Final = 1.0
"""A waiting send waits this long past ``send_msg_timeout_ms`` for librdkafka's report of a
record it failed at that timeout, seconds."""


class _Serving(threading.local):
    """Per thread: whether this thread is serving the pump's delivery reports now (in
    librdkafka's ``poll`` or ``flush``), so inside one of its report callbacks."""

    active = False


class _SystemTopics:
    """The system topics a record may go to (SCHEDULE, timer, HALF), created (idempotent)
    before the first record to one of them, so Kafka never auto-creates one with the wrong
    partition count."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        catalog = config.catalog()
        self.names = frozenset(
            catalog.topic(t) for t in (SystemTopic.HALF, SystemTopic.SCHEDULE, SystemTopic.TIMER)
        )
        self.ready = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Create them now, once; concurrent first sends wait for one check instead of each
        running its own."""
        with self._lock:
            if self.ready:
                return
            catalog = self._config.catalog()
            admin = TopicAdmin(self._config)
            # Levels and tiers are partitions: their counts must be right. Any HALF partition
            # count works for writing; the coordinator owns that choice.
            admin.ensure_topics(
                [catalog.spec(SystemTopic.SCHEDULE), catalog.spec(SystemTopic.TIMER)]
            )
            admin.ensure_topics(
                [catalog.spec(SystemTopic.HALF), catalog.spec(SystemTopic.OP)], strict=False
            )
            self.ready = True


class DeliveryPump:
    """A confluent-kafka producer (made with ``config``, ``client_id``) and the serving of its
    delivery reports; ``name`` names it in logs and errors (the producer group).
    :meth:`start` before producing, :meth:`flush` then :meth:`stop` after."""

    def __init__(self, config: ClientConfig, client_id: str, name: str) -> None:
        self.config = config
        self._client_id = client_id
        self._name = name
        self.kafka: Any = None
        """The confluent-kafka producer, once started (its metadata gives partition counts)."""
        self._timeout_ms = config.send_msg_timeout_ms
        self._system_topics = _SystemTopics(config)
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()
        self._senders_active = False
        self._sends_unserved = 0
        """Asynchronous sends since reports were last served (approximate across threads)."""
        self._batches_waiting = 0
        """Batches being sent whose threads serve the reports."""
        self._batches_lock = threading.Lock()
        self._serving = _Serving()

    def start(self) -> None:
        """Create the Kafka client and the delivery thread."""
        self.kafka = new_producer(self.config, client_id=self._client_id)
        self._poller = threading.Thread(
            target=self._poll_loop, name=f"bridge-producer-{self._name}", daemon=True
        )
        self._poller.start()

    def stop(self) -> None:
        """Stop the delivery thread (after :meth:`flush`: reports not served are dropped)."""
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()

    def metadata(self) -> Any:
        """The confluent-kafka producer, whose metadata gives partition counts; None before
        :meth:`start`."""
        return self.kafka

    # --- producing ----------------------------------------------------------------------
    def ensure_system_topics(self) -> None:
        """Create the system topics now (idempotent): see
        :meth:`bridge.Producer.ensure_system_topics`."""
        self._system_topics.ensure()

    def ensure_system_topics_for(self, records: list[PreparedRecord | None]) -> None:
        """Create the system topics now if one of ``records`` goes to one (None: a plain
        message's record, for a real topic), before they are handed over without
        :meth:`produce`."""
        topics = self._system_topics
        # filter(None, ...) skips the plain messages' Nones without a step each in Python.
        if not topics.ready and any(r.kafka_topic in topics.names for r in filter(None, records)):
            topics.ensure()

    def produce(
        self, record: PreparedRecord, partition: int, callback: Any, *, serve: bool = False
    ) -> None:
        """Hand ``record`` to librdkafka (``partition`` -1: its key decides), ``callback``
        getting its delivery report. A full local queue is waited out (see
        :meth:`wait_for_room`), within ``send_msg_timeout_ms``; raises the project's error
        when the record was not taken. ``serve``: then :meth:`serve_reports` (an
        asynchronous send)."""
        if not self._system_topics.ready and record.kafka_topic in self._system_topics.names:
            self._system_topics.ensure()
        # produce_record only when the first try fails: a call less on every send (python -m
        # bench producer: send_async's CPU a message).
        try:
            self.kafka.produce(
                record.kafka_topic,
                record.value,
                record.key,
                partition=partition,
                on_delivery=callback,
                timestamp=record.born_timestamp_ms,
                headers=record.headers,
            )
        except Exception:  # a full queue to wait for, or an error to translate
            produce_record(
                self.kafka,
                record,
                partition,
                callback,
                timeout_ms=self._timeout_ms,
                wait_full=self.wait_for_room,
            )
        self._senders_active = True
        if serve:  # serve_reports, inlined
            unserved = self._sends_unserved + 1
            if unserved >= _REPORTS_EVERY_SENDS:
                unserved = 0
                self.poll(0)
            self._sends_unserved = unserved

    def serve_reports(self) -> None:
        """Serve waiting delivery reports on this (sending) thread every
        ``_REPORTS_EVERY_SENDS`` sends; the delivery thread serves the rest."""
        unserved = self._sends_unserved + 1
        if unserved >= _REPORTS_EVERY_SENDS:
            unserved = 0
            self.poll(0)
        self._sends_unserved = unserved

    def send_and_wait(
        self, records: list[PreparedRecord], what: str, started: float, *, resends: bool
    ) -> list[SyncWaiter]:
        """Hand ``records`` to librdkafka (each to its own partition) and wait for every
        report, at most ``send_msg_timeout_ms`` (plus the grace) after the last hand-over;
        return each one's waiter (not ``done``: no report came in time). ``what`` names the
        wait in the error refusing it inside a report callback; ``started`` and ``resends``
        as for :class:`SyncWaiter`."""
        self.refuse_waiting_in_a_callback(what)
        waiters = []
        for record in records:
            waiter = SyncWaiter(started, resends=resends)
            try:
                self.produce(record, record.partition, waiter)
            except KafkaClientError as exc:
                waiter.fail(exc)
            waiters.append(waiter)
        # flush() sends at once instead of waiting linger.ms, and serves delivery reports
        # (ours among them) on this thread. librdkafka fails a record after
        # message.timeout.ms; the grace is for its report to arrive.
        deadline = time.monotonic() + self._timeout_ms / 1000 + REPORT_GRACE_S
        for waiter in waiters:
            while not waiter.done:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.flush(min(remaining, SYNC_FLUSH_SLICE_S))
        return waiters

    @contextmanager
    def batch_waiting(self) -> Iterator[None]:
        """While a batch's thread serves every report (its ``flush``), the delivery thread
        serves none: it would only hand the GIL back and forth."""
        with self._batches_lock:
            self._batches_waiting += 1
        try:
            yield
        finally:
            with self._batches_lock:
                self._batches_waiting -= 1

    # --- serving delivery reports -------------------------------------------------------
    # confluent-kafka aborts the process (a failed C assertion, no exception) when a thread
    # serving a client's delivery reports calls that client's poll() or flush() again from
    # one of them: a callback that sends (the push consumer's copy reports send copies on),
    # every few sends, would serve reports. On such a thread reports are left to the next
    # poll, and what must wait for reports is refused.
    def poll(self, timeout_s: float) -> None:
        """Serve delivery reports for up to ``timeout_s`` (s); inside one of this pump's
        report callbacks on this thread, only wait."""
        serving = self._serving
        if serving.active:
            if timeout_s > 0:
                time.sleep(timeout_s)
            return
        serving.active = True
        try:
            self.kafka.poll(timeout_s)
        finally:
            serving.active = False

    def flush(self, timeout_s: float) -> int:
        """librdkafka's flush for up to ``timeout_s`` (s): how many records are still
        unacknowledged. :class:`IllegalStateError` inside a report callback of this pump."""
        self.refuse_waiting_in_a_callback("a send waiting for its acknowledgement, or flush")
        serving = self._serving
        serving.active = True
        try:
            return int(self.kafka.flush(timeout_s))
        finally:
            serving.active = False

    def wait_for_room(self) -> None:
        """Let deliveries drain a full local queue for a moment. Inside one of this pump's
        report callbacks the thread may be the only one serving the reports that free room:
        :class:`SendTimeoutError` at once rather than a wait of ``send_msg_timeout_ms`` with
        every report behind it held."""
        if self._serving.active:
            raise SendTimeoutError(
                f"producer {self._name}: the local queue is full, and a send in one of its "
                "own delivery callbacks cannot wait for room"
            )
        self.poll(0.01)

    def refuse_waiting_in_a_callback(self, what: str) -> None:
        """:class:`IllegalStateError` naming ``what`` on a thread serving this pump's
        reports: it would wait for reports only this thread serves."""
        if self._serving.active:
            raise IllegalStateError(
                f"producer {self._name}: {what} in one of its own delivery callbacks: it "
                "would wait for reports only this thread serves (send_async or send_oneway "
                "can be called there)"
            )

    def _poll_loop(self) -> None:
        # Delivery reports are served on the sending threads every few sends (confluent-kafka
        # takes the GIL once per report, so serving each as it arrives here would hand the GIL
        # back and forth for every message); while senders are busy this thread serves what
        # waits once per interval, so no report waits longer than that for the next sends.
        # While a batch waits for its reports, its thread serves every report (flush()):
        # this thread serving some too would only hand the GIL back and forth.
        poll = self.poll
        while not self._stop_polling.is_set():
            try:
                if self._batches_waiting:
                    self._stop_polling.wait(_POLL_INTERVAL_S)
                elif self._senders_active:
                    self._senders_active = False
                    self._stop_polling.wait(_POLL_INTERVAL_S)
                    if not self._batches_waiting:
                        poll(0)
                else:
                    poll(_POLL_INTERVAL_S)
            except BaseException:
                # Report callbacks catch Exception; what they let through (a SystemExit, say)
                # must not end this thread. The reports not served yet wait for the next poll.
                logger.exception("producer %s: a delivery report callback raised", self._name)
