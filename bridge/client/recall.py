"""The producer's side of recall (RocketMQ 5.3's ``recall_message``): the recall handle of a
timer message's send, and the recall marker written to the namespace's recall topic. The rule
both sides follow is :func:`bridge.delay.recall.recall_applies`; what the coordinator does with
a marker is in :mod:`bridge.coordinator.delay.recall_watch`."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Final

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError

from bridge.client.delivery import SYNC_FLUSH_SLICE_S, DeliveryPump
from bridge.codec import PreparedRecord, last_message_header
from bridge.config import ClientConfig
from bridge.delay.recall import (
    RECALL_MARGIN_MS,
    RecallHandle,
    decode_handle,
    encode_handle,
    marker_headers,
    marker_key,
    recall_applies,
)
from bridge.delay.routing import TIMER_ROUTING_HEADER
from bridge.errors import (
    InvalidArgumentError,
    RecallTooLateError,
    SendTimeoutError,
    TopicProvisioningError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import translate_error
from bridge.message import now_ms
from bridge.observability.metrics import active_metrics
from topics.catalog import SystemTopic
from topics.naming import system_topic

__all__ = ["Recaller", "recall_handle"]

logger = logging.getLogger(__name__)

_GRACE_S: Final = 1.0
"""How long past ``send_msg_timeout_ms`` a recall waits for its marker's report, s."""
_REMEMBERED: Final = 10_000
"""At most this many recalls of a producer are remembered (the latest), to answer a recall of
the same handle made again (see :meth:`Recaller.recall`)."""


@functools.lru_cache(maxsize=64)
def _timer_topic(namespace: str) -> str:
    return system_topic(SystemTopic.TIMER.value, namespace)


def recall_handle(record: PreparedRecord, topic: str, namespace: str) -> str | None:
    """The recall handle of the send of ``record`` (to ``topic``, as the producer named it,
    in ``namespace``): for a record of the timer topic, the handle naming its message id and
    ``TIMER_DELIVER_MS``; None for every other record (a plain message, a timer already due
    when sent, a delay level: see ``docs/delays.md``)."""
    if record.kafka_topic != _timer_topic(namespace):
        return None
    raw = last_message_header(record.headers, TIMER_ROUTING_HEADER)
    if raw is None:
        return None
    return encode_handle(RecallHandle(namespace, topic, record.msg_id, int(raw)))


class _Report:
    """The delivery report of one marker: its error, or its broker timestamp."""

    __slots__ = ("done", "error", "timestamp", "timestamp_type")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: KafkaError | None = None
        self.timestamp = 0
        self.timestamp_type = 0

    def __call__(self, err: KafkaError | None, kmsg: Any) -> None:
        self.error = err
        if err is None:
            self.timestamp_type, self.timestamp = kmsg.timestamp()
        self.done.set()


class Recaller:
    """Writes recall markers through a producer's ``pump`` (its idempotent ``acks=all``
    Kafka producer): :meth:`recall`."""

    def __init__(self, config: ClientConfig, pump: DeliveryPump) -> None:
        self._config = config
        self._pump = pump
        catalog = config.catalog()
        self._spec = catalog.spec(SystemTopic.RECALL)
        self._topic_ready = False
        self._lock = threading.Lock()
        self._known: OrderedDict[tuple[str, int], _Report | None] = OrderedDict()
        """(message id, due ms) of this producer's earlier recalls: None for one that applied,
        else the report of a marker whose write timed out (it may still be stored)."""

    def _ensure_topic(self) -> None:
        with self._lock:
            if not self._topic_ready:
                TopicAdmin(self._config).ensure_topics([self._spec])
                self._topic_ready = True

    def recall(self, topic: str, handle: str) -> str:
        """Recall the timer message of ``handle`` (sent to ``topic``): return its message id
        once it is certain never to be delivered.

        Raises :class:`InvalidArgumentError` for a handle that is malformed, of another
        namespace or of another topic; :class:`RecallTooLateError` when the broker stored the
        recall less than :data:`~bridge.delay.recall.RECALL_MARGIN_MS` before the message's
        time (it is then delivered exactly once, or was, unless another producer's recall of
        it applied: a recall this producer made before, or whose write timed out, is
        remembered and answers instead); a
        :class:`~bridge.errors.SendError` (:class:`SendTimeoutError`: unknown whether it was
        stored) when the marker was not stored: the recall may then be made again with the
        same handle."""
        if not isinstance(topic, str) or not topic:
            raise InvalidArgumentError(f"recall_message: topic must be a topic name, got {topic!r}")
        parsed = decode_handle(handle)
        namespace = self._config.namespace
        if parsed.namespace != namespace:
            raise InvalidArgumentError(
                f"the recall handle is of namespace {parsed.namespace!r}, this producer's is "
                f"{namespace!r}"
            )
        if parsed.topic != topic:
            raise InvalidArgumentError(
                f"the recall handle is of a message of topic {parsed.topic!r}, not {topic!r}"
            )
        if self._recalled_before(parsed):
            # An earlier recall of this producer stored a marker that applies: the message is
            # never delivered, however near its time is now.
            self._count("recalled")
            return parsed.message_id
        born = now_ms()
        if born >= parsed.due_ms - RECALL_MARGIN_MS:
            # By this clock it cannot apply: no marker, so the coordinator delivers it.
            self._count("too_late")
            raise RecallTooLateError(
                f"recall of {parsed.message_id} too late: due at {parsed.due_ms}, now "
                f"{born} (a recall must be stored at least {RECALL_MARGIN_MS} ms before); it "
                "is delivered exactly once (unless a recall of it from another producer "
                "applied)",
                message_id=parsed.message_id,
                due_ms=parsed.due_ms,
                append_ms=born,
            )
        if not self._topic_ready:
            self._ensure_topic()
        append_ms = self._write(parsed, born)
        if not recall_applies(append_ms, parsed.due_ms):
            self._count("too_late")
            raise RecallTooLateError(
                f"recall of {parsed.message_id} too late: the broker stored it at {append_ms}, "
                f"less than {RECALL_MARGIN_MS} ms before its time {parsed.due_ms}; it is "
                "delivered exactly once (unless a recall of it from another producer applied)",
                message_id=parsed.message_id,
                due_ms=parsed.due_ms,
                append_ms=append_ms,
            )
        self._remember((parsed.message_id, parsed.due_ms), None)
        self._count("recalled")
        return parsed.message_id

    def _remember(self, key: tuple[str, int], report: _Report | None) -> None:
        with self._lock:
            if key in self._known and self._known[key] is None:
                return  # applied already: stays so
            self._known[key] = report
            self._known.move_to_end(key)
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)

    def _recalled_before(self, handle: RecallHandle) -> bool:
        """Whether an earlier recall of ``handle`` by this producer stored a marker that
        applies; waits up to the send timeout for the report of one whose write timed out."""
        key = (handle.message_id, handle.due_ms)
        with self._lock:
            if key not in self._known:
                return False
            report = self._known[key]
        if report is None:
            return True
        self._pump.refuse_waiting_in_a_callback("recall_message")
        deadline = time.monotonic() + self._config.send_msg_timeout_ms / 1000 + _GRACE_S
        while not report.done.is_set() and time.monotonic() < deadline:
            self._pump.flush(min(max(deadline - time.monotonic(), 0.0), SYNC_FLUSH_SLICE_S))
        applied = (
            report.done.is_set()
            and report.error is None
            and report.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
            and recall_applies(report.timestamp, handle.due_ms)
        )
        if applied:
            self._remember(key, None)
        return applied

    def _write(self, handle: RecallHandle, born: int) -> int:
        """Store the marker of ``handle`` and return the broker's append time of it, epoch
        ms."""
        record = PreparedRecord(
            self._spec.kafka_name,
            marker_key(handle.message_id),
            None,
            marker_headers(handle),
            handle.message_id,
            born,
            0,
        )
        context = f"recall marker of {handle.message_id}"
        pump = self._pump
        pump.refuse_waiting_in_a_callback("recall_message")
        report = _Report()
        pump.produce(record, 0, report)
        deadline = time.monotonic() + self._config.send_msg_timeout_ms / 1000 + _GRACE_S
        while not report.done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Its report may still come: a recall made again with the handle looks at it.
                self._remember((handle.message_id, handle.due_ms), report)
                raise SendTimeoutError(
                    f"{context}: no acknowledgement within {self._config.send_msg_timeout_ms} "
                    "ms (it may still be stored: recall again with the same handle)"
                )
            pump.flush(min(remaining, SYNC_FLUSH_SLICE_S))
        if report.error is not None:
            raise translate_error(report.error, context)
        if report.timestamp_type != TIMESTAMP_LOG_APPEND_TIME:
            # The coordinator checks the topic at start and refuses it; a topic changed
            # since cannot tell when the broker stored the marker.
            raise TopicProvisioningError(
                f"{context}: {self._spec.kafka_name} does not stamp records with the broker's "
                "clock (message.timestamp.type must be LogAppendTime)"
            )
        return int(report.timestamp)

    def _count(self, outcome: str) -> None:
        metrics = active_metrics()
        if metrics is not None:
            metrics.recalls.labels(self._config.namespace, outcome).inc()
