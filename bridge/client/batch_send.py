"""RocketMQ's batch send over librdkafka: :class:`BatchSender` hands the records of a checked
batch to librdkafka, each with one small report handler, and waits once for every report
(see :meth:`bridge.Producer.send_batch` for the rules)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from confluent_kafka import KafkaError

from bridge.client.delivery import REPORT_GRACE_S, SYNC_FLUSH_SLICE_S, DeliveryPump
from bridge.client.recall import recall_handle
from bridge.client.resend import AloneResender
from bridge.client.send_results import (
    BatchReports,
    SendResult,
    SendStatus,
    record_send_failure,
)
from bridge.codec import PreparedRecord, RecordFields, new_tuple
from bridge.errors import KafkaClientError, SendTimeoutError
from bridge.kafka.clients import translate_error
from bridge.message import Message
from bridge.observability.metrics import active_metrics
from topics.catalog import SystemTopic
from topics.naming import system_topic

_BATCH_REPORTS_KEPT: Final = 4
"""Report stores of finished batches kept for the next batches (one per thread sending
batches at once), at most."""


class BatchSender:
    """Sends checked batches through ``pump``; ``records(batch, prepared, partition, start,
    stop)`` gives the records of the messages of a checked batch from index ``start`` up to
    ``stop`` (``RecordBuilder.batch_records``), and ``resender`` (None: records are sent
    alone already) sends again the records refused with their request batch as too large."""

    def __init__(
        self,
        pump: DeliveryPump,
        resender: AloneResender | None,
        records: Callable[
            [list[Message], list[PreparedRecord | None], int, int, int | None],
            list[RecordFields],
        ],
        timeout_ms: int,
    ) -> None:
        self._pump = pump
        self._resender = resender
        self._records = records
        self._timer_topic = system_topic(SystemTopic.TIMER.value, pump.config.namespace)
        """The timer topic: a record to it gets a recall handle."""
        self._timeout_ms = timeout_ms
        self._idle_reports: list[BatchReports] = []
        """Report stores (with their handlers) of finished batches, for the next ones."""

    def send(
        self, batch: list[Message], prepared: list[PreparedRecord | None], partition: int
    ) -> list[SendResult | KafkaClientError]:
        """Hand the records of ``batch`` (checked: ``prepared``, per message its record or
        None for one to build) to librdkafka and wait for their reports."""
        if not batch:
            return []
        self._pump.ensure_system_topics_for(prepared)
        try:
            reports = self._idle_reports.pop()
        except IndexError:
            reports = BatchReports()
        reports.begin(batch, time.monotonic() if active_metrics() is not None else None)
        with self._pump.batch_waiting():
            complete = self._hand_over_and_wait(batch, prepared, partition, reports)
        if reports.too_large:
            if self._resender is not None:
                self._send_alone(reports)
            elif reports.started is not None:  # their reports were not recorded
                for index in reports.too_large:
                    record_send_failure(reports.started, reports.records[index][0])
        results = reports.results(self._timeout_ms, complete=complete)
        # Every message has its outcome: no report of this batch can come any more, so its
        # handlers serve the next batch. (Reports that did not come may still come: those
        # handlers stay with this batch.)
        if complete and len(self._idle_reports) < _BATCH_REPORTS_KEPT:
            reports.begin((), None)
            self._idle_reports.append(reports)
        return results

    def _hand_over_and_wait(
        self,
        batch: list[Message],
        prepared: list[PreparedRecord | None],
        partition: int,
        reports: BatchReports,
    ) -> bool:
        """Hand each record of a batch to librdkafka, then serve reports until every one
        came or ``send_msg_timeout_ms`` (plus the grace) passed since the last hand-over;
        True if every message has its outcome."""
        timeout_ms = self._timeout_ms
        outcomes, handlers = reports.outcomes, reports.handlers
        kept = len(handlers)
        sent = reports.records
        pump = self._pump
        produce = pump.kafka.produce
        namespace = pump.config.namespace
        timer_topic = self._timer_topic
        stalled: SendTimeoutError | None = None
        if prepared.count(None) != len(prepared):  # a record to the timer topic: its handle
            for index, record in enumerate(prepared):
                if record is not None and record.kafka_topic == timer_topic:
                    reports.recall_handles[index] = recall_handle(
                        record, batch[index].topic, namespace
                    )
        count = len(batch)
        build = self._records
        records = build(batch, prepared, partition, 0, None)
        first = 0  # the index of records[0] in the batch
        built = count  # the index of the first message whose record is not built (yet again)
        ahead = 1  # records built at once after a wait; doubles while none waits
        for index in range(count):
            if index == built:
                # After a wait, the records are built again a few at a time, twice as many
                # each time none waited: a wait wastes at most as many as were handed over
                # since the last one, not the rest of the batch (n * n / 2 for n waits).
                built = min(count, index + ahead)
                ahead *= 2
                records = build(batch, prepared, partition, index, built)
                first = index
            fields = sent[index] = records[index - first]
            kafka_topic, key, value, headers, msg_id, born_ms, record_partition = fields
            if stalled is not None:
                outcomes[index] = SendTimeoutError(
                    f"send of {msg_id} to {kafka_topic}: not handed to Kafka, never sent (the "
                    f"local queue stayed full for {timeout_ms} ms)"
                )
                continue
            callback = handlers[index] if index < kept else reports.handler(index)
            try:
                produce(
                    kafka_topic,
                    value,
                    key,
                    partition=record_partition,
                    on_delivery=callback,
                    timestamp=born_ms,
                    headers=headers,
                )
            except BufferError:  # the local queue is full: wait for room, as a single send
                try:
                    pump.produce(new_tuple(PreparedRecord, fields), record_partition, callback)
                except SendTimeoutError as exc:
                    outcomes[index] = stalled = exc
                except KafkaClientError as exc:
                    outcomes[index] = exc
                # The records after it are built again: dated (and their ids taken) after
                # the wait, as a single send after it would be.
                built = index + 1
                ahead = 1
            except Exception as exc:  # KafkaException: unknown partition, ...
                outcomes[index] = translate_error(exc, f"send of {msg_id} to {kafka_topic}")
        # flush() sends at once instead of waiting linger.ms, and serves delivery reports on
        # this thread (the delivery thread serves some too).
        flush = pump.flush
        deadline = time.monotonic() + timeout_ms / 1000 + REPORT_GRACE_S
        done = 0
        while True:
            done = reports.reported(done)
            if done == count:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            flush(min(remaining, SYNC_FLUSH_SLICE_S))

    def _send_alone(self, reports: BatchReports) -> None:
        """Send the records of a batch (``reports.records``, as handed over) refused with
        their request batches as too large (``reports.too_large``) again each in a batch of
        its own, in the batch's order, and wait: their outcomes replace the refusals."""
        assert self._resender is not None
        refused: list[tuple[int, PreparedRecord, KafkaError]] = []
        for index in sorted(reports.too_large):
            error = reports.outcomes[index]
            if isinstance(error, KafkaError):
                refused.append((index, new_tuple(PreparedRecord, reports.records[index]), error))
        if not refused:
            return
        again = self._resender.send_all_sync(
            [(record, error) for _, record, error in refused],
            time.monotonic() if reports.started is None else reports.started,
        )
        outcomes, msgs = reports.outcomes, reports.msgs
        for (index, record, _), result in zip(refused, again, strict=True):
            if isinstance(result, KafkaClientError):
                outcomes[index] = result
            else:
                stored_partition, offset = result
                outcomes[index] = new_tuple(
                    SendResult,
                    (
                        SendStatus.SEND_OK,
                        record.msg_id,
                        offset,
                        msgs[index].topic,
                        stored_partition,
                        reports.recall_handles[index],
                    ),
                )
