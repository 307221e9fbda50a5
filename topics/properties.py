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
    TRACE_PARENT: Final = "traceparent"
    """Not a RocketMQ property: W3C Trace Context's ``traceparent``
    (``00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>``), lower case as the W3C and
    OpenTelemetry's Kafka propagation write it. The user's (or another Kafka client's), kept
    byte for byte through every copy (half message, commit, delay, retry, DLQ, replay)."""
    TRACE_STATE: Final = "tracestate"
    """Not a RocketMQ property: W3C Trace Context's ``tracestate``, the vendor ``key=value``
    pairs, comma-separated, that travel with ``traceparent``."""
    CONSUME_FAILURE: Final = "CONSUME_FAILURE"
    """Dead-letter metadata (not a RocketMQ property), written by a push consumer on each retry
    and DLQ copy: how the listener failed the message, last time: ``EXCEPTION`` (it raised; see
    the two ``CONSUME_EXCEPTION_*`` properties), the status it returned without raising
    (``RECONSUME_LATER``, ``SUSPEND_CURRENT_QUEUE_A_MOMENT``, ``NONE`` for ``None``),
    ``ACK_INDEX`` (past the ``ack_index`` of a batch listener that returned
    ``CONSUME_SUCCESS``, or an ``ack_index`` that is not an int), ``CONSUME_TIMEOUT`` (in its
    listener longer than ``consume_timeout``), ``NO_SUBSCRIPTION`` (a retry of a topic the
    group no longer subscribes to) or, written by a simple consumer, ``NOT_ACKED`` (not acked
    within its invisible duration)."""
    CONSUME_EXCEPTION_CLASS: Final = "CONSUME_EXCEPTION_CLASS"
    """Dead-letter metadata: the class of the exception the listener raised,
    ``module.QualifiedName`` (builtins by name alone, e.g. ``ValueError``), at most 1024 bytes;
    absent when it did not raise."""
    CONSUME_EXCEPTION_MESSAGE: Final = "CONSUME_EXCEPTION_MESSAGE"
    """Dead-letter metadata: ``str()`` of that exception, at most 1024 bytes of UTF-8
    (``bridge.message.FAILURE_MESSAGE_MAX_BYTES``; a longer one is cut at a character boundary
    and ends with ``...``); absent when it did not raise."""
    CONSUMER_GROUP: Final = "CONSUMER_GROUP"
    """Dead-letter metadata: the consumer group whose listener failed the message."""
    ORIGIN_KAFKA_TOPIC: Final = "ORIGIN_KAFKA_TOPIC"
    """Dead-letter metadata: the Kafka topic of the record the group first failed (the real
    topic's record, kept through later retries; ``RETRY_TOPIC`` has its RocketMQ name)."""
    ORIGIN_QUEUE_ID: Final = "ORIGIN_QUEUE_ID"
    """Dead-letter metadata: that record's partition."""
    ORIGIN_QUEUE_OFFSET: Final = "ORIGIN_QUEUE_OFFSET"
    """Dead-letter metadata: that record's offset."""
    ORIGIN_TIMESTAMP: Final = "ORIGIN_TIMESTAMP"
    """Dead-letter metadata: when that record was stored, its Kafka timestamp, epoch ms: the
    broker's append time where the topic keeps it, the time it was written for a copy (a
    delivered delay or transaction, a replay), else the born time."""

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

TRACE_PROPERTIES: Final = (MessageConst.TRACE_PARENT, MessageConst.TRACE_STATE)
"""The W3C Trace Context properties: the user's (or another Kafka client's), text or bytes like
any user property, and kept through every copy."""

DEAD_LETTER_PROPERTIES: Final = (
    MessageConst.CONSUME_FAILURE,
    MessageConst.CONSUME_EXCEPTION_CLASS,
    MessageConst.CONSUME_EXCEPTION_MESSAGE,
    MessageConst.CONSUMER_GROUP,
    MessageConst.ORIGIN_KAFKA_TOPIC,
    MessageConst.ORIGIN_QUEUE_ID,
    MessageConst.ORIGIN_QUEUE_OFFSET,
    MessageConst.ORIGIN_TIMESTAMP,
)
"""What a retry or DLQ copy records about the failure; a replay to the origin topic drops them
(the replayed record is a new first delivery)."""

RESERVED_PROPERTIES: Final = frozenset(
    v
    for k, v in vars(MessageConst).items()
    if k.isupper()
    and k != "KEY_SEPARATOR"
    and v not in USER_SETTABLE_PROPERTIES
    and v not in TRACE_PROPERTIES
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
    "CONSUME_FAILURE",
    "CONSUME_EXCEPTION_CLASS",
    "CONSUME_EXCEPTION_MESSAGE",
    "CONSUMER_GROUP",
    "ORIGIN_KAFKA_TOPIC",
    "ORIGIN_QUEUE_ID",
    "ORIGIN_QUEUE_OFFSET",
    "ORIGIN_TIMESTAMP",
]
"""The values of :data:`SYSTEM_PROPERTIES` as a type: ``get_property(MessageConst.X)`` is
``str | None``."""
