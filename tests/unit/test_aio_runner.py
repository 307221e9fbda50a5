"""The pure parts of the asyncio API: listener calls from threads onto the loop, send outcomes
handed back in batches, listener wrapping and argument checks (no broker)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bridge.aio import (
    Producer,
    TransactionMQProducer,
)
from bridge.aio.producer import _Completions
from bridge.aio.runner import CancelScope, LoopRunner, call_listener
from bridge.client.send_results import SendResult, SendStatus
from bridge.consumer.model import (
    ConsumeOrderlyStatus,
    ConsumeStatus,
)
from bridge.errors import (
    EventLoopClosedError,
    IllegalStateError,
    InvalidArgumentError,
    SendTimeoutError,
)
from bridge.lifecycle import ServiceState
from bridge.message import Message

LATER = ConsumeStatus.RECONSUME_LATER


def on_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on a thread of its own; its outcome as an awaitable future."""
    return asyncio.wrap_future(ThreadPoolExecutor(1).submit(fn))


def bound_runner() -> LoopRunner:
    runner = LoopRunner("test")
    runner.bind(asyncio.get_running_loop())
    return runner


def test_a_plain_result_is_returned_without_the_loop() -> None:
    runner = LoopRunner("test")  # not even bound: no loop is needed
    assert runner.resolve(ConsumeStatus.CONSUME_SUCCESS, LATER) is ConsumeStatus.CONSUME_SUCCESS


def test_a_coroutine_runs_on_the_loop_while_the_calling_thread_waits() -> None:
    async def main() -> None:
        runner = bound_runner()
        loop_thread = threading.get_ident()
        ran_on: list[int] = []

        async def listener() -> ConsumeStatus:
            ran_on.append(threading.get_ident())
            await asyncio.sleep(0.01)
            return ConsumeStatus.CONSUME_SUCCESS

        caller: list[int] = []

        def call() -> object:
            caller.append(threading.get_ident())
            return runner.resolve(listener(), LATER)

        assert await on_thread(call) is ConsumeStatus.CONSUME_SUCCESS
        assert ran_on == [loop_thread] and caller != [loop_thread]
        assert runner.running == 0

    asyncio.run(main())


def test_an_exception_reaches_the_calling_thread_as_a_plain_listener_s_would() -> None:
    async def main() -> None:
        runner = bound_runner()

        async def listener() -> None:
            raise TimeoutError("db timed out")  # the same class a thread's wait could raise

        with pytest.raises(TimeoutError, match="db timed out"):
            await on_thread(lambda: runner.resolve(listener(), LATER))

    asyncio.run(main())


def test_another_clients_closed_loop_raised_by_a_listener_is_the_listeners_failure() -> None:
    # EventLoopClosedError from resolve() tells the consumer "not run: leave the messages to
    # the group" and the client is shut down; a listener that lets another client's one
    # through must not make this client hold its messages while it goes on running.
    async def main() -> None:
        runner = bound_runner()

        async def listener() -> None:
            raise EventLoopClosedError("another client: the event loop is closed")

        with pytest.raises(IllegalStateError) as raised:
            await on_thread(lambda: runner.resolve(listener(), LATER))
        assert not isinstance(raised.value, EventLoopClosedError)
        assert "another client" in str(raised.value)

    asyncio.run(main())


def test_a_listener_cancelling_itself_gives_the_cancel_value() -> None:
    async def main() -> None:
        runner = bound_runner()

        async def listener() -> ConsumeStatus:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(1)
            return ConsumeStatus.CONSUME_SUCCESS

        assert await on_thread(lambda: runner.resolve(listener(), LATER)) is LATER

    asyncio.run(main())


def test_cancel_all_cancels_running_listeners() -> None:
    async def main() -> None:
        runner = bound_runner()
        started = asyncio.Event()

        async def listener() -> ConsumeOrderlyStatus:
            started.set()
            await asyncio.sleep(60)
            return ConsumeOrderlyStatus.SUCCESS

        suspend = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        waiting = on_thread(lambda: runner.resolve(listener(), suspend))
        await started.wait()
        assert runner.running == 1
        assert runner.cancel_all() == 1
        assert await asyncio.wait_for(waiting, 5) is suspend

    asyncio.run(main())


def test_a_scope_cancelled_first_never_runs_the_listener() -> None:
    async def main() -> None:
        runner = bound_runner()
        calls: list[str] = []

        async def listener() -> str:
            calls.append("ran")
            return "ran"

        scope = CancelScope()
        scope.cancel()
        assert await on_thread(lambda: call_listener(runner, listener, "cancelled", scope)) == (
            "cancelled"
        )
        # Cancelled after the thread made the coroutine but before the loop started it.
        late = CancelScope()
        gate = threading.Event()

        def make() -> Any:
            coroutine = listener()
            gate.wait()
            return coroutine

        waiting = on_thread(lambda: call_listener(runner, make, "cancelled", late))
        late.cancel()
        gate.set()
        assert await waiting == "cancelled"
        assert calls == []

    asyncio.run(main())


def test_a_scope_cancels_a_running_listener() -> None:
    async def main() -> None:
        runner = bound_runner()
        started = asyncio.Event()

        async def listener() -> str:
            started.set()
            await asyncio.sleep(60)
            return "finished"

        scope = CancelScope()
        waiting = on_thread(lambda: call_listener(runner, listener, "cancelled", scope))
        await started.wait()
        scope.cancel()
        assert await asyncio.wait_for(waiting, 5) == "cancelled"

    asyncio.run(main())


def test_a_closed_loop_is_a_clear_error_not_a_hang() -> None:
    loop = asyncio.new_event_loop()
    runner = LoopRunner("consumer x")
    runner.bind(loop)
    loop.close()

    async def listener() -> None:
        return None

    with pytest.raises(IllegalStateError, match="consumer x: the event loop is closed"):
        runner.resolve(listener(), LATER)


def test_a_loop_closed_under_a_listener_whose_clean_up_awaits_is_not_run() -> None:
    # The listener is suspended in its task when its loop is stopped and closed by hand.
    # Closing its coroutine from the waiting thread ran its clean-up there, and the
    # RuntimeError that raised ("coroutine ignored GeneratorExit") was taken for the
    # listener's failure instead of "not run".
    loop = asyncio.new_event_loop()
    runner = LoopRunner("consumer x")
    runner.bind(loop)
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    entered = threading.Event()
    quiet = False  # once the test is done: the clean-up stops awaiting, so it closes

    async def listener() -> None:
        try:
            entered.set()
            await asyncio.sleep(60)
        finally:
            if not quiet:
                await asyncio.sleep(0)

    outcome: list[BaseException] = []
    made = listener()

    def call() -> None:
        try:
            runner.resolve(made, LATER)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert entered.wait(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    caller.join(10)
    assert [type(e) for e in outcome] == [EventLoopClosedError], outcome
    quiet = True
    made.close()


def test_a_task_a_listener_left_running_is_not_the_listener_once_it_returned() -> None:
    async def main() -> None:
        runner = bound_runner()
        seen: list[tuple[str, bool]] = []
        go_on = asyncio.Event()
        left: list[asyncio.Task[None]] = []

        async def detached() -> None:
            await go_on.wait()
            seen.append(("left running", runner.runs_current_task()))

        async def child() -> None:
            seen.append(("child", runner.runs_current_task()))

        async def listener() -> ConsumeStatus:
            seen.append(("listener", runner.runs_current_task()))
            await asyncio.wait_for(child(), 5)
            left.append(asyncio.create_task(detached()))
            return ConsumeStatus.CONSUME_SUCCESS

        assert await on_thread(lambda: runner.resolve(listener(), LATER)) is not LATER
        go_on.set()
        await left[0]
        assert seen == [("listener", True), ("child", True), ("left running", False)]
        assert not runner.runs_current_task()

    asyncio.run(main())


def test_send_outcomes_reach_the_loop_in_one_batch_and_skip_cancelled_futures() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        completions = _Completions(loop)
        futures = [loop.create_future() for _ in range(100)]
        futures[3].cancel()
        result = SendResult(SendStatus.SEND_OK, "id", 7, "orders", 0)
        scheduled: list[object] = []
        original = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any) -> Any:
            scheduled.append(callback)
            return original(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]

        def report() -> None:
            for i, future in enumerate(futures):
                if i == 5:
                    completions.put(future, ValueError("refused"), True)
                else:
                    completions.put(future, result, False)

        # The loop is held (as a busy loop would be) while the reports arrive.
        reporter = threading.Thread(target=report)
        reporter.start()
        reporter.join()
        await asyncio.gather(*futures[:3])
        assert len(scheduled) == 1, "one wake-up for the whole batch"
        assert futures[0].result() is result and futures[99].result() is result
        assert futures[3].cancelled()
        with pytest.raises(ValueError, match="refused"):
            futures[5].result()

    asyncio.run(main())


def test_bad_arguments_are_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="max_queued_sends must be positive"):
        Producer("g", bootstrap_servers="127.0.0.1:1", max_queued_sends=0)
    with pytest.raises(InvalidArgumentError, match="max_queued_sends must be an int"):
        Producer("g", bootstrap_servers="127.0.0.1:1", max_queued_sends=True)
    with pytest.raises(InvalidArgumentError, match="max_concurrent_sends must be positive"):
        TransactionMQProducer("g", None, bootstrap_servers="127.0.0.1:1", max_concurrent_sends=0)


def test_using_a_client_before_start_is_a_clear_error() -> None:
    async def main() -> None:
        producer = Producer("g", bootstrap_servers="127.0.0.1:1")
        with pytest.raises(IllegalStateError, match="call start"):
            await producer.send(Message("orders", b"x"))
        with pytest.raises(IllegalStateError, match="call start"):
            await producer.send_oneway(Message("orders", b"x"))
        tx = TransactionMQProducer("g", None, bootstrap_servers="127.0.0.1:1")
        with pytest.raises(IllegalStateError, match="no transaction listener"):
            await tx.start()
        assert tx.listener is None

    asyncio.run(main())


def test_an_unreachable_broker_fails_each_send_with_a_timeout() -> None:
    async def main() -> None:
        async with Producer(
            "g", bootstrap_servers="127.0.0.1:1", send_msg_timeout_ms=1000
        ) as producer:
            started = time.monotonic()
            # librdkafka's report ("send of <id> to orders: ...") or, when the hand-over to
            # librdkafka came late on a busy machine, the front's own timer ("send to orders").
            with pytest.raises(SendTimeoutError, match=r"send (of \w+ )?to orders"):
                await producer.send(Message("orders", b"x"))
            assert time.monotonic() - started < 1.0 + 1.0 + 1.0  # the timeout, grace, slack
            results = await producer.send_batch([Message("orders", b"y")] * 3)
            assert [type(r) for r in results] == [SendTimeoutError] * 3
            assert await producer.send_oneway(Message("orders", b"z"))
        assert producer.state is ServiceState.SHUTDOWN_ALREADY
        with pytest.raises(IllegalStateError):
            await producer.send(Message("orders", b"x"))

    asyncio.run(main())
