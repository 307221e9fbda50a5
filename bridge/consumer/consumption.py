"""How held messages reach a listener: what the concurrent and the orderly strategy share.

:class:`~bridge.consumer.concurrent.ConcurrentConsumption` runs a partition's messages on many
threads at once and sends failures back; :class:`~bridge.consumer.orderly.OrderlyConsumption`
runs each partition one batch at a time and retries a failure in place. Both call listeners
the same way (:meth:`Consumption._call_listener`) and hand failures to one
:class:`~bridge.consumer.retry_policy.RetryPolicy`.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable
from typing import ClassVar, Generic, TypeVar, cast

from bridge.consumer.context import ConsumerContext, Listener, MessageCallback
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    effective_max_reconsume_times,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Quarantine
from bridge.consumer.retry_policy import RetryPolicy
from bridge.message import MessageExt

logger = logging.getLogger(__name__)

ContextT = TypeVar("ContextT", ConsumeConcurrentlyContext, ConsumeOrderlyContext)
BatchListener = MessageListenerConcurrently | MessageListenerOrderly


def leading_successes(callback: MessageCallback, msgs: list[MessageExt]) -> int:
    """Call a per-message listener on ``msgs`` in order until one fails (a failure status,
    None or an exception); return how many succeeded."""
    for index, msg in enumerate(msgs):
        try:
            result = callback(msg)
        except Exception:
            logger.warning("listener raised on %s: a failure", msg.msg_id, exc_info=True)
            return index
        if (
            result is not ConsumeStatus.CONSUME_SUCCESS
            and result is not ConsumeOrderlyStatus.SUCCESS
        ):
            if result is None:
                logger.warning("listener returned None for %s: a failure", msg.msg_id)
            return index
    return len(msgs)


class Consumption(abc.ABC, Generic[ContextT]):
    """A consumption strategy: takes a partition's newly held messages (:meth:`submit`) and
    runs the listeners on the consumer's pool."""

    orderly: ClassVar[bool]
    """True for the orderly strategy (retry budget, revoke wait)."""
    _BATCH_LISTENER: ClassVar[type[BatchListener]]
    """The listener class that takes whole batches here (anything else is a callable)."""
    _LISTENER_RAISED: ClassVar[str]
    """The warning logged when a batch listener raises (``%s``: the message ids)."""

    def __init__(self, context: ConsumerContext, quarantine: Quarantine) -> None:
        self._context = context
        self.policy = RetryPolicy(
            context,
            quarantine,
            max_reconsume_times=effective_max_reconsume_times(
                context.settings.max_reconsume_times, orderly=self.orderly
            ),
            redeliver=self._redeliver,
        )

    @abc.abstractmethod
    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Hand ``msgs``, newly held in ``pq`` in offset order, to the listener."""

    @abc.abstractmethod
    def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Hand held ``msgs`` of ``pq`` to the listener again (a local retry is due)."""

    def expire_overdue(self, queues: Iterable[ProcessQueue]) -> None:
        """Called on each poll with every partition held: act on messages that have been in
        their listener too long. Nothing by default."""

    @abc.abstractmethod
    def _consume_batch(
        self, listener: BatchListener, msgs: list[MessageExt], context: ContextT
    ) -> int:
        """Hand ``msgs`` to a batch listener: how many leading messages it consumed, read
        from its status and ``context``. Raises what the listener raises."""

    def _call_listener(self, listener: Listener, msgs: list[MessageExt], context: ContextT) -> int:
        """Run ``listener`` on ``msgs``: how many leading messages it consumed. A listener
        object of this strategy's kind takes the batch and ``context``; a callable is called
        per message until one fails. An exception counts as a failure of the whole batch
        (logged)."""
        if isinstance(listener, self._BATCH_LISTENER):
            try:
                return self._consume_batch(listener, msgs, context)
            except Exception:
                logger.warning(self._LISTENER_RAISED, [m.msg_id for m in msgs], exc_info=True)
                return 0
        # subscribe() refuses a listener object of the other kind: this is a callable.
        return leading_successes(cast(MessageCallback, listener), msgs)
