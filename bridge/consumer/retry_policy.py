"""What becomes of a message its listener failed: RocketMQ's send-back, as a policy object.

CLUSTERING: the message is copied to the group's retry topic through the delay levels
(:func:`~bridge.consumer.model.retry_route`), or to its dead-letter queue once its retries are
spent, and counts as done only once Kafka has acknowledged the copy. A copy that cannot be
written is consumed again locally after ``send_back_retry_delay_ms`` (its offset stays
uncommitted meanwhile); one that cannot be built (the message cannot be encoded), or is
refused for good (too large, not authorized) :data:`COPY_ATTEMPTS` times, goes to QUARANTINE
instead. Building a copy that raises anything else is a fault of the code: logged with its
traceback, the message is consumed again, never quarantined for it. BROADCASTING: a failed
message is dropped with a warning, as RocketMQ does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from confluent_kafka import KafkaError

from bridge.codec import PreparedRecord
from bridge.consumer.context import ConsumerContext
from bridge.consumer.counters import Count
from bridge.consumer.model import RetryRoute, retry_route
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import (
    Quarantine,
    error_text,
    refused_for_good,
)
from bridge.consumer.send_back import origin_topic, send_back_record
from bridge.errors import KafkaClientError, SendError, WireFormatError
from bridge.message import MessageConst, MessageExt, local_ipv4

logger = logging.getLogger(__name__)

COPY_ATTEMPTS: Final = 3
"""Times one message's retry or DLQ copy may be refused for good (too large, not authorized,
...) before the message is quarantined instead; between them it is consumed again locally
after ``send_back_retry_delay_ms``, doubled for each further refusal."""

Redeliver = Callable[[ProcessQueue, list[MessageExt]], None]
"""Hands held messages to the listener again (the consumption strategy's own way)."""


def count_failure(msgs: list[MessageExt]) -> None:
    """One more failure for each of ``msgs``, retried here rather than through the retry
    topic (whose copy carries the count): ``RECONSUME_TIME`` + 1."""
    for msg in msgs:
        msg.put_system_property(MessageConst.RECONSUME_TIME, str(msg.reconsume_times + 1))


class RetryPolicy:
    """Routes, send-back, the DLQ and local retries of one consumer's failed messages.

    ``max_reconsume_times``: the resolved budget (see
    :func:`~bridge.consumer.model.effective_max_reconsume_times`); ``redeliver``: how a
    message retried locally reaches the listener again; ``at_once``: retry copies go straight
    to the retry topic instead of through the delay levels (a SimpleConsumer's message has
    waited out its invisible duration, RocketMQ 5's back-off, before it is sent back)."""

    def __init__(
        self,
        context: ConsumerContext,
        quarantine: Quarantine,
        *,
        max_reconsume_times: int,
        redeliver: Redeliver,
        at_once: bool = False,
    ) -> None:
        self._context = context
        self._quarantine = quarantine
        self.max_reconsume_times = max_reconsume_times
        self._redeliver = redeliver
        self._at_once = at_once
        self._born_host = local_ipv4().encode()

    # --- failures ------------------------------------------------------------------------
    def fail(self, pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        """Count ``msgs`` (held in ``pq``) as failed, then send them back at ``levels`` (0: the
        default level; CLUSTERING: each is done once its copy is acknowledged) or drop them
        (BROADCASTING). Never raises for a copy that cannot be built or sent."""
        if not msgs:
            return
        self._context.counters.add(Count.FAILED, len(msgs))
        if self._context.broadcasting:
            self.drop(pq, msgs)
        else:
            self.send_back(pq, msgs, levels)

    def drop(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """BROADCASTING: failed ``msgs`` are dropped with a warning and done."""
        for msg in msgs:
            logger.warning("BROADCASTING, the message consume failed, drop it: %s", msg)
        self._context.counters.add(Count.DROPPED, len(msgs))
        pq.remove(m.queue_offset for m in msgs)

    def check_reconsume_times(self, pq: ProcessQueue, failed: list[MessageExt]) -> list[MessageExt]:
        """RocketMQ's ``checkReconsumeTimes`` (orderly): messages out of retries go to the DLQ
        (or are dropped, BROADCASTING); the rest count one more failure and are returned, in
        offset order, to be retried in place."""
        limit = self.max_reconsume_times
        spent = [m for m in failed if m.reconsume_times >= limit]
        retry = [m for m in failed if m.reconsume_times < limit]
        if spent:
            if self._context.broadcasting:
                self.drop(pq, spent)
            else:
                sent, kept = self.dead_letter(pq, spent)
                pq.remove(m.queue_offset for m in sent)
                retry = sorted(retry + kept, key=lambda m: m.queue_offset)
        count_failure(retry)
        return retry

    def retry_locally(
        self, pq: ProcessQueue, msgs: list[MessageExt], delay_ms: int | None = None
    ) -> None:
        """Consume again after ``delay_ms`` (default ``send_back_retry_delay_ms``), here
        (RocketMQ's ``submitConsumeRequestLater``): the send-back failed, so the messages stay
        held and uncommitted."""
        context = self._context
        context.counters.add(Count.RETRIED_LOCALLY, len(msgs))
        count_failure(msgs)

        def again() -> None:
            if not pq.dropped:
                self._redeliver(pq, msgs)

        if delay_ms is None:
            delay_ms = context.settings.send_back_retry_delay_ms
        context.scheduler.after(delay_ms, again)

    # --- copies --------------------------------------------------------------------------
    def copy_of(
        self, msg: MessageExt, level: int, record_key: bytes | None = None
    ) -> tuple[RetryRoute, PreparedRecord]:
        """Where failed ``msg`` goes (its listener's ``level``, 0: the default) and the record
        that takes it there (keyed ``record_key``, the key of the record it was read from)."""
        route = retry_route(msg.reconsume_times, self.max_reconsume_times, level)
        if self._at_once and not route.to_dlq:
            route = route._replace(delay_level=0)
        record = send_back_record(
            msg,
            self._context.group,
            route,
            self.max_reconsume_times,
            config=self._context.config,
            born_host=self._born_host,
            record_key=record_key,
        )
        return route, record

    def _built_copy(
        self, pq: ProcessQueue, msg: MessageExt, level: int, where: str
    ) -> tuple[RetryRoute, PreparedRecord] | None:
        """:meth:`copy_of`, or None when the message cannot be encoded in a copy (a
        :class:`~bridge.errors.WireFormatError` or ``ValueError``, such as a name or a property
        that cannot be written): then held ``msg`` is quarantined with the reason (a copy is
        built from the message alone: it would fail the same way again). Anything else is a
        fault of the code, not of the message, and is raised."""
        try:
            return self.copy_of(msg, level, _key_of(pq.record_of(msg.queue_offset)))
        except (WireFormatError, ValueError) as exc:
            logger.warning(
                "push consumer %s: cannot build the %s copy of %s, quarantining it: %s",
                self._context.group,
                where,
                msg.msg_id,
                exc,
                exc_info=True,
            )
            self.quarantine_held(pq, msg, exc)
            return None

    def send_back(self, pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        """Copy failed ``msgs`` to the retry topic or DLQ without waiting: each stays held
        until Kafka acknowledges its copy, then is done; a copy that cannot be sent is consumed
        again locally, and one that cannot be built (it never will be) is quarantined. The
        listener threads never wait for the broker. Never raises.

        The copies of one call share one report handler (:class:`_Copies`): the messages
        whose copies were acknowledged are marked done and counted together, once the last
        report of the call came, instead of a locked step and a count per report."""
        if not msgs:
            return
        copies = _Copies(self, pq)
        sender = self._context.sender
        report = copies.report
        try:
            for msg, level in zip(msgs, levels, strict=True):
                try:
                    built = self._built_copy(pq, msg, level, "retry")
                except Exception:
                    self._fault(msg, "retry")
                    self.retry_locally(pq, [msg])
                    continue
                if built is None:
                    continue
                route, record = built
                index = copies.add(msg, route)
                try:
                    sender.send_record_async(
                        record, record.partition, partial(report, index), resend_alone=True
                    )
                except Exception as exc:
                    copies.unsent()
                    self._copy_failed(pq, msg, route, exc)
        finally:
            copies.sent()

    def _copy_failed(
        self, pq: ProcessQueue, msg: MessageExt, route: RetryRoute, error: object
    ) -> None:
        """The retry or DLQ copy of held ``msg`` was not written (a copy refused with its
        request batch as too large was sent again alone first, by the producer: a refusal
        here is the copy's own). A transient failure: consume it again later. A refusal for
        good: the same, a bounded number of times (the listener may succeed meanwhile), then
        quarantine it with the reason, so it no longer pins its partition."""
        where = "DLQ" if route.to_dlq else "retry"
        if not refused_for_good(error):
            logger.warning(
                "%s copy of %s failed, consuming it again later: %s",
                where,
                msg.msg_id,
                error_text(error),
            )
            self.retry_locally(pq, [msg])
            return
        refusals = pq.note_refusal(msg.queue_offset)
        if refusals == 0:
            return  # done meanwhile, or the partition was given up
        if refusals < COPY_ATTEMPTS:
            logger.warning(
                "%s copy of %s refused (%d of %d), consuming it again later: %s",
                where,
                msg.msg_id,
                refusals,
                COPY_ATTEMPTS,
                error_text(error),
            )
            delay_ms = self._context.settings.send_back_retry_delay_ms << (refusals - 1)
            self.retry_locally(pq, [msg], delay_ms)
            return
        self.quarantine_held(pq, msg, _refusal(msg, where, refusals, error))

    def dead_letter(
        self, pq: ProcessQueue, msgs: list[MessageExt]
    ) -> tuple[list[MessageExt], list[MessageExt]]:
        """Copy ``msgs`` to the DLQ and wait for Kafka; return (acknowledged, not). A message
        whose copy cannot be built, or was refused for good :data:`COPY_ATTEMPTS` times, is
        quarantined instead (it is in neither list); one whose building raised a fault of the
        code is not acknowledged."""
        built: list[tuple[MessageExt, RetryRoute, PreparedRecord]] = []
        kept: list[MessageExt] = []
        for msg in msgs:
            try:
                copy = self._built_copy(pq, msg, -1, "DLQ")
            except Exception:
                self._fault(msg, "DLQ")
                kept.append(msg)
                continue
            if copy is not None:
                built.append((msg, *copy))
        results = self._context.sender.send_records_sync([record for _, _, record in built])
        sent: list[MessageExt] = []
        # A copy refused with its request batch as too large was sent again alone already
        # (send_records_sync): a refusal here is the copy's own.
        for (msg, route, _), result in zip(built, results, strict=True):
            if isinstance(result, KafkaClientError):
                refusals = pq.note_refusal(msg.queue_offset) if refused_for_good(result) else 0
                if refusals >= COPY_ATTEMPTS:
                    # Refused for good each time: quarantined, so the partition goes on.
                    self.quarantine_held(pq, msg, _refusal(msg, "DLQ", refusals, result))
                    continue
                logger.warning("DLQ copy of %s failed, retrying in place: %s", msg.msg_id, result)
                kept.append(msg)
                continue
            sent.append(msg)
            self._sent_back(msg, route)
        return sent, kept

    def _fault(self, msg: MessageExt, where: str) -> None:
        """Log (with the traceback) that building the ``where`` copy of ``msg`` raised what no
        message makes the codec raise: a fault of the code, so the message is not blamed
        (never quarantined for it) but consumed again."""
        logger.exception(
            "push consumer %s: building the %s copy of %s failed, a fault of the code rather "
            "than of the message: it stays held and is consumed again",
            self._context.group,
            where,
            msg.msg_id,
        )

    def quarantine_held(self, pq: ProcessQueue, msg: MessageExt, reason: Exception) -> None:
        """Quarantine the record of held ``msg`` (its copy cannot be built or was refused)."""
        record = pq.record_of(msg.queue_offset)
        if record is None:  # pragma: no cover - every held message has its record
            logger.error(
                "push consumer %s: no record for %s, retrying", self._context.group, msg.msg_id
            )
            self.retry_locally(pq, [msg])
            return
        self._quarantine.send(record, pq, reason)

    def _sent_back(self, msg: MessageExt, route: RetryRoute) -> None:
        if route.to_dlq:
            self._context.counters.add(Count.DEAD_LETTERED)
            logger.warning(
                "message %s (from %s) goes to the DLQ of %s after %d failures",
                msg.msg_id,
                origin_topic(msg),
                self._context.group,
                route.reconsume_times,
            )
        else:
            self._context.counters.add(Count.SENT_BACK)
            _log_sent_back(msg, route)


class _Copies:
    """The retry and DLQ copies of one :meth:`RetryPolicy.send_back` call, and their delivery
    reports. Each report of a copy that failed is handled at once (the message is consumed
    again later, or quarantined); the messages whose copies were acknowledged stay held until
    the last report came (or the call ended, if later), then are marked done and counted in
    one step. Reports arrive on whichever thread serves them, possibly before the call ends:
    the lock guards what they share."""

    __slots__ = (
        "_acked",
        "_lock",
        "_msgs",
        "_outstanding",
        "_policy",
        "_pq",
        "_routes",
    )

    def __init__(self, policy: RetryPolicy, pq: ProcessQueue) -> None:
        self._policy = policy
        self._pq = pq
        self._msgs: list[MessageExt] = []
        self._routes: list[RetryRoute] = []
        self._acked: list[int] = []
        """Indexes of the copies acknowledged."""
        self._outstanding = 1
        """Copies handed over without a report yet, plus one while the call runs."""
        self._lock = threading.Lock()

    def add(self, msg: MessageExt, route: RetryRoute) -> int:
        """Note the copy of ``msg`` about to be sent: its index for :meth:`report`."""
        with self._lock:
            self._outstanding += 1
            self._msgs.append(msg)
            self._routes.append(route)
            return len(self._msgs) - 1

    def unsent(self) -> None:
        """The copy last added was not handed over (no report will come)."""
        self._done(None)

    def sent(self) -> None:
        """The call handed over every copy it could."""
        self._done(None)

    def report(self, index: int, err: KafkaError | Exception | None, _: Any) -> None:
        """The delivery report of copy ``index`` (an exception: it was refused with its
        request batch and could not be sent again alone)."""
        try:
            if err is not None:
                self._policy._copy_failed(self._pq, self._msgs[index], self._routes[index], err)
        except Exception:
            logger.exception("push consumer %s: send-back report", self._policy._context.group)
        finally:
            self._done(index if err is None else None)

    def _done(self, acked: int | None) -> None:
        with self._lock:
            if acked is not None:
                self._acked.append(acked)
            self._outstanding -= 1
            if self._outstanding:
                return
            indexes = self._acked
        if indexes:
            try:
                self._finish(indexes)
            except Exception:
                logger.exception("push consumer %s: send-back report", self._policy._context.group)

    def _finish(self, indexes: list[int]) -> None:
        """Every report came: mark the messages whose copies were acknowledged done, and
        count them."""
        msgs, routes = self._msgs, self._routes
        self._pq.remove([msgs[i].queue_offset for i in indexes])
        retried = 0
        for i in indexes:
            route = routes[i]
            if route.to_dlq:
                self._policy._sent_back(msgs[i], route)
            else:
                retried += 1
        if retried:
            self._policy._context.counters.add(Count.SENT_BACK, retried)
            if logger.isEnabledFor(logging.DEBUG):
                for i in indexes:
                    route = routes[i]
                    if not route.to_dlq:
                        _log_sent_back(msgs[i], route)


def _key_of(record: object) -> bytes | None:
    """The Kafka key of a held record (None for none, or for a placeholder without one)."""
    key = getattr(record, "key", None)
    if key is None:
        return None
    value = key()
    return value if isinstance(value, bytes) else None


def _log_sent_back(msg: MessageExt, route: RetryRoute) -> None:
    logger.debug(
        "message %s sent back at level %d (reconsume %d)",
        msg.msg_id,
        route.delay_level,
        route.reconsume_times,
    )


def _refusal(msg: MessageExt, where: str, refusals: int, error: object) -> SendError:
    """Why ``msg`` is quarantined: its ``where`` copy was refused ``refusals`` times."""
    return SendError(
        f"the {where} copy of message {msg.msg_id} was refused {refusals} times: "
        f"{error_text(error)}"
    )
