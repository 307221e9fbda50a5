"""Moving a record a push consumer cannot handle to the QUARANTINE topic, with the reason.

A record that cannot be decoded, or a failed message whose retry copy cannot be built or is
refused for good, is copied to QUARANTINE and counts as done once Kafka acknowledges the copy;
until then it stays held and its partition's offset waits. A copy refused as a whole (too
large, say) is written again without the value and headers.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from bridge.codec import PreparedRecord
from bridge.consumer.context import ConsumerContext
from bridge.consumer.counters import Count
from bridge.consumer.process_queue import ProcessQueue
from bridge.errors import InvalidArgumentError, SendError
from bridge.kafka.quarantine import quarantine_copy

logger = logging.getLogger(__name__)


def refused_for_good(error: object) -> bool:
    """True if a copy failed for a reason that sending it again will not change: Kafka or the
    client refused the record itself (a :class:`SendError`, or a delivery report's or
    ``produce()``'s librdkafka error, that is not :attr:`~bridge.errors.BridgeError.retriable`:
    record too large, topic unknown or not authorized, ...; or an
    :class:`InvalidArgumentError` such as :class:`~bridge.errors.MessageTooLargeError`).
    Timeouts, an unreachable broker and anything else (a client not started, ...) are
    transient."""
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        error = SendError(error.str(), error)
    return isinstance(error, SendError | InvalidArgumentError) and not error.retriable


def error_text(error: object) -> str:
    """A delivery report's error or an exception, as a reason (with Kafka's error name)."""
    if isinstance(error, KafkaError):
        return f"{error.str()} ({error.name()})"
    return str(error)


class Headerless:
    """A consumed record seen without its headers, which cannot be read: confluent-kafka
    raises converting a header name that is not UTF-8, and reading them again would crash."""

    __slots__ = ("_record",)

    def __init__(self, record: Any) -> None:
        self._record = record

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def topic(self) -> Any:
        return self._record.topic()

    def partition(self) -> Any:
        return self._record.partition()

    def offset(self) -> Any:
        return self._record.offset()

    def key(self) -> Any:
        return self._record.key()

    def value(self) -> Any:
        return self._record.value()

    def timestamp(self) -> Any:
        return self._record.timestamp()


class Quarantine:
    """Writes the QUARANTINE copies of one consumer's records."""

    def __init__(self, context: ConsumerContext) -> None:
        self._context = context

    def send(
        self,
        record: Any,
        pq: ProcessQueue,
        reason: Exception,
        refused: str | None = None,
    ) -> None:
        """Copy ``record`` (held in ``pq``) to QUARANTINE with ``reason``, without waiting; it
        is done once Kafka acknowledges the copy. Until then it stays held. A whole copy that
        is refused for good (too large, say) is replaced by one without the value and headers
        (``refused``: why); a copy that fails otherwise, or a value-less one refused too (an
        error is logged: the record pins its partition), is tried again after
        ``send_back_retry_delay_ms``. A copy refused with its request batch as too large is
        first sent again in a batch of its own by the producer, and keeps its value unless
        refused then too. Never raises."""
        context = self._context
        offset = record.offset()
        retry_delay_ms = context.settings.send_back_retry_delay_ms

        def again() -> None:
            if not pq.dropped:
                self.send(record, pq, reason, refused)

        def valueless(why: str) -> None:
            if not pq.dropped:
                self.send(record, pq, reason, why)

        def failed(error: object) -> None:
            text = error_text(error)
            if not refused_for_good(error):
                logger.warning(
                    "quarantine of %s[%d]@%d failed, retrying later: %s",
                    pq.topic,
                    pq.partition,
                    offset,
                    text,
                )
            elif refused is None:
                logger.warning(
                    "quarantine of %s[%d]@%d refused (%s): quarantining it without its value",
                    pq.topic,
                    pq.partition,
                    offset,
                    text,
                )
                # On the poll thread: this may run inside a delivery report.
                context.scheduler.after(0, lambda: valueless(text))
                return
            else:
                logger.error(
                    "push consumer %s: %s[%d]@%d cannot be quarantined, even without its value "
                    "(%s); it stays held and its offset uncommitted, retrying in %d ms",
                    context.group,
                    pq.topic,
                    pq.partition,
                    offset,
                    text,
                    retry_delay_ms,
                )
            context.scheduler.after(retry_delay_ms, again)

        def delivered(err: KafkaError | Exception | None, _: Any) -> None:
            try:
                if err is None:
                    pq.remove([offset])
                    context.counters.add(Count.QUARANTINED)
                else:
                    failed(err)
            except Exception:
                logger.exception("push consumer %s: quarantine report", context.group)

        try:
            copy = self.record(record, f"{type(reason).__name__}: {reason}", refused)
            context.sender.send_record_async(copy, -1, delivered, resend_alone=True)
        except Exception as exc:
            failed(exc)

    def record(self, record: Any, reason: str, refused: str | None = None) -> PreparedRecord:
        """The QUARANTINE record of ``record``; without its headers if they break the copy,
        and without its value and headers if the whole copy was ``refused`` (why): then the
        key, the origin (topic, partition, offset), the value's size and the reason remain."""
        catalog = self._context.catalog
        by = f"consumer {self._context.group}"
        if refused is not None:
            value = record.value()
            copy = quarantine_copy(
                catalog,
                record,
                f"{reason}; quarantined without its value of {len(value or b'')} bytes and "
                f"its headers, the whole copy being refused ({refused})",
                by,
                keep_value=False,
            )
        else:
            try:
                copy = quarantine_copy(catalog, record, reason, by)
            except Exception as exc:
                copy = quarantine_copy(
                    catalog,
                    Headerless(record),
                    f"{reason}; quarantined without its headers ({type(exc).__name__}: {exc})",
                    by,
                )
        return copy if copy.value is not None else copy._replace(value=b"")
