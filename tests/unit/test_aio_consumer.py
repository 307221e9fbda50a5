"""The asyncio consumer's listener wrapping (no broker): each kind of listener keeps its kind
and runs on the loop; a cancelled one is a failure; what is no listener is refused as by the
threaded consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bridge.aio import AsyncMessageListenerConcurrently, AsyncMessageListenerOrderly, PushConsumer
from bridge.aio.consumer import on_loop
from bridge.aio.runner import LoopRunner
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageQueue,
)
from bridge.errors import InvalidArgumentError
from bridge.message import MessageExt

LATER = ConsumeStatus.RECONSUME_LATER


def on_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on a thread of its own; its outcome as an awaitable future."""
    return asyncio.wrap_future(ThreadPoolExecutor(1).submit(fn))


def bound_runner() -> LoopRunner:
    runner = LoopRunner("test")
    runner.bind(asyncio.get_running_loop())
    return runner


class Batch(MessageListenerConcurrently):
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS


class AsyncBatch(AsyncMessageListenerConcurrently):
    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        context.ack_index = 0
        return ConsumeStatus.CONSUME_SUCCESS


class AsyncInOrder(AsyncMessageListenerOrderly):
    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        raise asyncio.CancelledError


def test_wrapped_listeners_keep_their_kind_and_run_on_the_loop() -> None:
    async def main() -> None:
        runner = bound_runner()
        assert isinstance(on_loop(Batch(), runner), MessageListenerConcurrently)
        concurrent = on_loop(AsyncBatch(), runner)
        assert isinstance(concurrent, MessageListenerConcurrently)
        orderly = on_loop(AsyncInOrder(), runner)
        assert isinstance(orderly, MessageListenerOrderly)
        assert not isinstance(orderly, MessageListenerConcurrently)
        msg = MessageExt("orders", b"x")
        context = ConsumeConcurrentlyContext(MessageQueue("orders", 0))
        assert isinstance(concurrent, MessageListenerConcurrently)
        done = await on_thread(lambda: concurrent.consume_message([msg, msg], context))
        assert done is ConsumeStatus.CONSUME_SUCCESS and context.ack_index == 0
        assert isinstance(orderly, MessageListenerOrderly)
        suspended = await on_thread(
            lambda: orderly.consume_message([msg], ConsumeOrderlyContext(MessageQueue("o", 0)))
        )
        assert suspended is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

        async def per_message(m: MessageExt) -> ConsumeStatus:
            raise asyncio.CancelledError

        callback = on_loop(per_message, runner)
        assert callable(callback)
        assert await on_thread(lambda: callback(msg)) is LATER
        assert on_loop("not a listener", runner) == "not a listener"

    asyncio.run(main())


def test_what_is_no_listener_is_refused_as_by_the_threaded_consumer() -> None:
    consumer = PushConsumer("g", bootstrap_servers="127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="the listener must be"):
        consumer.subscribe("orders", "not a listener")
    with pytest.raises(InvalidArgumentError, match="a listener is required"):
        consumer.subscribe("orders", None)
    consumer.subscribe("orders", AsyncInOrder())
    assert consumer.orderly, "an orderly listener makes the consumer orderly, as in threads"
    with pytest.raises(InvalidArgumentError, match="a concurrent listener on an orderly"):
        consumer.subscribe("other", AsyncBatch())


def test_the_asyncio_api_offers_the_selectors_and_checks_them_at_subscribe() -> None:
    import bridge
    import bridge.aio
    from bridge.errors import FilterExpressionError

    for name in ("MessageSelector", "FilterExpression", "FilterExpressionType"):
        assert name in bridge.aio.__all__ and getattr(bridge.aio, name) is getattr(bridge, name)
    consumer = PushConsumer("aio_sql92_unit", bootstrap_servers="127.0.0.1:1")
    with pytest.raises(FilterExpressionError) as caught:
        consumer.subscribe("orders", print, bridge.aio.MessageSelector.by_sql("a = NULL"))
    assert (caught.value.position, caught.value.found) == (4, "NULL")


def test_the_asyncio_consumer_is_fifo_as_the_threaded_one_and_takes_async_callables() -> None:
    consumer = PushConsumer("g", bootstrap_servers="127.0.0.1:1", fifo=True)
    assert consumer.fifo and consumer.threaded.fifo and not consumer.orderly

    async def listener(msg: MessageExt) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS

    consumer.subscribe("orders", listener)
    with pytest.raises(InvalidArgumentError, match="FIFO consumer calls its listener"):
        consumer.subscribe("other", AsyncInOrder())
