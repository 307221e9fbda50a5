"""Apache RocketMQ's reliable-messaging semantics on Apache Kafka.

Public API (RocketMQ's names)::

    from bridge import Message, Producer

    with Producer("my_group", bootstrap_servers="127.0.0.1:9092") as producer:
        result = producer.send_sync(Message("orders", b"hello", keys="order-1", tags="TagA"))
"""

from bridge.client import Producer, SendResult, SendStatus, read_messages
from bridge.config import ClientConfig
from bridge.errors import BridgeError
from bridge.message import Message, MessageConst, MessageExt
from bridge.transaction import (
    TransactionListener,
    TransactionMQProducer,
    TransactionSendResult,
    TransactionStatus,
)

__version__ = "0.1.0"

__all__ = [
    "BridgeError",
    "ClientConfig",
    "Message",
    "MessageConst",
    "MessageExt",
    "Producer",
    "SendResult",
    "SendStatus",
    "TransactionListener",
    "TransactionMQProducer",
    "TransactionSendResult",
    "TransactionStatus",
    "__version__",
    "read_messages",
]
