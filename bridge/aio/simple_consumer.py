"""The asyncio ``SimpleConsumer``: ``await receive(...)``, ``await ack(msg)``.

A front over the threaded :class:`bridge.consumer.SimpleConsumer`, which keeps every rule:
the leases and their deadlines, the retry and DLQ copies, the offsets, the rebalances. Where
the work runs:

* ``receive`` waits (up to ``await_duration``) on a thread of the consumer's own pool, never
  on the loop, so receives waiting never hold up a ``shutdown`` or the loop's default
  executor; a ``receive`` task cancelled while it waits gives back what it took (the
  messages are offered again, the same delivery, as if never received);
* ``ack`` and ``change_invisible_duration`` run on the loop: they change the consumer's
  bookkeeping in memory, under locks held for microseconds, and never wait for Kafka (the
  offsets are committed by the consumer's poll thread);
* ``startup`` and ``shutdown`` run on a thread (they talk to the broker).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from bridge.aio.runner import AsyncClient
from bridge.client_configuration import ClientConfiguration
from bridge.config import ClientConfig
from bridge.consumer.config import SimpleConsumerConfig
from bridge.consumer.counters import ConsumerStats
from bridge.consumer.model import FilterExpression
from bridge.consumer.simple import MessageView
from bridge.consumer.simple_consumer import DEFAULT_AWAIT_DURATION_S
from bridge.consumer.simple_consumer import SimpleConsumer as ThreadedSimpleConsumer
from bridge.lifecycle import ServiceState
from bridge.serialization import Deserializer

__all__ = ["SimpleConsumer"]

RECEIVE_THREADS: Final = 32
"""Threads a consumer's receives wait on at most; more concurrent receives queue for one."""


class SimpleConsumer(AsyncClient):
    """RocketMQ 5's ``SimpleConsumer`` under asyncio: the threaded
    :class:`bridge.SimpleConsumer`'s arguments, semantics and errors, with ``async``
    :meth:`startup`, :meth:`receive`, :meth:`ack`, :meth:`change_invisible_duration` and
    :meth:`shutdown` (or ``async with``)."""

    def __init__(
        self,
        client_configuration: ClientConfiguration | ClientConfig | None = None,
        consumer_group: str | None = None,
        subscription: Mapping[str, FilterExpression | str] | None = None,
        await_duration: float = DEFAULT_AWAIT_DURATION_S,
        tls_enable: bool | None = None,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        settings: SimpleConsumerConfig | None = None,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        **options: Any,
    ) -> None:
        """The arguments of :class:`bridge.SimpleConsumer`, with the same meaning."""
        self._consumer = ThreadedSimpleConsumer(
            client_configuration,
            consumer_group,
            subscription,
            await_duration,
            tls_enable,
            kafka_config=kafka_config,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
            settings=settings,
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            **options,
        )
        self._receivers = ThreadPoolExecutor(
            RECEIVE_THREADS, thread_name_prefix=f"bridge-receive-{self._consumer.consumer_group}"
        )

    @property
    def threaded(self) -> ThreadedSimpleConsumer:
        """The threaded consumer doing the work."""
        return self._consumer

    @property
    def consumer_group(self) -> str:
        """The consumer group."""
        return self._consumer.consumer_group

    @property
    def state(self) -> ServiceState:
        """The consumer's lifecycle state."""
        return self._consumer.state

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters (``consumed``: messages acked)."""
        return self._consumer.stats()

    def subscribe(
        self, topic: str, filter_expression: FilterExpression | str | None = None
    ) -> None:
        """See :meth:`bridge.SimpleConsumer.subscribe` (never waits)."""
        self._consumer.subscribe(topic, filter_expression)

    def unsubscribe(self, topic: str) -> None:
        """See :meth:`bridge.SimpleConsumer.unsubscribe` (never waits)."""
        self._consumer.unsubscribe(topic)

    async def startup(self) -> None:
        """Join the group and start fetching (see :meth:`bridge.SimpleConsumer.startup`)."""
        await asyncio.to_thread(self._consumer.startup)

    async def start(self) -> None:
        """:meth:`startup`."""
        await self.startup()

    async def shutdown(self, timeout_ms: int | None = None) -> None:
        """Leave the group (see :meth:`bridge.SimpleConsumer.shutdown`); a receive still
        waiting raises :class:`~bridge.errors.IllegalStateError` as it begins."""
        try:
            await asyncio.to_thread(self._consumer.shutdown, timeout_ms)
        finally:
            self._receivers.shutdown(wait=False)

    async def receive(self, max_message_num: int, invisible_duration: float) -> list[MessageView]:
        """Up to ``max_message_num`` messages, each invisible for ``invisible_duration``
        seconds (see :meth:`bridge.SimpleConsumer.receive`). Cancelled while it waits, it
        gives back what it took."""
        consumer = self._consumer
        loop = asyncio.get_running_loop()
        taken = loop.run_in_executor(
            self._receivers,
            functools.partial(consumer.receive, max_message_num, invisible_duration),
        )
        try:
            return await asyncio.shield(taken)
        except asyncio.CancelledError:
            taken.add_done_callback(self._give_back)
            raise

    def _give_back(self, taken: asyncio.Future[list[MessageView]]) -> None:
        if taken.cancelled() or taken.exception() is not None:
            return
        self._consumer.give_back(taken.result())

    async def ack(self, message: MessageView) -> None:
        """See :meth:`bridge.SimpleConsumer.ack` (never waits)."""
        self._consumer.ack(message)

    async def change_invisible_duration(
        self, message: MessageView, invisible_duration: float
    ) -> None:
        """See :meth:`bridge.SimpleConsumer.change_invisible_duration` (never waits)."""
        self._consumer.change_invisible_duration(message, invisible_duration)
