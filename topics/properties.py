"""RocketMQ's property names, as they travel in Kafka headers: the bottom layer's names.

Every message property is a Kafka header under its RocketMQ name (``UNIQ_KEY``, ``TAGS``,
``KEYS``, ...). This module holds the names only, so light readers of the topics (the Spark
jobs) share them with the client without importing it.
"""

from __future__ import annotations

from typing import Final, Literal


class MessageConst:
    """RocketMQ's property names (``org.apache.rocketmq.common.message.MessageConst``)."""

    KEYS: Final = "KEYS"
    TAGS: Final = "TAGS"
    WAIT_STORE_MSG_OK: Final = "WAIT"
    DELAY_TIME_LEVEL: Final = "DELAY"
    RETRY_TOPIC: Final = "RETRY_TOPIC"
    REAL_TOPIC: Final = "REAL_TOPIC"
    REAL_QUEUE_ID: Final = "REAL_QID"
    TRANSACTION_PREPARED: Final = "TRAN_MSG"
    PRODUCER_GROUP: Final = "PGROUP"
    ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME: Final = "RECONSUME_TIME"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX: Final = "UNIQ_KEY"
    MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP: Final = "CONSUME_START_TIME"
    TRANSACTION_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
    TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
    TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
    TRANSACTION_ID: Final = "__transactionId__"
    SHARDING_KEY: Final = "__SHARDINGKEY"
    BORN_HOST: Final = "BORN_HOST"
    """Not a RocketMQ property (RocketMQ keeps it in the message header): the sender's host."""
    DELIVERY_ATTEMPTS: Final = "DELIVERY_ATTEMPTS"
    """Not a RocketMQ property: how many times delivering a delayed or committed message to
    its real topic failed so far; removed when it gets there."""
    DELIVERY_ERROR: Final = "DELIVERY_ERROR"
    """Not a RocketMQ property: why the last delivery attempt failed (at most 500 characters);
    removed when the message reaches its real topic."""
    BODY_OMITTED_BYTES: Final = "BODY_OMITTED_BYTES"
    """Not a RocketMQ property: a parked copy kept without its body, too large to be kept whole
    (the body's size in bytes); such a copy is never replayed."""

    KEY_SEPARATOR: Final = " "


DELAY_PROPERTIES: Final = (
    MessageConst.DELAY_TIME_LEVEL,
    MessageConst.TIMER_DELIVER_MS,
    MessageConst.TIMER_DELAY_MS,
    MessageConst.TIMER_DELAY_SEC,
)
"""Properties that make a message wait before delivery; removed when it is delivered."""

USER_SETTABLE_PROPERTIES: Final = frozenset({MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS})
"""System names RocketMQ users set through ``putUserProperty`` all the same."""

RESERVED_PROPERTIES: Final = frozenset(
    v
    for k, v in vars(MessageConst).items()
    if k.isupper() and k != "KEY_SEPARATOR" and v not in USER_SETTABLE_PROPERTIES
)
"""Names a user property may not take (RocketMQ's ``putUserProperty`` refuses them too)."""

SYSTEM_PROPERTIES: Final = RESERVED_PROPERTIES | USER_SETTABLE_PROPERTIES
"""Every :class:`MessageConst` name: their values are text."""

SystemPropertyName = Literal[
    "KEYS",
    "TAGS",
    "WAIT",
    "DELAY",
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "TRAN_MSG",
    "PGROUP",
    "ORIGIN_MESSAGE_ID",
    "RECONSUME_TIME",
    "UNIQ_KEY",
    "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "TIMER_DELIVER_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "__transactionId__",
    "__SHARDINGKEY",
    "BORN_HOST",
    "DELIVERY_ATTEMPTS",
    "DELIVERY_ERROR",
    "BODY_OMITTED_BYTES",
]
"""The values of :data:`SYSTEM_PROPERTIES` as a type: ``get_property(MessageConst.X)`` is
``str | None``."""
