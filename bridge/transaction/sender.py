"""The Kafka producer of a :class:`~bridge.transaction.producer.TransactionMQProducer`: half
messages, waited for, and end requests, not waited for (RocketMQ sends them one way).

A transactional send waits for its half message's acknowledgement before the local
transaction runs, so it is latency that counts here, not batching: records go out at once
(``linger.ms`` 0), and a delivery thread blocked in ``poll`` serves each report as it
arrives, so a sender wakes as soon as its own half message is stored. (``flush`` would wait
for every record in flight, the other threads' end requests among them.)

Sends are idempotent and ``acks=all``, bounded by ``send_msg_timeout_ms``, with the errors of
:class:`~bridge.client.producer.Producer` (:func:`~bridge.kafka.clients.translate_error`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from bridge.client.send_results import SyncWaiter
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import SendTimeoutError
from bridge.kafka.clients import new_producer, produce_record, translate_error
from bridge.lifecycle import Lifecycle, ServiceState

logger = logging.getLogger(__name__)

_REPORT_WAIT_S: Final = 0.1
"""How long the delivery thread waits in one ``poll`` for a report, s (it returns at once
when one arrives; this only bounds how late it sees the stop flag)."""
_FULL_QUEUE_WAIT_S: Final = 0.01
"""Wait between tries while librdkafka's local queue is full, s."""


class HalfSender:
    """Sends the records of one transactional producer: ``send_sync`` (the half message) and
    ``send_async`` (an end request). ``start()`` before, ``shutdown()`` after."""

    def __init__(self, config: ClientConfig, client_id: str) -> None:
        self._config = config
        self._client_id = client_id
        self._lifecycle = Lifecycle(f"producer {client_id}")
        self._kafka: Any = None
        self._stop = threading.Event()
        self._reports: threading.Thread | None = None

    def metadata(self) -> Any:
        """The confluent-kafka producer, whose metadata gives partition counts (None before
        :meth:`start`)."""
        return self._kafka

    def start(self) -> None:
        """Create the Kafka producer and its delivery thread. May be called once."""
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            self._kafka = new_producer(self._config, client_id=self._client_id, linger_ms=0)
        except BaseException:
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        self._reports = threading.Thread(
            target=self._serve_reports, name=f"bridge-txn-sender-{self._client_id}", daemon=True
        )
        self._reports.start()

    def shutdown(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for the records in flight, then stop the delivery thread;
        sends raise :class:`~bridge.errors.IllegalStateError` from then on. Idempotent."""
        kafka = self._kafka
        if self._lifecycle.state is not ServiceState.RUNNING or kafka is None:
            if self._lifecycle.state is ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            return
        remaining = kafka.flush(timeout_ms / 1000)
        if remaining:
            logger.warning(
                "transaction producer %s: %d records still unacknowledged at shutdown",
                self._client_id,
                remaining,
            )
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        self._stop.set()
        if self._reports is not None:
            self._reports.join()

    def _serve_reports(self) -> None:
        kafka = self._kafka
        while not self._stop.is_set():
            try:
                kafka.poll(_REPORT_WAIT_S)
            except Exception:  # a thread that died would leave every send to time out
                logger.exception("%s: serving delivery reports failed", self._client_id)

    def _produce(self, record: PreparedRecord, partition: int, callback: Any) -> None:
        self._lifecycle.require_running()
        # A full local queue: the delivery thread drains it, within the send timeout.
        produce_record(
            self._kafka,
            record,
            partition,
            callback,
            timeout_ms=self._config.send_msg_timeout_ms,
            wait_full=lambda: self._stop.wait(_FULL_QUEUE_WAIT_S),
        )

    def send_sync(self, record: PreparedRecord, partition: int) -> tuple[int, int]:
        """Send ``record`` and wait for its acknowledgement (at most ``send_msg_timeout_ms``
        and a second for the report); return (partition, offset). Raises
        :class:`~bridge.errors.SendError` (:class:`SendTimeoutError` on timeout)."""
        waiter = SyncWaiter()
        self._produce(record, partition, waiter)
        # librdkafka fails the record after message.timeout.ms; the extra second is for its
        # report to arrive.
        if not waiter.wait(self._config.send_msg_timeout_ms / 1000 + 1.0):
            raise SendTimeoutError(
                f"send of {record.msg_id} to {record.kafka_topic}: no acknowledgement "
                f"within {self._config.send_msg_timeout_ms} ms"
            )
        if waiter.error is not None:
            raise translate_error(waiter.error, f"send of {record.msg_id} to {record.kafka_topic}")
        return waiter.partition, waiter.offset

    def send_async(self, record: PreparedRecord, partition: int, callback: Any) -> None:
        """Send ``record`` without waiting; ``callback(err, kafka_message)`` gets its report
        on the delivery thread."""
        self._produce(record, partition, callback)
