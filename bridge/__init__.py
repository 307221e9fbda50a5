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

from importlib import metadata as _metadata

from bridge.client import Producer, SendResult, SendStatus, read_messages
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
from bridge.message import Message, MessageConst, MessageExt
from bridge.transaction import (
    HalfMessage,
    TransactionListener,
    TransactionMQProducer,
    TransactionSendResult,
    TransactionStatus,
)

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
