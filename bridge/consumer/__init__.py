"""The push consumer (concurrent and orderly listeners) and the simple consumer (receive, ack,
invisible durations), with retry topics and the dead-letter queue."""

from bridge.consumer.config import PushConsumerConfig, SimpleConsumerConfig
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
from bridge.consumer.simple import MessageView
from bridge.consumer.simple_consumer import SimpleConsumer

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
    "MessageView",
    "PushConsumer",
    "PushConsumerConfig",
    "ReplayTarget",
    "SimpleConsumer",
    "SimpleConsumerConfig",
    "TagFilter",
]
