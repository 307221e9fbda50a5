"""The asyncio ``Producer``: ``await send(msg)``, ``send_oneway``, ``send_batch``.

A front over the threaded producer's collaborators, which keep every rule: each message is
checked and its record built by the same :class:`~bridge.client.records.RecordBuilder` as
:meth:`bridge.Producer.prepare` (the same typed errors, and nothing sent when one is raised),
and sent by the same :class:`~bridge.client.sender.RecordSender`, idempotent and
``acks=all``, with the same delivery reports
(:func:`~bridge.client.send_results.async_report`). Only where the work runs differs:

* on the event loop: a future per send and a queue append, nothing more;
* on the producer's sender thread: preparing each record, and every call into librdkafka
  (``produce``, a full local queue waited out, the system topics created before a first
  delayed message, the partition count looked up for an explicit ``partition``);
* on the threaded producer's delivery thread (or the sender thread): the delivery reports,
  handed back to the loop in batches (one loop wake-up for all the outcomes that arrived
  together).

So the loop never waits for Kafka and spends a few microseconds per send. Every ``send*``
awaits its outcome (``send_oneway``: its hand-over), so a loop of sends lets other tasks run.
``confluent_kafka.aio.AIOProducer`` is not used: its batched ``produce`` takes no headers,
and every record of the bridge carries its properties as headers.

The module stays a little above 500 lines on purpose: the loop's side of a send (futures,
room in the outbox, timeouts) and the sender thread's side (hand-over, outcomes) share one
small state each send, :class:`_Send`, read best beside both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, cast

from bridge.aio.runner import AsyncClient
from bridge.client.producer import Producer as ThreadedProducer
from bridge.client.producer import collaborators
from bridge.client.recall import recall_handle
from bridge.client.send_results import SendResult, async_report
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
from bridge.serialization import Serializer

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
        self._items: deque[tuple[asyncio.Future[Any], Any, bool]] = deque()
        self._scheduled = False

    def put(self, future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
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
    """The loop side of one outcome: its future, resolved through the completions."""

    __slots__ = ("completions", "future")

    def __init__(self, completions: _Completions, future: asyncio.Future[Any]) -> None:
        self.completions = completions
        self.future = future

    def ok(self, result: Any) -> None:
        self.completions.put(self.future, result, False)

    def fail(self, error: BaseException) -> None:
        self.completions.put(self.future, error, True)


class _Send:
    """Messages for the sender thread: prepared there (all of them before any is sent), then
    handed to librdkafka, each with its own outcome.

    Once the caller was given an outcome without them (the send timed out or was cancelled),
    the rest are never handed over: :meth:`abandon` (on the loop) and :meth:`claim` (on the
    sender thread, before each record) decide under ``lock`` which came first."""

    __slots__ = ("abandoned", "claimed", "handed", "lock", "msgs", "partition", "results")

    def __init__(
        self,
        msgs: list[Message],
        partition: int,
        handed: _Pending | None,
        results: list[_Pending] | None,
    ) -> None:
        self.msgs = msgs
        self.partition = partition
        self.handed = handed
        """Oneway sends: resolved with the message ids once every record was handed over, or
        with the error that stopped them all (a message that is not valid: none was sent)."""
        self.results = results
        """Other sends: resolved with each one's :class:`SendResult` or error, or all with
        the error that stopped them (none was sent); None for oneway sends."""
        self.lock = threading.Lock()
        self.abandoned = False
        """The caller has its outcome (timeout, cancellation): nothing more is handed over."""
        self.claimed = 0
        """Records the sender thread took to hand to librdkafka so far."""

    def claim(self) -> bool:
        """Sender thread: take the next record to hand over; False once abandoned."""
        with self.lock:
            if self.abandoned:
                return False
            self.claimed += 1
            return True

    def abandon(self) -> int:
        """Loop: hand nothing more over; return how many records were taken already."""
        with self.lock:
            self.abandoned = True
            return self.claimed

    def fail(self, error: BaseException) -> None:
        """Fail every outcome of these messages with ``error``."""
        for pending in self.results or ([self.handed] if self.handed is not None else []):
            pending.fail(error)


class Producer(AsyncClient):
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
        kafka_config: Mapping[str, Any] | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
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
            kafka_config=kafka_config,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
        )
        self._builder, self._record_sender = collaborators(self._producer)
        self.config = self._producer.config
        self.group = self._producer.group
        self._max_queued = max_queued_sends
        self._outbox: deque[_Send] = deque()
        """Messages for the sender thread."""
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
        """The threaded producer underneath; its sends wait, so call them from threads, never
        from the loop."""
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
        self._builder.prepare(Message("warm-up", b"-"))
        self._builder.prepare(Message("warm-up", b"-", delay_time_level=1))

    async def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop taking sends, wait up to ``timeout_ms`` (default ``send_msg_timeout_ms``) in
        all for the sends already handed to librdkafka, and stop; the waits run on a worker
        thread. Idempotent.

        Sends not handed over yet (queued for the sender thread, or waiting for room) fail
        with :class:`IllegalStateError` and are never sent."""
        timeout = self.config.send_msg_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + max(timeout, 0) / 1000
        sender = self._sender
        if sender is not None:
            self._stopping = True
            self._room.set()  # sends waiting for room fail instead of waiting forever
            self._wake.set()
            await asyncio.to_thread(sender.join, max(deadline - time.monotonic(), 0.0))
            self._sender = None
            # Still alive: stuck handing one record to a full local queue (at most
            # send_msg_timeout_ms); it fails every other one it finds.
            self._fail_outbox()
        remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
        await asyncio.to_thread(self._producer.shutdown, remaining_ms)

    async def flush(self, timeout_ms: int | None = None) -> int:
        """Wait for the sends queued so far (on a worker thread); return how many are still
        unacknowledged."""
        self._require_running()
        await self._wait_for_room(1)
        return await asyncio.to_thread(self._producer.flush, timeout_ms)

    # --- sending -------------------------------------------------------------------------
    async def prepare(self, msg: Message, partition: int = -1) -> PreparedRecord:
        """:meth:`bridge.client.Producer.prepare`: check ``msg`` and build its record, on
        the loop (no I/O), or on a worker thread when ``partition`` is given (its range is
        checked against the topic's metadata) or a serializer is to run (a Schema Registry
        serializer's first use of a schema makes blocking HTTP calls)."""
        if partition == -1 and not self._builder.serializers.will_run(msg):
            return self._builder.prepare(msg, partition)
        return await asyncio.to_thread(self._builder.prepare, msg, partition)

    async def send(self, msg: Message, *, partition: int = -1) -> SendResult:
        """Send and wait for the broker's acknowledgement (at most ``send_msg_timeout_ms``,
        plus up to a second for the report): :meth:`bridge.Producer.send_sync`.

        ``partition`` picks a partition (-1: the key decides). Raises the same typed errors
        as the threaded producer: :class:`InvalidMessageError` and the others for a message
        that is not valid (nothing is sent), :class:`SendError` (:class:`SendTimeoutError`
        on timeout) after. A send that times out or is cancelled before the sender thread
        handed it to librdkafka is never sent; one already handed over is not taken back.
        """
        [result] = await self._send([msg], partition, oneway=False)
        if isinstance(result, BaseException):
            raise result
        return cast(SendResult, result)

    async def send_batch(
        self, msgs: Iterable[Message], *, partition: int = -1
    ) -> list[SendResult | KafkaClientError]:
        """Send ``msgs`` together and wait for every acknowledgement; return, in order, each
        one's :class:`SendResult` or the error it failed with (:class:`SendError`,
        :class:`SendTimeoutError`, ``BrokerUnreachableError``), as
        :meth:`bridge.Producer.send_batch` does.

        Every message is checked first: one that is not valid raises its typed error and
        none is sent.
        """
        results = await self._send(list(msgs), partition, oneway=False)
        return [_as_client_error(r) if isinstance(r, BaseException) else r for r in results]

    async def send_oneway(self, msg: Message, *, partition: int = -1) -> str:
        """Send without any result; failures are only logged. Return the message id once the
        send was handed to librdkafka; a message that is not valid raises its typed error."""
        [msg_id] = await self._send([msg], partition, oneway=True)
        return cast(str, msg_id)

    # --- internals -----------------------------------------------------------------------
    async def recall_message(self, topic: str, recall_handle: str) -> str:
        """:meth:`bridge.Producer.recall_message` on a worker thread (it waits for the
        broker's acknowledgement of the recall): the message id once the timer message of
        ``recall_handle`` is certain never to be delivered, else
        :class:`~bridge.errors.RecallTooLateError` (it is delivered exactly once) or the
        error naming why the handle or the recall was refused."""
        self._require_running()
        return await asyncio.to_thread(self._producer.recall_message, topic, recall_handle)

    def _require_running(self) -> tuple[asyncio.AbstractEventLoop, _Completions]:
        state = self._producer.state
        loop, completions = self._loop, self._completions
        if state is not ServiceState.RUNNING or loop is None or completions is None:
            raise IllegalStateError(
                f"producer {self.group} is {state.value}, not RUNNING: call start() first"
            )
        if self._stopping:
            raise IllegalStateError(f"producer {self.group} is shutting down")
        return loop, completions

    async def _send(self, msgs: list[Message], partition: int, *, oneway: bool) -> list[Any]:
        """Hand ``msgs`` to the sender thread; once they are all handed over (or one was
        refused, which is raised), the outcome of each: the message ids for oneway sends,
        else a :class:`SendResult` or the exception it failed with."""
        loop, completions = self._require_running()
        if not msgs:
            return []
        # A oneway send awaits its hand-over; the others await their results, which carry
        # a refusal before sending too (every one of them fails with it).
        handed: asyncio.Future[list[str]] | None = loop.create_future() if oneway else None
        futures = [] if oneway else [loop.create_future() for _ in msgs]
        item = _Send(
            msgs,
            partition,
            None if handed is None else _Pending(completions, handed),
            None if oneway else [_Pending(completions, f) for f in futures],
        )
        if self._enqueued - self._handed >= self._max_queued:
            await self._wait_for_room(self._max_queued)
            self._require_running()  # shutdown may have begun while waiting
        self._outbox.append(item)
        self._enqueued += len(msgs)
        if not self._wake.is_set():
            self._wake.set()
        timer = loop.call_later(self._timeout_s, _expire, item, handed, futures, self.config)
        try:
            if handed is not None:
                return await handed
            outcomes: list[Any] = []
            for future in futures:
                try:
                    outcomes.append(await future)
                except KafkaClientError as exc:  # the send failed; a refusal is raised
                    outcomes.append(exc)
            return outcomes
        finally:
            timer.cancel()
            item.abandon()  # the caller has its outcome: what was not handed over never is
            for future in futures:  # left behind by an error or a cancellation
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()  # seen: no "exception never retrieved" warning

    async def _wait_for_room(self, limit: int) -> None:
        """Wait until fewer than ``limit`` messages are queued for the sender thread.

        The sender thread signals after each item it handed on while a waiter wants room
        (``_room_wanted``), and the waiter looks again after asking, so no signal is lost."""
        while self._enqueued - self._handed >= limit:
            if self._stopping:
                raise IllegalStateError(f"producer {self.group} is shutting down")
            self._room.clear()
            self._room_wanted = True
            if self._enqueued - self._handed < limit:  # handed on meanwhile
                break
            await self._room.wait()

    def _send_loop(self) -> None:
        """The sender thread: prepare and hand queued messages to librdkafka until stopped,
        then what is left."""
        outbox = self._outbox
        while True:
            self._wake.wait(_SENDER_IDLE_WAIT_S)
            self._wake.clear()
            while outbox:
                item = outbox.popleft()
                try:
                    if self._stopping:  # shutting down: what is queued is not sent
                        item.fail(self._not_sent())
                    else:
                        self._hand_over(item)
                except BaseException as exc:  # never lose the thread; the send fails
                    item.fail(exc)
                self._handed += len(item.msgs)
                if self._room_wanted:
                    self._room_wanted = False
                    self._signal_room()
            if self._stopping and not outbox:
                return

    def _hand_over(self, item: _Send) -> None:
        """Prepare every message of ``item`` (the first that is not valid fails them all,
        none sent), then hand each record to librdkafka."""
        builder, sender = self._builder, self._record_sender
        if item.abandoned:  # timed out or cancelled while queued: never sent
            return
        try:
            records = [builder.prepare(msg, item.partition) for msg in item.msgs]
        except Exception as exc:  # a typed error naming the problem: nothing is sent
            item.fail(exc)
            return
        results = item.results
        for index, record in enumerate(records):
            if not item.claim():  # timed out or cancelled: the caller was told; not sent
                return
            if results is None:
                report: Report = sender.oneway_report(record)
            else:
                pending = results[index]
                topic = item.msgs[index].topic
                report = async_report(
                    record,
                    topic,
                    pending.ok,
                    pending.fail,
                    sender.resend,
                    recall_handle=recall_handle(record, topic, self.config.namespace),
                )
            try:
                sender.send_record_async(record, record.partition, report)
            except Exception as exc:  # refused before librdkafka took it (queue full, ...)
                error = _as_client_error(exc, record)
                if results is None:
                    logger.warning("oneway send of %s failed: %s", record.msg_id, error)
                else:
                    results[index].fail(error)
        if item.handed is not None:
            item.handed.ok([record.msg_id for record in records])

    def _not_sent(self) -> IllegalStateError:
        return IllegalStateError(f"producer {self.group} is shutting down: send not handed over")

    def _fail_outbox(self) -> None:
        """Fail every send still queued for the sender thread (it stopped, or will take no
        more)."""
        while True:
            try:
                item = self._outbox.popleft()
            except IndexError:
                return
            item.fail(self._not_sent())

    def _signal_room(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._room.set)


def _as_client_error(exc: BaseException, record: PreparedRecord | None = None) -> Any:
    """``exc`` as the project's error for a failed send (unchanged if it is one)."""
    if isinstance(exc, KafkaClientError) or not isinstance(exc, Exception):
        return exc
    context = "send" if record is None else f"send of {record.msg_id} to {record.kafka_topic}"
    return translate_error(exc, context)


def _expire(
    item: _Send,
    handed: asyncio.Future[Any] | None,
    futures: list[asyncio.Future[Any]],
    config: ClientConfig,
) -> None:
    """Fail what is still waiting ``send_msg_timeout_ms`` plus the grace after the send; a
    record not handed to librdkafka by then never is."""
    taken = item.abandon()
    timeout = config.send_msg_timeout_ms
    for index, future in enumerate(futures):
        if not future.done():
            where = f"send to {item.msgs[index].topic}"
            future.set_exception(
                SendTimeoutError(
                    f"{where}: no acknowledgement within {timeout} ms (it may still be delivered)"
                    if index < taken
                    else f"{where}: not handed to Kafka within {timeout} ms, never sent"
                )
            )
    if handed is not None and not handed.done():
        handed.set_exception(
            SendTimeoutError(
                f"send to {item.msgs[0].topic}: not handed to Kafka within {timeout} ms"
                + (" (it may still be delivered)" if taken else ", never sent")
            )
        )
