"""RocketMQ 5's client API, as its Python client (``rocketmq``) names it, over the
project's clients: ``from bridge.v5 import ...`` where RocketMQ 5 code has ``from rocketmq
import ...``.

::

    from bridge.v5 import ClientConfiguration, Credentials, Message, Producer

    config = ClientConfiguration("127.0.0.1:9092", Credentials())
    producer = Producer(config, ("orders",))
    producer.startup()
    msg = Message()
    msg.topic, msg.body, msg.tag = "orders", b"created", "TagA"
    receipt = producer.send(msg)  # receipt.message_id
    producer.shutdown()

Each name is a thin front: a :class:`Producer` sends with :class:`bridge.Producer` and runs
transactions on :class:`bridge.TransactionMQProducer`'s half messages, a :class:`PushConsumer`
is a :class:`bridge.PushConsumer`, and :class:`bridge.SimpleConsumer`,
:class:`FilterExpression` and :class:`MessageView` are the project's own, so every guarantee
holds as documented for them.
``Producer``, ``PushConsumer`` and ``Message`` are not the top-level ``bridge`` names of the
same spelling (RocketMQ 4's): import them from here. How each name maps, and what differs
from RocketMQ 5, is in ``docs/v5-api.md``.
"""

from bridge.client_configuration import ClientConfiguration, Credentials
from bridge.consumer.model import FilterExpression, FilterExpressionType
from bridge.consumer.simple import MessageView
from bridge.consumer.simple_consumer import SimpleConsumer
from bridge.v5.message import Message, SendReceipt
from bridge.v5.producer import Producer
from bridge.v5.push_consumer import ConsumeResult, MessageListener, PushConsumer
from bridge.v5.transaction import Transaction, TransactionChecker, TransactionResolution

FilterType = FilterExpressionType
"""RocketMQ 5's Python client's name for a filter's type (``FilterType.TAG``,
``FilterType.SQL``): :class:`FilterExpressionType`."""

__all__ = [
    "ClientConfiguration",
    "ConsumeResult",
    "Credentials",
    "FilterExpression",
    "FilterExpressionType",
    "FilterType",
    "Message",
    "MessageListener",
    "MessageView",
    "Producer",
    "PushConsumer",
    "SendReceipt",
    "SimpleConsumer",
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
]
