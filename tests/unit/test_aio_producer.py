"""The asyncio producer when its broker is away (an address nobody listens on): shutdown
never leaves a send waiting, stops within its timeout, and a send that timed out or was
cancelled before it was handed to librdkafka is never sent afterwards."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bridge.aio import Producer
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, SendTimeoutError
from bridge.message import Message

NOWHERE = "127.0.0.1:1"


def full_queue_producer(send_msg_timeout_ms: int, max_queued_sends: int = 10_000) -> Producer:
    """A producer whose librdkafka queue holds one record: with no broker, the sender thread
    blocks on the second one until ``send_msg_timeout_ms`` (ms) passed."""
    config = ClientConfig(
        bootstrap_servers=NOWHERE,
        send_msg_timeout_ms=send_msg_timeout_ms,
        kafka={"queue.buffering.max.messages": "1"},
    )
    return Producer("g", config=config, max_queued_sends=max_queued_sends)


class HandOverLog:
    """Wraps the producer's record sender's ``send_record_async``: which record values reached
    librdkafka after their caller already had an outcome."""

    def __init__(self, producer: Producer) -> None:
        self.given_up: set[bytes] = set()
        self.handed: list[bytes] = []
        self.handed_after_outcome: list[bytes] = []
        sender = producer._record_sender
        original = sender.send_record_async

        def spy(
            record: PreparedRecord, partition: int, callback: Any, *, resend_alone: bool = False
        ) -> None:
            value = bytes(record.value or b"")
            self.handed.append(value)
            if value in self.given_up:
                self.handed_after_outcome.append(value)
            original(record, partition, callback, resend_alone=resend_alone)

        sender.send_record_async = spy  # type: ignore[method-assign]


async def wait_for(condition: Any, timeout_s: float) -> None:
    """Poll ``condition`` on the loop until it is truthy; fail after ``timeout_s`` (s)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_shutdown_fails_the_sends_waiting_for_room_instead_of_leaving_them_hanging() -> None:
    async def main() -> list[Any]:
        producer = full_queue_producer(send_msg_timeout_ms=1000, max_queued_sends=1)
        await producer.start()
        tasks = [
            asyncio.create_task(producer.send(Message("t", f"m{i}".encode()))) for i in range(30)
        ]
        await wait_for(lambda: producer._room_wanted, 5)  # sends are waiting for room
        await producer.shutdown(200)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*tasks, return_exceptions=True), timeout=10
        )
        assert not producer._outbox, "a send was left in the outbox"
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, IllegalStateError | SendTimeoutError) for o in outcomes), outcomes
    refused = [o for o in outcomes if isinstance(o, IllegalStateError)]
    assert len(refused) >= 25
    assert all("shutting down" in str(o) for o in refused)


def test_a_send_that_timed_out_or_was_cancelled_is_never_handed_over_later() -> None:
    async def main() -> HandOverLog:
        producer = full_queue_producer(send_msg_timeout_ms=1000)
        await producer.start()
        log = HandOverLog(producer)

        async def send(value: bytes) -> None:
            try:
                await producer.send(Message("t", value))
            except (SendTimeoutError, asyncio.CancelledError):
                log.given_up.add(value)
                raise

        async def oneway(value: bytes) -> None:
            try:
                await producer.send_oneway(Message("t", value))
            except SendTimeoutError:
                log.given_up.add(value)
                raise

        sends = [asyncio.create_task(send(f"m{i}".encode())) for i in range(4)]
        oneways = [asyncio.create_task(oneway(f"o{i}".encode())) for i in range(2)]
        cancelled = asyncio.create_task(send(b"cancelled"))
        await wait_for(lambda: len(log.handed) >= 2, 5)  # the sender is stuck on the second
        cancelled.cancel()
        await asyncio.gather(*sends, *oneways, cancelled, return_exceptions=True)
        assert b"cancelled" in log.given_up
        # Let the sender work through everything still queued.
        await wait_for(lambda: producer._handed == producer._enqueued, 10)
        await producer.shutdown(100)
        return log

    log = asyncio.run(main())
    assert len(log.given_up) >= 4, log.given_up
    assert log.handed_after_outcome == []


def test_shutdown_returns_within_its_timeout_while_the_sender_is_stuck() -> None:
    async def main() -> float:
        producer = full_queue_producer(send_msg_timeout_ms=2000)
        await producer.start()
        for i in range(2):
            await producer.send_oneway(Message("t", f"m{i}".encode()))
        tasks = [
            asyncio.create_task(producer.send(Message("t", f"x{i}".encode()))) for i in range(5)
        ]
        await wait_for(lambda: producer._enqueued == 7, 5)  # all queued, the sender stuck
        started = time.monotonic()
        await producer.shutdown(100)
        took = time.monotonic() - started
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, IllegalStateError | SendTimeoutError) for o in outcomes)
        return took

    took = asyncio.run(main())
    assert took < 1.0, f"shutdown(100) took {took:.2f} s"
