"""What a send reports: :class:`SendResult`, and the delivery report handlers of the
producer's sync, async and oneway sends."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

from confluent_kafka import KafkaError

from bridge.codec import new_tuple
from bridge.errors import KafkaClientError
from bridge.kafka.clients import translate_error
from bridge.observability.metrics import active_metrics, message_type

logger = logging.getLogger(__name__)

OnSuccess = Callable[["SendResult"], None]
OnException = Callable[[Exception], None]


def record_send(started: float | None, err: KafkaError | None, kmsg: Any) -> None:
    """Record a delivery report in the active metrics, if any: the send's cost (``started``:
    monotonic s when it was handed to Kafka; None: not measured) and, when stored, the
    message and its bytes."""
    metrics = active_metrics()
    if metrics is None:
        return
    try:
        topic = kmsg.topic() or ""
        namespace = metrics.namespace
        if started is not None:
            status = "failure" if err is not None else "success"
            cost_ms = (time.monotonic() - started) * 1000
            metrics.send_cost.labels(namespace, topic, status).observe(cost_ms)
        if err is None:
            kind = message_type(topic)
            metrics.messages_in.labels(namespace, topic, kind).inc()
            metrics.throughput_in.labels(namespace, topic, kind).inc(len(kmsg))
    except Exception:  # metrics never fail a send
        logger.debug("send not recorded in metrics", exc_info=True)


class SendStatus(Enum):
    """RocketMQ's ``SendStatus``. With ``acks=all`` a stored message is always SEND_OK."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class SendResult(NamedTuple):
    """Where a sent message was stored: ``queue_id`` is the partition, ``offset`` the offset."""

    status: SendStatus
    msg_id: str
    offset: int
    topic: str
    queue_id: int


class SyncWaiter:
    """The delivery report of one sync send, waited for."""

    __slots__ = ("error", "event", "failure", "offset", "partition", "started")

    def __init__(self) -> None:
        self.started = time.monotonic()
        """When the send began, monotonic s (for ``rocketmq_send_cost_time``)."""
        self.event = threading.Event()
        self.error: KafkaError | None = None
        self.failure: KafkaClientError | None = None
        self.partition = -1
        self.offset = -1

    def __call__(self, err: KafkaError | None, kmsg: Any) -> None:
        record_send(self.started, err, kmsg)
        if err is not None:
            self.error = err
        else:
            self.partition = kmsg.partition()
            self.offset = kmsg.offset()
        self.event.set()


class AsyncReport:
    """The delivery report handler of one ``send_async``.

    One small object per message in flight and nothing else: confluent-kafka keeps it until
    the report arrives, and a closure (function, cells, captured record) would keep several
    objects per message alive for the garbage collector to walk through.
    """

    __slots__ = ("kafka_topic", "msg_id", "on_exception", "on_success", "started", "topic")

    def __init__(
        self,
        msg_id: str,
        topic: str,
        kafka_topic: str,
        on_success: OnSuccess | None,
        on_exception: OnException | None,
    ) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.kafka_topic = kafka_topic
        self.on_success = on_success
        self.on_exception = on_exception
        self.started = time.monotonic()

    def __call__(self, err: KafkaError | None, kmsg: Any) -> None:
        record_send(self.started, err, kmsg)
        try:
            if err is not None:
                error = translate_error(err, f"send of {self.msg_id} to {self.kafka_topic}")
                if self.on_exception is not None:
                    self.on_exception(error)
                else:
                    logger.warning("async send failed: %s", error)
            elif self.on_success is not None:
                stored = (SendStatus.SEND_OK, self.msg_id, kmsg.offset(), self.topic)
                self.on_success(new_tuple(SendResult, (*stored, kmsg.partition())))
        except Exception:
            logger.exception("send callback for %s raised", self.msg_id)


def log_oneway_failure(err: KafkaError | None, kmsg: Any) -> None:
    """The delivery report handler of a oneway send: a failure is only logged."""
    record_send(None, err, kmsg)
    if err is not None:
        logger.warning("oneway send to %s failed: %s", kmsg.topic(), err.str())
