"""Listener base classes whose methods are ``async def``.

They mirror the threaded API's listener classes with coroutine methods; the asyncio consumer
tells a batch listener from a per-message callable, and an orderly one from a concurrent one,
by these classes or the threaded ones. The threaded classes work too (``consume_message``
may be ``async def`` in a subclass of them, at the cost of a type checker's complaint), any
object with the two methods is a transaction listener, and an ``async def`` function is a
per-message listener.
"""

from __future__ import annotations

import abc
from typing import Any

from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
)
from bridge.message import MessageExt
from bridge.transaction.model import TransactionStatus

__all__ = [
    "AsyncMessageListenerConcurrently",
    "AsyncMessageListenerOrderly",
    "AsyncTransactionListener",
]


class AsyncMessageListenerConcurrently(abc.ABC):
    """A concurrent batch listener (see :class:`bridge.MessageListenerConcurrently`)."""

    @abc.abstractmethod
    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        """Consume ``msgs``; an exception or a cancellation counts as RECONSUME_LATER."""


class AsyncMessageListenerOrderly(abc.ABC):
    """An orderly batch listener (see :class:`bridge.MessageListenerOrderly`)."""

    @abc.abstractmethod
    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        """Consume ``msgs``; an exception or a cancellation counts as
        SUSPEND_CURRENT_QUEUE_A_MOMENT."""


class AsyncTransactionListener(abc.ABC):
    """A transaction listener (see :class:`bridge.TransactionListener`)."""

    @abc.abstractmethod
    async def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        """Run the local transaction for ``msg``; an exception or a cancellation is UNKNOWN."""

    @abc.abstractmethod
    async def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        """Report the outcome of ``msg``'s local transaction; an exception or a cancellation
        is UNKNOWN."""
