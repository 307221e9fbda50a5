"""The push consumer: concurrent and orderly listeners, retry topics and the dead-letter queue."""

from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    MessageQueue,
    TagFilter,
)
from bridge.consumer.push_consumer import ConsumerStats, PushConsumer
from bridge.consumer.send_back import ReplayTarget

__all__ = [
    "ConsumeConcurrentlyContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "ConsumerStats",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageModel",
    "MessageQueue",
    "PushConsumer",
    "PushConsumerConfig",
    "ReplayTarget",
    "TagFilter",
]
