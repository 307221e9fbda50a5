"""The asyncio API: RocketMQ's names and semantics for ``async`` code.

::

    from bridge import Message
    from bridge.aio import Producer

    async with Producer("my_group", bootstrap_servers="127.0.0.1:9092") as producer:
        result = await producer.send(Message("orders", b"hello", keys="order-1"))

:class:`Producer`, :class:`TransactionMQProducer`, :class:`PushConsumer` and
:class:`SimpleConsumer` are fronts over
the threaded clients of the same names, which keep every rule (checks before sending, half
messages and their END records, retry routes, the DLQ, offsets, shutdown); listeners may be
``async def`` and run on the event loop. No call on the loop waits for Kafka: librdkafka is
called on the clients' own threads. See ``docs/asyncio.md``.
"""

from bridge.aio.consumer import PushConsumer
from bridge.aio.listeners import (
    AsyncMessageListenerConcurrently,
    AsyncMessageListenerOrderly,
    AsyncTransactionListener,
)
from bridge.aio.producer import Producer
from bridge.aio.simple_consumer import SimpleConsumer
from bridge.aio.transaction import TransactionMQProducer
from bridge.client.send_results import SendResult, SendStatus
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    FilterExpression,
    FilterExpressionType,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageSelector,
)
from bridge.consumer.simple import MessageView
from bridge.transaction.model import TransactionListener, TransactionStatus
from bridge.transaction.producer import TransactionSendResult

__all__ = [
    "AsyncMessageListenerConcurrently",
    "AsyncMessageListenerOrderly",
    "AsyncTransactionListener",
    "ConsumeConcurrentlyContext",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "FilterExpression",
    "FilterExpressionType",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageSelector",
    "MessageView",
    "Producer",
    "PushConsumer",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TransactionListener",
    "TransactionMQProducer",
    "TransactionSendResult",
    "TransactionStatus",
]
