"""The asyncio ``Producer``: ``await send(msg)``, ``send_oneway``, ``send_batch``.

A front over the threaded :class:`bridge.client.Producer`, which keeps every rule: the message
is checked and its record built by the same :meth:`~bridge.client.Producer.prepare` (typed
errors before anything is sent), and sent by the same producer, idempotent and ``acks=all``,
with the same delivery reports (:class:`~bridge.client.send_results.AsyncReport`). Only where
the work runs differs:

* on the event loop: :meth:`Producer.prepare` of a message without an explicit partition
  (no I/O), and the futures the sends return;
* on the producer's sender thread: every call into librdkafka (``produce``, a full local queue
  waited out, the system topics created before a first delayed message), fed from a queue
  the loop appends to;
* on the threaded producer's delivery thread (or the sender thread): the delivery reports,
  handed back to the loop in batches (one loop wake-up for all the reports that arrived
  together).

So no call on the loop ever waits for Kafka. ``confluent_kafka.aio.AIOProducer`` is not used:
its batched ``produce`` takes no headers, and every record of the bridge carries its
properties as headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Final, Self

from bridge.client.producer import Producer as ThreadedProducer
from bridge.client.send_results import AsyncReport, SendResult, log_oneway_failure
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    KafkaClientError,
    SendTimeoutError,
)
from bridge.kafka.clients import translate_error
from bridge.lifecycle import ServiceState
from bridge.message import Message

__all__ = ["Producer"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED_SENDS: Final = 10_000
"""Sends handed to the sender thread and not yet given to librdkafka, at most; a send beyond
waits (asynchronously) for room."""
_REPORT_GRACE_S: Final = 1.0
"""A send fails with :class:`SendTimeoutError` if no delivery report came this long after
``send_msg_timeout_ms`` (librdkafka reports a failure at that timeout), s."""
_DRAIN_BATCH: Final = 500
"""Send outcomes resolved per turn of the loop, at most (the rest in the next turn)."""
_PREPARE_SLICE: Final = 100
"""A batch send lets other tasks run after checking this many messages."""
_SENDER_IDLE_WAIT_S: Final = 0.2
"""How often an idle sender thread looks whether it must stop, s."""

Report = Callable[[Any, Any], None]
"""A delivery report handler, ``(KafkaError | None, confluent_kafka.Message)``."""


class _Completions:
    """Send outcomes handed from the client's threads to the loop in batches: one
    ``call_soon_threadsafe`` for whatever arrived before the loop got to them."""

    __slots__ = ("_items", "_loop", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[asyncio.Future[SendResult], Any, bool]] = deque()
        self._scheduled = False

    def put(self, future: asyncio.Future[SendResult], outcome: Any, failed: bool) -> None:
        """Any thread: resolve ``future`` with ``outcome`` (an exception if ``failed``)."""
        self._items.append((future, outcome, failed))
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody awaits the result any more
                self._items.clear()

    def _drain(self) -> None:
        self._scheduled = False  # first: an outcome added from now on schedules a drain
        items = self._items
        for _ in range(_DRAIN_BATCH):
            if not items:
                return
            future, outcome, failed = items.popleft()
            if future.done():  # cancelled, or timed out
                continue
            if failed:
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if items and not self._scheduled:  # the rest after other callbacks had their turn
            self._scheduled = True
            self._loop.call_soon(self._drain)


class _Pending:
    """The loop side of one awaited send: its future, resolved through the completions."""

    __slots__ = ("completions", "future")

    def __init__(self, completions: _Completions, future: asyncio.Future[SendResult]) -> None:
        self.completions = completions
        self.future = future

    def ok(self, result: SendResult) -> None:
        self.completions.put(self.future, result, False)

    def fail(self, error: Exception) -> None:
        self.completions.put(self.future, error, True)


class Producer:
    """RocketMQ's producer for asyncio code.

    ``async with Producer("group", bootstrap_servers="host:9092") as producer:`` then
    ``result = await producer.send(msg)``. Arguments as for :class:`bridge.Producer`, plus
    ``max_queued_sends``: sends waiting for the sender thread, at most (more wait for room).
    """

    def __init__(
        self,
        group: str,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        send_msg_timeout_ms: int | None = None,
        config: ClientConfig | None = None,
        max_queued_sends: int = DEFAULT_MAX_QUEUED_SENDS,
    ) -> None:
        if isinstance(max_queued_sends, bool) or not isinstance(max_queued_sends, int):
            raise InvalidArgumentError(f"max_queued_sends must be an int, got {max_queued_sends!r}")
        if max_queued_sends < 1:
            raise InvalidArgumentError(f"max_queued_sends must be positive, got {max_queued_sends}")
        self._producer = ThreadedProducer(
            group,
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            send_msg_timeout_ms=send_msg_timeout_ms,
            config=config,
        )
        self.config = self._producer.config
        self.group = self._producer.group
        self._max_queued = max_queued_sends
        self._outbox: deque[tuple[PreparedRecord, int, Report]] = deque()
        """Records for the sender thread: (record, partition, report handler)."""
        self._enqueued = 0
        """Records put in the outbox so far (written on the loop only)."""
        self._handed = 0
        """Records handed to librdkafka (or failed) so far (written by the sender only)."""
        self._wake = threading.Event()
        self._stopping = False
        self._sender: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._completions: _Completions | None = None
        self._room = asyncio.Event()
        self._room_wanted = False
        self._timeout_s = self.config.send_msg_timeout_ms / 1000 + _REPORT_GRACE_S

    # --- lifecycle ---------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The producer's lifecycle state."""
        return self._producer.state

    @property
    def threaded(self) -> ThreadedProducer:
        """The threaded producer underneath (its own sends are thread-safe)."""
        return self._producer

    async def start(self) -> None:
        """Create the Kafka client (on a worker thread) and the sender thread; the running
        loop is the one sends resolve on. May be called once."""
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._start_and_warm_up)
        self._loop = loop
        self._completions = _Completions(loop)
        self._sender = threading.Thread(
            target=self._send_loop, name=f"bridge-aio-sender-{self.group}", daemon=True
        )
        self._sender.start()

    def _start_and_warm_up(self) -> None:
        """Start the threaded producer, and build a plain and a delayed record once (nothing
        is sent): what the first ones load on first use (imports, schemas: tens of ms) is
        loaded here, off the loop."""
        self._producer.start()
        self._producer.prepare(Message("warm-up", b"-"))
        self._producer.prepare(Message("warm-up", b"-", delay_time_level=1))

    async def shutdown(self, timeout_ms: int | None = None) -> None:
        """Hand what is queued to librdkafka, then wait up to ``timeout_ms`` (default
        ``send_msg_timeout_ms``) for outstanding sends, and stop; the waits run on a worker
        thread. Idempotent."""
        sender = self._sender
        if sender is not None:
            self._stopping = True
            self._wake.set()
            await asyncio.to_thread(sender.join)
            self._sender = None
        await asyncio.to_thread(self._producer.shutdown, timeout_ms)

    async def flush(self, timeout_ms: int | None = None) -> int:
        """Wait for the sends queued so far (on a worker thread); return how many are still
        unacknowledged."""
        self._require_running()
        await self._wait_for_room(1)
        return await asyncio.to_thread(self._producer.flush, timeout_ms)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # --- sending -------------------------------------------------------------------------
    async def prepare(self, msg: Message, partition: int = -1) -> PreparedRecord:
        """:meth:`bridge.client.Producer.prepare`: check ``msg`` and build its record, on
        the loop (no I/O), or on a worker thread when ``partition`` is given (its range is
        checked against the topic's metadata)."""
        if partition == -1:
            return self._producer.prepare(msg, partition)
        return await asyncio.to_thread(self._producer.prepare, msg, partition)

    async def send(self, msg: Message, *, partition: int = -1) -> SendResult:
        """Send and wait for the broker's acknowledgement (at most ``send_msg_timeout_ms``,
        plus up to a second for the report): :meth:`bridge.Producer.send_sync`.

        Raises the same typed errors before anything is sent (:class:`InvalidMessageError`
        ...), and :class:`SendError` (:class:`SendTimeoutError` on timeout). Cancelling the
        awaiting task does not take back a send already handed over.
        """
        self._require_running()
        record = await self.prepare(msg, partition)
        future, report = self._awaited(record, msg.topic)
        await self._enqueue([(record, record.partition, report)])
        return await self._result(future, record)

    async def send_batch(
        self, msgs: Iterable[Message], *, partition: int = -1
    ) -> list[SendResult | KafkaClientError]:
        """Send ``msgs`` together and wait for every acknowledgement; return, in order, each
        one's :class:`SendResult` or the error it failed with (:class:`SendError`,
        :class:`SendTimeoutError`, ``BrokerUnreachableError``), as
        :meth:`bridge.client.Producer.send_records_sync` does.

        Every message is checked first: one that is not valid raises its typed error and
        none is sent.
        """
        self._require_running()
        batch = list(msgs)
        records = []
        for index, msg in enumerate(batch, 1):
            records.append(await self.prepare(msg, partition))
            if index % _PREPARE_SLICE == 0:
                await asyncio.sleep(0)  # a large batch does not hold the loop
        awaited = [self._awaited(r, m.topic) for r, m in zip(records, batch, strict=True)]
        await self._enqueue(
            [(r, r.partition, report) for r, (_, report) in zip(records, awaited, strict=True)]
        )
        results: list[SendResult | KafkaClientError] = []
        for record, (future, _) in zip(records, awaited, strict=True):
            try:
                results.append(await self._result(future, record))
            except KafkaClientError as exc:
                results.append(exc)
        return results

    async def send_oneway(self, msg: Message, *, partition: int = -1) -> str:
        """Send without any result; failures are only logged. Return the message id once the
        send is queued (waiting only if ``max_queued_sends`` sends are)."""
        self._require_running()
        record = await self.prepare(msg, partition)
        await self._enqueue([(record, record.partition, log_oneway_failure)])
        return record.msg_id

    # --- internals -----------------------------------------------------------------------
    def _require_running(self) -> None:
        state = self._producer.state
        if state is not ServiceState.RUNNING or self._completions is None:
            raise IllegalStateError(
                f"producer {self.group} is {state.value}, not RUNNING: call start() first"
            )
        if self._stopping:
            raise IllegalStateError(f"producer {self.group} is shutting down")

    def _awaited(
        self, record: PreparedRecord, topic: str
    ) -> tuple[asyncio.Future[SendResult], AsyncReport]:
        loop = self._loop
        completions = self._completions
        if loop is None or completions is None:
            raise IllegalStateError(f"producer {self.group} is not started")
        future: asyncio.Future[SendResult] = loop.create_future()
        pending = _Pending(completions, future)
        return future, AsyncReport(
            record.msg_id, topic, record.kafka_topic, pending.ok, pending.fail
        )

    async def _result(
        self, future: asyncio.Future[SendResult], record: PreparedRecord
    ) -> SendResult:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self._timeout_s, _expire, future, record, self.config)
        try:
            return await future
        finally:
            timer.cancel()

    async def _wait_for_room(self, limit: int) -> None:
        """Wait until fewer than ``limit`` sends are queued for the sender thread.

        The sender thread signals after each record it handed on while a waiter wants room
        (``_room_wanted``), and the waiter looks again after asking, so no signal is lost."""
        while self._enqueued - self._handed >= limit:
            self._room.clear()
            self._room_wanted = True
            if self._enqueued - self._handed < limit:  # handed on meanwhile
                break
            await self._room.wait()

    async def _enqueue(self, items: list[tuple[PreparedRecord, int, Report]]) -> None:
        if self._enqueued - self._handed >= self._max_queued:
            await self._wait_for_room(self._max_queued)
        self._outbox.extend(items)
        self._enqueued += len(items)
        if not self._wake.is_set():
            self._wake.set()

    def _send_loop(self) -> None:
        """The sender thread: hand queued records to librdkafka until stopped, then what is
        left. A record refused before it reached librdkafka fails its send at once."""
        outbox = self._outbox
        producer = self._producer
        while True:
            self._wake.wait(_SENDER_IDLE_WAIT_S)
            self._wake.clear()
            while outbox:
                record, partition, report = outbox.popleft()
                try:
                    producer.send_record_async(record, partition, report)
                except Exception as exc:  # refused locally (queue full past the timeout, ...)
                    _refused(record, report, exc)
                self._handed += 1
                if self._room_wanted:
                    self._room_wanted = False
                    self._signal_room()
            if self._stopping and not outbox:
                return

    def _signal_room(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._room.set)


def _refused(record: PreparedRecord, report: Report, exc: Exception) -> None:
    """Fail the send of a record librdkafka did not take."""
    error = (
        exc
        if isinstance(exc, KafkaClientError)
        else translate_error(exc, f"send of {record.msg_id} to {record.kafka_topic}")
    )
    if isinstance(report, AsyncReport) and report.on_exception is not None:
        report.on_exception(error)
    else:
        logger.warning("send of %s failed: %s", record.msg_id, error)


def _expire(
    future: asyncio.Future[SendResult], record: PreparedRecord, config: ClientConfig
) -> None:
    if not future.done():
        future.set_exception(
            SendTimeoutError(
                f"send of {record.msg_id} to {record.kafka_topic}: no acknowledgement within "
                f"{config.send_msg_timeout_ms} ms"
            )
        )
