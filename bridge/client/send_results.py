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

from bridge.codec import PreparedRecord, RecordFields, new_tuple
from bridge.errors import KafkaClientError, SendError, SendTimeoutError
from bridge.kafka.clients import translate_error
from bridge.message import Message
from bridge.observability.metrics import active_metrics, message_type

logger = logging.getLogger(__name__)

OnSuccess = Callable[["SendResult"], None]
OnException = Callable[[Exception], None]
Report = Callable[[KafkaError | None, Any], None]
"""A delivery report handler: ``(KafkaError | None, confluent_kafka.Message)``."""
ResendAlone = Callable[[PreparedRecord, Report], None]
"""Sends a record again in a request batch of its own, with its report handler; raises when
it cannot hand the record over (``AloneResender.resend``)."""
Headers = Sequence[tuple[str, bytes | None]]

_TOO_LARGE: Final = KafkaError.MSG_SIZE_TOO_LARGE


def refused_with_its_batch(err: KafkaError) -> bool:
    """True if a delivery report's ``err`` is the broker refusing the record's request batch
    as larger than the topic's ``max.message.bytes`` (MSG_SIZE_TOO_LARGE). librdkafka puts
    several records in one batch, and the broker refuses the batch as a whole: the size may
    be the neighbours' (or all of theirs together), and only the record sent in a batch of
    its own tells."""
    return err.code() == _TOO_LARGE


def failed_record(kmsg: Any, headers: Headers, msg_id: str, born_ms: int) -> PreparedRecord:
    """The record of failed delivery report ``kmsg`` (its topic, key, value and the
    partition it was placed in; a report does not carry the headers nor the timestamp),
    to send it again."""
    partition = kmsg.partition()
    return new_tuple(
        PreparedRecord,
        (
            kmsg.topic(),
            kmsg.key(),
            kmsg.value(),
            headers,
            msg_id,
            born_ms,
            -1 if partition is None or partition < 0 else partition,
        ),
    )


def not_resent(err: KafkaError, context: str, exc: Exception) -> SendError:
    """The error of a record refused with its request batch (``err``) that could not be sent
    again alone (``exc``: why)."""
    return SendError(
        f"{context}: {err.str()} ({err.name()}), refused with its request batch, and not sent "
        f"again alone: {exc}",
        err,
    )


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


def record_send_failure(started: float, kafka_topic: str) -> None:
    """Record in the active metrics, if any, a send to ``kafka_topic`` begun at ``started``
    (monotonic s) that failed without a report saying so last: one refused with its request
    batch that could not be sent again alone."""
    metrics = active_metrics()
    if metrics is None:
        return
    try:
        cost_ms = (time.monotonic() - started) * 1000
        metrics.send_cost.labels(metrics.namespace, kafka_topic, "failure").observe(cost_ms)
    except Exception:  # metrics never fail a send
        logger.debug("send not recorded in metrics", exc_info=True)


class SendStatus(Enum):
    """RocketMQ's ``SendStatus``. With ``acks=all`` a stored message is always SEND_OK."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class SendResult(NamedTuple):
    """Where a sent message was stored: ``queue_id`` is the partition, ``offset`` the offset.
    ``recall_handle`` (RocketMQ 5.3's): for a timer message, the handle that
    ``recall_message(topic, recall_handle)`` takes to recall it before its time; None for
    other messages (see ``docs/delays.md``)."""

    status: SendStatus
    msg_id: str
    offset: int
    topic: str
    queue_id: int
    recall_handle: str | None = None


_SEND_OK: Final = SendStatus.SEND_OK


class SyncWaiter:
    """The delivery report of one send, waited for: :attr:`done` once it arrived (or the send
    failed before it was handed over, see :meth:`fail`), and :meth:`wait` for one thread to
    block on it. A plain lock the report releases: an ``Event`` costs both threads twice as
    much (a condition, a lock per waiter, a notification)."""

    __slots__ = (
        "_reported",
        "_resends",
        "done",
        "error",
        "failure",
        "offset",
        "partition",
        "started",
    )

    def __init__(self, started: float | None = None, *, resends: bool = False) -> None:
        self.started = time.monotonic() if started is None else started
        """When the send began, monotonic s (for ``rocketmq_send_cost_time``): now, or the
        first send's time for a record sent again alone."""
        self._resends = resends
        """True if a refusal with the request batch is sent again alone: that report is not
        the send's outcome, so it is not recorded (the sender records the outcome)."""
        self._reported = threading.Lock()
        self._reported.acquire()
        self.done = False
        self.error: KafkaError | None = None
        self.failure: KafkaClientError | None = None
        self.partition = -1
        self.offset = -1

    def __call__(self, err: KafkaError | None, kmsg: Any) -> None:
        if err is None or not self._resends or err.code() != _TOO_LARGE:
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

    def outcome(
        self, record: PreparedRecord, timeout_ms: int
    ) -> tuple[int, int] | KafkaClientError:
        """What the send of ``record`` came to: (partition, offset), or its error
        (:class:`SendTimeoutError` while no report came: none within ``timeout_ms``)."""
        if self.failure is not None:
            return self.failure
        context = f"send of {record.msg_id} to {record.kafka_topic}"
        if not self.done:
            return SendTimeoutError(f"{context}: no acknowledgement within {timeout_ms} ms")
        if self.error is not None:
            return translate_error(self.error, context)
        return self.partition, self.offset


def report_async(  # noqa: PLR0917 - the send's fields, then the report's
    resend: ResendAlone | None,
    headers: Headers,
    born_ms: int,
    msg_id: str,
    topic: str,
    kafka_topic: str,
    recall_handle: str | None,
    on_success: OnSuccess | None,
    on_exception: OnException | None,
    started: float,
    err: KafkaError | None,
    kmsg: Any,
) -> None:
    """The delivery report of one ``send_async``, bound to its send by :func:`async_report`
    (``started``: when the send began, monotonic s, for ``rocketmq_send_cost_time``): calls
    ``on_success(SendResult)`` or ``on_exception(error)``, once; a callback that raises is
    logged.

    A record the broker refused with its request batch as too large is sent again alone
    first with ``resend`` (``headers`` and ``born_ms``: its own, which a report lacks), and
    that send's report is the one the callbacks get; ``resend`` None: it was sent alone."""
    not_sent_again: KafkaClientError | None = None
    if err is not None and resend is not None and err.code() == _TOO_LARGE:
        again = partial(
            report_async,
            None,
            headers,
            born_ms,
            msg_id,
            topic,
            kafka_topic,
            recall_handle,
            on_success,
            on_exception,
            started,
        )
        try:
            resend(failed_record(kmsg, headers, msg_id, born_ms), again)
            return
        except Exception as exc:  # not taken (shut down, queue full): this report says so
            not_sent_again = not_resent(err, f"send of {msg_id} to {kafka_topic}", exc)
    if active_metrics() is not None:
        record_send(started, err, kmsg)
    try:
        if err is not None:
            error = not_sent_again or translate_error(err, f"send of {msg_id} to {kafka_topic}")
            if on_exception is not None:
                on_exception(error)
            else:
                logger.warning("async send failed: %s", error)
        elif on_success is not None:
            on_success(
                new_tuple(
                    SendResult,
                    (_SEND_OK, msg_id, kmsg.offset(), topic, kmsg.partition(), recall_handle),
                )
            )
    except Exception:
        logger.exception("send callback for %s raised", msg_id)


AsyncReport = Report
"""The delivery report handler of one ``send_async`` (:func:`async_report`)."""


def async_report(
    record: PreparedRecord,
    topic: str,
    on_success: OnSuccess | None,
    on_exception: OnException | None,
    resend: ResendAlone | None = None,
    *,
    recall_handle: str | None = None,
) -> AsyncReport:
    """The delivery report handler of one ``send_async`` of ``record`` (to ``topic``, as the
    caller named it) starting now: :func:`report_async` bound to the send with
    ``functools.partial``, one small C object per message in flight (a closure would keep
    several objects per message alive), called at C speed (a tuple with ``__call__`` costs a
    Python-level dispatch more). ``resend``: how to send the record again alone when its
    request batch is refused as too large (``AloneResender.resend``); None: not sent again.
    ``recall_handle``: the send's (a timer message's, see
    :func:`bridge.client.recall.recall_handle`), in its :class:`SendResult`."""
    return partial(
        report_async,
        resend,
        record.headers,
        record.born_timestamp_ms,
        record.msg_id,
        topic,
        record.kafka_topic,
        recall_handle,
        on_success,
        on_exception,
        time.monotonic(),
    )


_NOT_HANDED_OVER: Final[RecordFields] = ("", None, None, (), "", 0, -1)
"""The record of a batch's message in :class:`BatchReports` until it is handed over."""
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

    __slots__ = (
        "failed",
        "handlers",
        "msgs",
        "outcomes",
        "recall_handles",
        "records",
        "started",
        "too_large",
    )

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
        self.recall_handles: list[str | None] = [None] * count
        """Each timer message's recall handle (set as it is handed over)."""
        self.records: list[RecordFields] = [_NOT_HANDED_OVER] * count
        """Each message's record as handed over (set then): its id and Kafka topic for its
        outcome, and all of it to send it again alone (a report carries no headers)."""
        self.too_large: list[int] = []
        """Indexes of the messages refused with their request batch as too large
        (:func:`refused_with_its_batch`), in the order the reports came."""
        self.started = started
        self.failed = False
        """Whether a report brought librdkafka's error (set, never counted: reports may be
        served on two threads at once)."""
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
        """The delivery report of message ``index``. A refusal with the request batch is
        not recorded here: the message is sent again alone, or its sender records the
        failure."""
        if self.started is not None and (err is None or err.code() != _TOO_LARGE):
            record_send(self.started, err, kmsg)
        if err is None:
            offset = kmsg.offset()
            self.outcomes[index] = new_tuple(
                SendResult,
                (
                    _SEND_OK,
                    self.records[index][4],
                    -1 if offset is None else offset,
                    self.msgs[index].topic,
                    kmsg.partition(),
                    self.recall_handles[index],
                ),
            )
        else:
            self.outcomes[index] = err
            self.failed = True
            if err.code() == _TOO_LARGE:
                self.too_large.append(index)

    def reported(self, start: int) -> int:
        """The index of the first message from ``start`` on without an outcome (the count
        when every one has one)."""
        outcomes = self.outcomes
        count = len(outcomes)
        while start < count and outcomes[start] is not None:
            start += 1
        return start

    def results(
        self, timeout_ms: int, *, complete: bool = False
    ) -> list[SendResult | KafkaClientError]:
        """Each message's :class:`SendResult` or error, in order; a message without a report
        fails with :class:`SendTimeoutError` (no acknowledgement within ``timeout_ms``).
        ``complete``: every message has its outcome (no report is missing)."""
        if complete and not self.failed:
            # Every outcome is a result or the project's error already: the list as it is,
            # without a step a message (python -m bench producer, send_batch's CPU a message).
            return cast("list[SendResult | KafkaClientError]", list(self.outcomes))
        out: list[SendResult | KafkaClientError] = []
        append = out.append
        records = self.records
        for index, outcome in enumerate(self.outcomes):
            if type(outcome) is SendResult or isinstance(outcome, KafkaClientError):
                append(outcome)
            else:
                record = records[index]
                context = f"send of {record[4]} to {record[0]}"
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


def report_oneway(
    resend: ResendAlone, record: PreparedRecord, err: KafkaError | None, kmsg: Any
) -> None:
    """The delivery report handler of a oneway send of ``record`` that is sent again alone
    with ``resend`` when its request batch is refused as too large
    (:func:`log_oneway_failure` otherwise)."""
    if err is not None and err.code() == _TOO_LARGE:
        try:
            resend(
                failed_record(kmsg, record.headers, record.msg_id, record.born_timestamp_ms),
                log_oneway_failure,
            )
            return
        except Exception as exc:
            record_send(None, err, kmsg)
            logger.warning(
                "oneway send to %s failed: %s",
                kmsg.topic(),
                not_resent(err, f"send of {record.msg_id}", exc),
            )
            return
    log_oneway_failure(err, kmsg)
