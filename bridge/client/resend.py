"""The resender of records refused with their request batch: :class:`AloneResender`.

librdkafka puts several records of a partition in one request batch, and a broker refuses a
batch larger than the topic's ``max.message.bytes`` as a whole (MSG_SIZE_TOO_LARGE for every
record in it; librdkafka does not split it, as the Java client does). A record refused that
way is sent again once, alone, through a second Kafka producer that puts each record in a
batch of its own (``batch.num.messages=1``, made on the first such refusal): only a record the
topic refuses alone fails.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import KafkaError

from bridge.client.delivery import DeliveryPump
from bridge.client.send_results import Report, not_resent, record_send_failure
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, KafkaClientError

logger = logging.getLogger(__name__)


def sends_alone(config: ClientConfig) -> bool:
    """True if a producer made with ``config`` puts every record in a request batch of its
    own (``batch.num.messages=1``), so a refusal of its batch is the record's own."""
    return str(config.kafka.get("batch.num.messages", "")).strip() == "1"


class AloneResender:
    """Sends records refused with their request batch as too large again, each in a request
    batch of its own, through a second :class:`DeliveryPump` made when first needed with
    ``config`` and ``batch.num.messages=1``; ``group`` names it (its client id: the user's
    ``client.id``, or the group, then ``-alone``). :meth:`close` after the first producer's
    reports were served (they may send records again)."""

    def __init__(self, config: ClientConfig, group: str) -> None:
        self._config = config
        self._group = group
        self._pump: DeliveryPump | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._refused_topics: set[str] = set()
        """Kafka topics a refusal of a request batch was logged for (once each)."""

    def _alone_pump(self) -> DeliveryPump:
        """The pump that puts each record in a request batch of its own, started when first
        asked for. Raises :class:`IllegalStateError` once closed."""
        with self._lock:
            if self._closed:
                raise IllegalStateError(f"producer {self._group} is shut down")
            if self._pump is None:
                # A client.id of its own: the two clients' librdkafka statistics would
                # otherwise write the same series.
                client_id = str(self._config.kafka.get("client.id") or self._group)
                kafka = {
                    **self._config.kafka,
                    "batch.num.messages": "1",
                    "client.id": f"{client_id}-alone",
                }
                pump = DeliveryPump(self._config.replace(kafka=kafka), self._group, self._group)
                pump.start()
                self._pump = pump
            return self._pump

    def _refused(self, kafka_topic: str) -> DeliveryPump:
        """The pump to send a record of ``kafka_topic`` again alone with, after the broker
        refused its request batch as too large."""
        self._note(kafka_topic)
        return self._alone_pump()

    def _note(self, kafka_topic: str) -> None:
        """Log the first refusal of a request batch as too large on ``kafka_topic``: it says
        the topic takes less than librdkafka puts in one batch."""
        if kafka_topic not in self._refused_topics:
            self._refused_topics.add(kafka_topic)
            logger.warning(
                "producer %s: %s refused a request batch as too large (its max.message.bytes "
                "is below what librdkafka put in one batch); its records refused that way are "
                "sent again one per batch",
                self._group,
                kafka_topic,
            )

    def resend(self, record: PreparedRecord, report: Report) -> None:
        """Send ``record`` again in a batch of its own (to ``record.partition``); ``report``
        gets that send's delivery report. Raises when the record is not taken (closed, the
        local queue stayed full)."""
        self.resend_to(record, record.partition, report)

    def resend_to(self, record: PreparedRecord, partition: int, report: Report) -> None:
        """:meth:`resend` to ``partition`` (-1: the key decides)."""
        pump = self._refused(record.kafka_topic)
        pump.produce(record, partition, report)
        try:
            pump.serve_reports()
        except Exception:
            logger.exception("producer %s: a delivery report callback raised", self._group)

    def send_sync(self, record: PreparedRecord, started: float) -> tuple[int, int]:
        """Send ``record`` again alone and wait for it (``started``: when its first send
        began, monotonic s): (partition, offset), or the error raised."""
        try:
            pump = self._refused(record.kafka_topic)
        except IllegalStateError:
            record_send_failure(started, record.kafka_topic)
            raise
        [waiter] = pump.send_and_wait([record], "send_sync", started, resends=False)
        result = waiter.outcome(record, self._config.send_msg_timeout_ms)
        if isinstance(result, KafkaClientError):
            raise result
        return result

    def send_all_sync(
        self, refused: list[tuple[PreparedRecord, KafkaError]], started: float
    ) -> list[tuple[int, int] | KafkaClientError]:
        """Send the records of ``refused`` (each with the refusal of its request batch) again
        each alone, in order, and wait for them: (partition, offset) or the error, per
        record. ``started``: when their first sends began, monotonic s; each send's cost in
        metrics runs from there to its last outcome."""
        for record, _ in refused:
            self._note(record.kafka_topic)
        try:
            pump = self._alone_pump()
        except IllegalStateError as exc:
            for record, _ in refused:
                record_send_failure(started, record.kafka_topic)
            return [
                not_resent(error, f"send of {record.msg_id} to {record.kafka_topic}", exc)
                for record, error in refused
            ]
        records = [record for record, _ in refused]
        waiters = pump.send_and_wait(records, "send_records_sync", started, resends=False)
        timeout_ms = self._config.send_msg_timeout_ms
        return [
            waiter.outcome(record, timeout_ms)
            for record, waiter in zip(records, waiters, strict=True)
        ]

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` (s) for the records sent again; how many are still
        unacknowledged."""
        pump = self._pump
        return 0 if pump is None else pump.flush(timeout_s)

    def close(self, timeout_ms: int) -> None:
        """Take no more records; wait up to ``timeout_ms`` for those sent again, then stop."""
        with self._lock:
            self._closed = True
            pump = self._pump
        if pump is None:
            return
        remaining = pump.flush(timeout_ms / 1000)
        if remaining:
            logger.warning(
                "producer %s: %d messages still unacknowledged at shutdown", self._group, remaining
            )
        pump.stop()
