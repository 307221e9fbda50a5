"""Apache RocketMQ's reliable-messaging semantics on Apache Kafka.

Public API (RocketMQ's names)::

    from bridge import Message, Producer

    with Producer("my_group", bootstrap_servers="127.0.0.1:9092") as producer:
        result = producer.send_sync(Message("orders", b"hello", keys="order-1", tags="TagA"))

    consumer = PushConsumer("my_consumer_group", bootstrap_servers="127.0.0.1:9092")
    consumer.subscribe("orders", lambda msg: ConsumeStatus.CONSUME_SUCCESS, "TagA || TagB")
    # or MessageSelector.by_sql("TAGS = 'TagA' AND amount > 100") for RocketMQ's SQL92 filter
    with consumer:
        ...
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.client import (
        Producer,
        SendResult,
        SendStatus,
        read_messages,
    )
    from bridge.config import ClientConfig
    from bridge.consumer import (
        ConsumeConcurrentlyContext,
        ConsumeFromWhere,
        ConsumeOrderlyContext,
        ConsumeOrderlyStatus,
        ConsumeStatus,
        FilterExpression,
        FilterExpressionType,
        MessageListenerConcurrently,
        MessageListenerOrderly,
        MessageModel,
        MessageSelector,
        MessageView,
        PushConsumer,
        PushConsumerConfig,
        SimpleConsumer,
        SimpleConsumerConfig,
    )
    from bridge.errors import (
        BridgeError,
        FilterExpressionError,
        InvalidDelayError,
        InvalidReceiptHandleError,
        RecallTooLateError,
    )
    from bridge.message import (
        Message,
        MessageConst,
        MessageExt,
    )
    from bridge.transaction import (
        HalfMessage,
        TransactionListener,
        TransactionMQProducer,
        TransactionSendResult,
        TransactionStatus,
    )

_EXPORTS: dict[str, str] = {
    "Producer": "bridge.client",
    "SendResult": "bridge.client",
    "SendStatus": "bridge.client",
    "read_messages": "bridge.client",
    "ClientConfig": "bridge.config",
    "ConsumeConcurrentlyContext": "bridge.consumer",
    "ConsumeFromWhere": "bridge.consumer",
    "ConsumeOrderlyContext": "bridge.consumer",
    "ConsumeOrderlyStatus": "bridge.consumer",
    "ConsumeStatus": "bridge.consumer",
    "FilterExpression": "bridge.consumer",
    "FilterExpressionType": "bridge.consumer",
    "MessageListenerConcurrently": "bridge.consumer",
    "MessageListenerOrderly": "bridge.consumer",
    "MessageModel": "bridge.consumer",
    "MessageSelector": "bridge.consumer",
    "MessageView": "bridge.consumer",
    "PushConsumer": "bridge.consumer",
    "PushConsumerConfig": "bridge.consumer",
    "SimpleConsumer": "bridge.consumer",
    "SimpleConsumerConfig": "bridge.consumer",
    "BridgeError": "bridge.errors",
    "FilterExpressionError": "bridge.errors",
    "InvalidDelayError": "bridge.errors",
    "InvalidReceiptHandleError": "bridge.errors",
    "RecallTooLateError": "bridge.errors",
    "Message": "bridge.message",
    "MessageConst": "bridge.message",
    "MessageExt": "bridge.message",
    "HalfMessage": "bridge.transaction",
    "TransactionListener": "bridge.transaction",
    "TransactionMQProducer": "bridge.transaction",
    "TransactionSendResult": "bridge.transaction",
    "TransactionStatus": "bridge.transaction",
}
"""Where each public name lives. Imported when first asked for (PEP 562): ``import bridge.cli``
or ``bridge.errors`` does not load the clients, which take most of a command's start-up."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once
    return value


_HELPERS = frozenset({"annotations", "importlib", "TYPE_CHECKING", "Any"})
"""This module's own imports, kept out of ``dir(bridge)`` (they are no public names)."""


def __dir__() -> list[str]:
    return sorted((set(globals()) - _HELPERS) | set(_EXPORTS))


try:  # one source for the version: the installed package's metadata (pyproject.toml)
    __version__ = _metadata.version("rocketmq-kafka-bridge")
except _metadata.PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

__all__ = [
    "BridgeError",
    "ClientConfig",
    "ConsumeConcurrentlyContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "FilterExpression",
    "FilterExpressionError",
    "FilterExpressionType",
    "HalfMessage",
    "InvalidDelayError",
    "InvalidReceiptHandleError",
    "Message",
    "MessageConst",
    "MessageExt",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageModel",
    "MessageSelector",
    "MessageView",
    "Producer",
    "PushConsumer",
    "PushConsumerConfig",
    "RecallTooLateError",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "SimpleConsumerConfig",
    "TransactionListener",
    "TransactionMQProducer",
    "TransactionSendResult",
    "TransactionStatus",
    "__version__",
    "read_messages",
]
