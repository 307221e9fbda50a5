"""The push consumer: concurrent and orderly listeners, retry topics and the dead-letter queue."""

from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.model import (
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
    MessageQueue,
    MessageSelector,
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
    "FilterExpression",
    "FilterExpressionType",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "PushConsumer",
    "PushConsumerConfig",
    "ReplayTarget",
    "TagFilter",
]
