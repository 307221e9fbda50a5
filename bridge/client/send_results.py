"""What a send reports: :class:`SendResult`, and the delivery report handlers of the
producer's sync, async and oneway sends."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from functools import partial
from typing import Any, Final, NamedTuple, cast

from confluent_kafka import KafkaError

from bridge.codec import new_tuple
from bridge.errors import KafkaClientError, SendTimeoutError
from bridge.kafka.clients import translate_error
from bridge.message import Message
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


_SEND_OK: Final = SendStatus.SEND_OK


class SyncWaiter:
    """The delivery report of one send, waited for: :attr:`done` once it arrived (or the send
    failed before it was handed over, see :meth:`fail`), and :meth:`wait` for one thread to
    block on it. A plain lock the report releases: an ``Event`` costs both threads twice as
    much (a condition, a lock per waiter, a notification)."""

    __slots__ = ("_reported", "done", "error", "failure", "offset", "partition", "started")

    def __init__(self) -> None:
        self.started = time.monotonic()
        """When the send began, monotonic s (for ``rocketmq_send_cost_time``)."""
        self._reported = threading.Lock()
        self._reported.acquire()
        self.done = False
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
        self.done = True
        self._reported.release()

    def fail(self, failure: KafkaClientError) -> None:
        """The send failed before librdkafka took it: no report will come."""
        self.failure = failure
        self.done = True
        self._reported.release()

    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the report (one thread only); True once it
        arrived."""
        return self.done or self._reported.acquire(timeout=timeout_s)


def report_async(  # noqa: PLR0917 - the send's fields, then the report's
    msg_id: str,
    topic: str,
    kafka_topic: str,
    on_success: OnSuccess | None,
    on_exception: OnException | None,
    started: float,
    err: KafkaError | None,
    kmsg: Any,
) -> None:
    """The delivery report of one ``send_async``, bound to its send by :func:`async_report`
    (``started``: when the send began, monotonic s, for ``rocketmq_send_cost_time``): calls
    ``on_success(SendResult)`` or ``on_exception(error)``; a callback that raises is logged."""
    if active_metrics() is not None:
        record_send(started, err, kmsg)
    try:
        if err is not None:
            error = translate_error(err, f"send of {msg_id} to {kafka_topic}")
            if on_exception is not None:
                on_exception(error)
            else:
                logger.warning("async send failed: %s", error)
        elif on_success is not None:
            on_success(
                new_tuple(SendResult, (_SEND_OK, msg_id, kmsg.offset(), topic, kmsg.partition()))
            )
    except Exception:
        logger.exception("send callback for %s raised", msg_id)


AsyncReport = Callable[[KafkaError | None, Any], None]
"""The delivery report handler of one ``send_async`` (:func:`async_report`)."""


def async_report(
    msg_id: str,
    topic: str,
    kafka_topic: str,
    on_success: OnSuccess | None,
    on_exception: OnException | None,
) -> AsyncReport:
    """The delivery report handler of one ``send_async`` of ``msg_id`` starting now:
    :func:`report_async` bound to the send with ``functools.partial``, one small C object
    per message in flight (a closure would keep several objects per message alive), called
    at C speed (a tuple with ``__call__`` costs a Python-level dispatch more)."""
    return partial(
        report_async, msg_id, topic, kafka_topic, on_success, on_exception, time.monotonic()
    )


HANDLERS_KEPT: Final = 4096
"""Report handlers a :class:`BatchReports` keeps for the batches after its own, at most."""


class BatchReports:
    """The delivery reports of one ``send_batch`` at a time, each stored at its message's
    index; the producer hands it to its next batch once every message of this one has an
    outcome (:meth:`begin`).

    The report handler of message ``index`` is ``functools.partial(reports.report, index)``:
    one small C object, made once and kept (:attr:`handlers`, the first
    :data:`HANDLERS_KEPT`) for the batches after. A new handler per message and batch kept
    two objects per message in flight (the partial and its arguments): a batch of thousands
    set off the garbage collector several times, and each time it walked them all.
    """

    __slots__ = ("handlers", "kafka_topics", "msg_ids", "msgs", "outcomes", "started")

    def __init__(self) -> None:
        self.handlers: list[Callable[[KafkaError | None, Any], None]] = []
        """The report handler of each message index below :data:`HANDLERS_KEPT`."""
        self.begin((), None)

    def begin(self, msgs: Sequence[Message], started: float | None) -> None:
        """Take the reports of a new batch, ``msgs`` (``started``: when it was handed over,
        monotonic s, when metrics record send costs)."""
        count = len(msgs)
        self.msgs = msgs
        """The messages sent, for the topics as the caller named them."""
        self.msg_ids = [""] * count
        self.kafka_topics = [""] * count
        """Where each record went (set as it is handed over)."""
        self.started = started
        self.outcomes: list[SendResult | KafkaError | KafkaClientError | None] = [None] * count
        """Per message: its result once stored, librdkafka's error, a refusal before
        librdkafka took it, or None while no report came."""
        handlers = self.handlers
        kept = min(count, HANDLERS_KEPT)
        if len(handlers) < kept:
            report = self.report
            handlers.extend(partial(report, index) for index in range(len(handlers), kept))

    def handler(self, index: int) -> Callable[[KafkaError | None, Any], None]:
        """The report handler of message ``index``."""
        handlers = self.handlers
        return handlers[index] if index < len(handlers) else partial(self.report, index)

    def report(self, index: int, err: KafkaError | None, kmsg: Any) -> None:
        """The delivery report of message ``index``."""
        if self.started is not None:
            record_send(self.started, err, kmsg)
        if err is None:
            offset = kmsg.offset()
            self.outcomes[index] = new_tuple(
                SendResult,
                (
                    _SEND_OK,
                    self.msg_ids[index],
                    -1 if offset is None else offset,
                    self.msgs[index].topic,
                    kmsg.partition(),
                ),
            )
        else:
            self.outcomes[index] = err

    def reported(self, start: int) -> int:
        """The index of the first message from ``start`` on without an outcome (the count
        when every one has one)."""
        outcomes = self.outcomes
        count = len(outcomes)
        while start < count and outcomes[start] is not None:
            start += 1
        return start

    def results(self, timeout_ms: int) -> list[SendResult | KafkaClientError]:
        """Each message's :class:`SendResult` or error, in order; a message without a report
        fails with :class:`SendTimeoutError` (no acknowledgement within ``timeout_ms``)."""
        out: list[SendResult | KafkaClientError] = []
        append = out.append
        msg_ids = self.msg_ids
        for index, outcome in enumerate(self.outcomes):
            if type(outcome) is SendResult or isinstance(outcome, KafkaClientError):
                append(outcome)
            else:
                context = f"send of {msg_ids[index]} to {self.kafka_topics[index]}"
                if outcome is None:
                    append(
                        SendTimeoutError(
                            f"{context}: no acknowledgement within {timeout_ms} ms (it may "
                            "still be delivered)"
                        )
                    )
                else:  # librdkafka's error
                    append(translate_error(cast(KafkaError, outcome), context))
        return out


def log_oneway_failure(err: KafkaError | None, kmsg: Any) -> None:
    """The delivery report handler of a oneway send: a failure is only logged."""
    record_send(None, err, kmsg)
    if err is not None:
        logger.warning("oneway send to %s failed: %s", kmsg.topic(), err.str())
