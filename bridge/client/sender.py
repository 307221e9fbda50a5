"""Sending prepared records: :class:`RecordSender`, a :class:`DeliveryPump` with the
:class:`AloneResender` of records refused with their request batch.

What every client that sends prepared records goes through: the producers
(:class:`~bridge.client.producer.Producer`, the asyncio producer) and the push consumer's
copies (retry, DLQ, quarantine) and dead-letter replays. Sends are idempotent and
acknowledged by all in-sync replicas (``acks=all``), each bounded by ``send_msg_timeout_ms``.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from confluent_kafka import KafkaError

from bridge.client.delivery import DeliveryPump
from bridge.client.resend import AloneResender, sends_alone
from bridge.client.send_results import (
    Report,
    ResendAlone,
    log_oneway_failure,
    not_resent,
    refused_with_its_batch,
    report_oneway,
)
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, KafkaClientError
from bridge.lifecycle import Lifecycle, ServiceState, Startable

logger = logging.getLogger(__name__)


class RecordSender(Startable):
    """Sends prepared records with one Kafka producer made with ``config`` (``group``: its
    client id and its name in logs and errors). :meth:`start` before sending, :meth:`shutdown`
    after (or use ``with``).

    A record refused with its request batch as too large is sent again alone by the
    :attr:`resender` (None when ``config`` puts each record in a batch of its own already):
    by every sync send, and by an async one asked to (``resend_alone``)."""

    def __init__(self, config: ClientConfig, group: str) -> None:
        self.config = config
        self.group = group
        self.pump = DeliveryPump(config, group, group)
        self.resender = None if sends_alone(config) else AloneResender(config, group)
        self.resend: ResendAlone | None = None if self.resender is None else self.resender.resend
        """How a record refused with its request batch as too large is sent again alone
        (``resend(record, report)``, raising when it cannot hand it over); None for a sender
        that sends each record alone already."""
        self._lifecycle = Lifecycle(f"producer {group}")
        self.running = False
        """Mirrors ``state is RUNNING`` for a cheap check on every send."""

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The sender's lifecycle state."""
        return self._lifecycle.state

    def require_running(self) -> None:
        """:class:`IllegalStateError` unless started and not shut down."""
        self._lifecycle.require_running()

    def start(self) -> None:
        """Create the Kafka client and its delivery thread. May be called once."""
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            self.pump.start()
        except Exception:
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        self.running = True
        logger.info("producer %s started (bootstrap %s)", self.group, self.config.bootstrap_servers)

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Wait up to ``timeout_ms`` (default ``send_msg_timeout_ms``) for outstanding sends,
        then stop. Idempotent."""
        if self._lifecycle.state in (ServiceState.SHUTDOWN_ALREADY, ServiceState.CREATE_JUST):
            if self._lifecycle.state is ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            return
        self.pump.refuse_waiting_in_a_callback("shutdown")
        self.running = False
        timeout = timeout_ms if timeout_ms is not None else self.config.send_msg_timeout_ms
        deadline = time.monotonic() + timeout / 1000
        remaining = self.pump.flush(timeout / 1000)
        # Reports served by that flush may have sent records again alone: they are waited for
        # within the same timeout.
        if self.resender is not None:
            self.resender.close(max(0, int((deadline - time.monotonic()) * 1000)))
        if remaining:
            logger.warning(
                "producer %s: %d messages still unacknowledged at shutdown", self.group, remaining
            )
        self.pump.stop()
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        logger.info("producer %s shut down", self.group)

    def stop(self) -> None:
        """:meth:`shutdown` with the default timeout."""
        self.shutdown()

    def flush(self, timeout_ms: int | None = None) -> int:
        """Wait for outstanding sends (those sent again alone too); return how many are
        still unacknowledged."""
        self._lifecycle.require_running()
        timeout = timeout_ms if timeout_ms is not None else self.config.send_msg_timeout_ms
        deadline = time.monotonic() + timeout / 1000
        remaining = self.pump.flush(timeout / 1000)
        if self.resender is not None:  # records sent again alone by the reports served above
            remaining += self.resender.flush(max(0.0, deadline - time.monotonic()))
        return remaining

    def ensure_system_topics(self) -> None:
        """Create the system topics now (idempotent): see
        :meth:`bridge.Producer.ensure_system_topics`."""
        self.pump.ensure_system_topics()

    # --- asynchronous sends -------------------------------------------------------------
    def oneway_report(self, record: PreparedRecord) -> Report:
        """The delivery report handler of a oneway send of ``record``."""
        resend = self.resend
        if resend is None:
            return log_oneway_failure
        return partial(report_oneway, resend, record)

    def send_record_async(
        self,
        record: PreparedRecord,
        partition: int,
        callback: Any,
        *,
        resend_alone: bool = False,
    ) -> None:
        """Send a prepared record; ``callback(err, kafka_message)`` gets the delivery report.
        Raises only when the record was not taken: a callback that raises while reports are
        served here is logged, since its record, taken already, still gets its own report.

        ``resend_alone``: a record the broker refuses with its request batch as too large is
        sent again alone first, as a ``send_async`` is, and ``callback`` gets that send's
        report, so a MSG_SIZE_TOO_LARGE it gets is the record's own; when the record cannot
        be sent again (shut down, the local queue stayed full), ``callback`` gets the
        exception saying why instead of a :class:`KafkaError`, and None. Off by default for
        callers whose ``callback`` sends again itself (:attr:`resend`)."""
        self._lifecycle.require_running()
        if resend_alone and self.resender is not None:
            callback = partial(self._report_or_resend, record, partition, callback)
        self.pump.produce(record, partition, callback)
        try:
            self.pump.serve_reports()
        except Exception:
            logger.exception("producer %s: a delivery report callback raised", self.group)

    def _report_or_resend(
        self,
        record: PreparedRecord,
        partition: int,
        callback: Any,
        err: KafkaError | None,
        kmsg: Any,
    ) -> None:
        """The delivery report of a :meth:`send_record_async` with ``resend_alone``: one
        refused with its request batch as too large sends ``record`` again alone, with
        ``callback`` for that send's report; any other goes to ``callback``."""
        if err is None or not refused_with_its_batch(err) or self.resender is None:
            callback(err, kmsg)
            return
        if partition < 0 and kmsg is not None:
            # Again in the partition its batch was in: the record stays in its key's order.
            placed = kmsg.partition()
            partition = placed if placed is not None and placed >= 0 else -1
        try:
            self.resender.resend_to(record, partition, callback)
        except Exception as exc:  # not taken: the callback learns why
            callback(exc, None)

    # --- waiting sends ------------------------------------------------------------------
    def send_record_sync(
        self, record: PreparedRecord, *, started: float | None = None
    ) -> tuple[int, int]:
        """Send a prepared record and wait for its acknowledgement (at most
        ``send_msg_timeout_ms``); return (partition, offset), or raise its error.
        ``started``: when the send began, monotonic s (default now), for its cost in metrics.

        A record refused with its request batch as too large is sent again alone before this
        returns, within ``send_msg_timeout_ms`` again."""
        self._lifecycle.require_running()
        started = time.monotonic() if started is None else started
        [waiter] = self.pump.send_and_wait(
            [record], "send_sync", started, resends=self.resender is not None
        )
        error = waiter.error
        if self.resender is not None and error is not None and refused_with_its_batch(error):
            # Its batch may have been refused for its neighbours' size: its own send tells.
            try:
                return self.resender.send_sync(record, started)
            except IllegalStateError as exc:
                context = f"send of {record.msg_id} to {record.kafka_topic}"
                raise not_resent(error, context, exc) from exc
        result = waiter.outcome(record, self.config.send_msg_timeout_ms)
        if isinstance(result, KafkaClientError):
            raise result
        return result

    def send_records_sync(
        self, records: list[PreparedRecord], *, started: float | None = None
    ) -> list[tuple[int, int] | KafkaClientError]:
        """Send prepared records together and wait for every acknowledgement (at most
        ``send_msg_timeout_ms``); return (partition, offset) or the error, per record.
        ``started``: when the sends began, monotonic s (default now), for their cost in
        metrics. Records refused with their request batch as too large are sent again alone,
        in their order, once the others have their reports."""
        self._lifecycle.require_running()
        started = time.monotonic() if started is None else started
        resender = self.resender
        waiters = self.pump.send_and_wait(
            records, "send_records_sync", started, resends=resender is not None
        )
        timeout_ms = self.config.send_msg_timeout_ms
        results: list[tuple[int, int] | KafkaClientError] = []
        refused: list[tuple[int, KafkaError]] = []
        """The records refused with their request batch as too large: index, error."""
        for record, waiter in zip(records, waiters, strict=True):
            error = waiter.error
            if resender is not None and error is not None and refused_with_its_batch(error):
                refused.append((len(results), error))
            results.append(waiter.outcome(record, timeout_ms))
        if resender is not None and refused:
            # Their batches may have been refused for their neighbours' size: their own
            # sends tell (in their order, so a partition keeps them in order).
            again = resender.send_all_sync(
                [(records[index], error) for index, error in refused], started
            )
            for (index, _), result in zip(refused, again, strict=True):
                results[index] = result
        return results
