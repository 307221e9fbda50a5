"""The consumers' settings: RocketMQ's ``DefaultMQPushConsumer`` fields and defaults, and a
simple consumer's (RocketMQ 5's ``SimpleConsumer``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Final, Self, TypeVar, cast

from bridge.consumer.model import ConsumeFromWhere, MessageModel
from bridge.errors import InvalidArgumentError, KafkaConfigError
from bridge.kafka_config import KafkaConfigParts
from bridge.settings import require_int, require_number


@dataclass(frozen=True, slots=True)
class PushConsumerConfig:
    """How a :class:`~bridge.consumer.PushConsumer` consumes. Validated on construction."""

    message_model: MessageModel = MessageModel.CLUSTERING
    """``CLUSTERING`` (a group shares the messages; failures are retried through the group's
    retry topic) or ``BROADCASTING`` (every instance gets every message; failures are dropped
    with a warning, as in RocketMQ)."""
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    """Where the group starts on a partition it has no committed offset for (retry topics always
    start from their first message)."""
    consume_timestamp_ms: int = 0
    """With CONSUME_FROM_TIMESTAMP: start at this time (epoch ms); 0 means half an hour ago."""
    consume_thread_count: int = 20
    """Threads that run the listener (RocketMQ's ``consumeThreadMin``/``Max``)."""
    consume_message_batch_max_size: int = 1
    """Most messages handed to the listener at once."""
    consume_inline_threshold_us: float = 100.0
    """A concurrent listener whose measured time per message (a moving average) is below this,
    in microseconds, runs on the thread that polled Kafka, each poll's messages in a row, with
    no hand-off to the listener threads; it goes back to those threads once its average is
    above 4 times this, or once the listener calls of one poll have held the poll thread for a
    second, a quarter of ``consume_timeout`` when that is shorter (the poll loop then goes on
    on a new thread, so rebalances, commits and ``consume_timeout`` wait at most that long for
    a listener; while that held thread's listener has not returned, every call goes to the
    listener threads). 0: always on the listener threads. Orderly and FIFO consumers always
    use the listener threads."""
    pull_batch_size: int = 32
    """Most records taken from Kafka per poll, per partition."""
    pull_threshold_for_queue: int = 1000
    """A partition with this many messages held (received, not yet done) stops fetching."""
    pull_threshold_size_for_queue: int = 100
    """A partition whose held messages take this many MiB (bodies, property names and values)
    stops fetching too, whichever threshold it reaches first. A partition goes over by one
    record at most: what a poll brings beyond that is left to Kafka and fetched again once the
    partition drops below both thresholds."""
    max_reconsume_times: int = -1
    """Failures before a message goes to the dead-letter queue; -1 means RocketMQ's default:
    16 for a concurrent listener, unlimited for an orderly one."""
    suspend_current_queue_time_millis: int = 1000
    """An orderly listener's failed batch is retried in place after this long, in ms."""
    send_back_retry_delay_ms: int = 5000
    """When a send-back fails, the message is consumed again locally after this long, in ms."""
    persist_consumer_offset_interval_ms: int = 5000
    """How often consumed offsets are committed to Kafka, in ms (also on rebalance and stop)."""
    consume_timeout: float = 15
    """Minutes a message may spend in a concurrent listener (RocketMQ's ``consumeTimeout``;
    fractions allowed: ``0.05`` is 3 s). A message still there after that is sent back for
    retry (delay level 3, through the retry topic, so its offset can be committed past), and
    the listener's result for it, when it finally returns, is ignored. An orderly consumer
    that loses a partition waits up to this long for the listener running it before it lets
    the partition go (the next owner never runs it meanwhile)."""
    drain_timeout_ms: int = 10_000
    """On a rebalance (concurrent listeners) and by default on shutdown, how long running
    listeners get to finish, in ms; what is still running afterwards is redelivered (its
    offset is not committed past) and its listener's late result ignored."""
    instance_name: str = ""
    """Names this consumer in BROADCASTING mode, where each instance keeps its own offsets;
    empty means ``<host>@<pid>``, RocketMQ's default."""

    def __post_init__(self) -> None:
        if not isinstance(self.message_model, MessageModel):
            raise InvalidArgumentError(
                f"message_model must be a MessageModel, got {self.message_model!r}"
            )
        _check_shared(self)
        require_int("consume_thread_count", self.consume_thread_count, minimum=1)
        require_int(
            "consume_message_batch_max_size", self.consume_message_batch_max_size, minimum=1
        )
        require_number("consume_timeout", self.consume_timeout)
        threshold = self.consume_inline_threshold_us
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise InvalidArgumentError(
                f"consume_inline_threshold_us must be a number, got {threshold!r}"
            )
        if not math.isfinite(threshold) or threshold < 0:
            raise InvalidArgumentError(
                "consume_inline_threshold_us must be 0 (never on the poll thread) or a "
                f"positive finite number of microseconds, got {threshold}"
            )
        require_int("max_reconsume_times", self.max_reconsume_times, minimum=-1)
        require_int(
            "suspend_current_queue_time_millis", self.suspend_current_queue_time_millis, minimum=0
        )
        if not isinstance(self.instance_name, str):
            raise InvalidArgumentError(
                f"instance_name must be a string, got {self.instance_name!r}"
            )

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (``None`` values are ignored); unknown names raise
        :class:`InvalidArgumentError`."""
        return _replaced(self, "push consumer", changes)


_Settings = TypeVar("_Settings")

_SHARED_MINIMUMS: Final = (
    ("consume_timestamp_ms", 0),
    ("pull_batch_size", 1),
    ("pull_threshold_for_queue", 1),
    ("pull_threshold_size_for_queue", 1),
    ("send_back_retry_delay_ms", 0),
    ("persist_consumer_offset_interval_ms", 1),
    ("drain_timeout_ms", 0),
)
"""The integer settings both consumers have, and their smallest values."""


def _check_shared(settings: PushConsumerConfig | SimpleConsumerConfig) -> None:
    """Raise :class:`InvalidArgumentError` for a setting both consumers have that is out of
    range (see :data:`_SHARED_MINIMUMS`), or a ``consume_from_where`` that is none."""
    if not isinstance(settings.consume_from_where, ConsumeFromWhere):
        raise InvalidArgumentError(
            f"consume_from_where must be a ConsumeFromWhere, got {settings.consume_from_where!r}"
        )
    for name, minimum in _SHARED_MINIMUMS:
        require_int(name, getattr(settings, name), minimum=minimum)


def _replaced(settings: _Settings, kind: str, changes: dict[str, Any]) -> _Settings:
    """``settings`` (a dataclass) with ``changes`` applied (``None`` values ignored);
    unknown names raise :class:`InvalidArgumentError` naming the ``kind`` of settings."""
    names = {f.name for f in dataclasses.fields(cast(Any, settings))}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise InvalidArgumentError(f"unknown {kind} setting(s) {unknown}; known: {sorted(names)}")
    changed: _Settings = dataclasses.replace(
        cast(Any, settings), **{k: v for k, v in changes.items() if v is not None}
    )
    return changed


def apply_group_kafka_config(
    group: str,
    parts: KafkaConfigParts | None,
    options: dict[str, Any],
    settings_from_where: ConsumeFromWhere,
) -> None:
    """What a consumer's ``kafka_config`` (read into ``parts``) says of its group: a
    ``group.id`` other than ``group`` raises :class:`KafkaConfigError`; an
    ``auto.offset.reset`` chooses ``consume_from_where`` (put in ``options`` unless given
    there) when the settings leave it at its default (``settings_from_where``)."""
    if parts is None:
        return
    if parts.group_id is not None and parts.group_id != group:
        raise KafkaConfigError(
            "group.id",
            f"{parts.group_id!r} is not this consumer's group {group!r}; the group is "
            "named where the consumer is made",
        )
    if (
        parts.from_first_offset is not None
        and settings_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    ):
        options.setdefault(
            "consume_from_where",
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            if parts.from_first_offset
            else ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        )


MAX_INVISIBLE_DURATION_S: Final = 12 * 3600
"""The longest invisible duration ``receive`` and ``change_invisible_duration`` take, seconds
(RocketMQ 5's ``maxInvisibleTimeMills``: 12 hours)."""


@dataclass(frozen=True, slots=True)
class SimpleConsumerConfig:
    """How a :class:`~bridge.SimpleConsumer` consumes. Validated on construction.

    The retry policy is RocketMQ 5's for simple consumers: a message not acked within its
    invisible duration is delivered again (its ``delivery_attempt`` one more) and, once
    ``max_delivery_attempts`` deliveries were not acked, goes to ``%DLQ%<group>``."""

    max_delivery_attempts: int = 17
    """Deliveries of one message before it goes to the dead-letter queue: the group's
    ``retryMaxTimes`` (16) + 1, RocketMQ 5's default ``maxAttempts``."""
    max_unacked_messages: int = 10_000
    """Messages received and not yet acked (nor past their invisible duration), at most: a
    ``receive`` beyond that returns fewer, waiting up to the await duration for room."""
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    """Where the group starts on a partition it has no committed offset for (the retry topic
    always starts from its first message)."""
    consume_timestamp_ms: int = 0
    """With CONSUME_FROM_TIMESTAMP: start at this time (epoch ms); 0 means half an hour ago."""
    pull_batch_size: int = 32
    """Most records taken from Kafka per poll, per partition."""
    pull_threshold_for_queue: int = 1000
    """A partition with this many messages held (fetched and not yet acked, or sent back and
    not yet acknowledged by Kafka) stops fetching."""
    pull_threshold_size_for_queue: int = 100
    """A partition whose held messages take this many MiB stops fetching too."""
    send_back_retry_delay_ms: int = 5000
    """When the retry or DLQ copy of an expired message cannot be written, the message is
    offered to ``receive`` again after this long, ms (one more delivery attempt counted)."""
    persist_consumer_offset_interval_ms: int = 1000
    """How often offsets are committed to Kafka, ms (also on rebalance and shutdown). An ack
    is final for the group once the commit passes it: a crash before that delivers the acked
    message again."""
    drain_timeout_ms: int = 10_000
    """On a rebalance, how long a partition being given up waits for its received messages to
    be acked, ms; those still unacked are then delivered again by the partition's next
    owner (their acks here raise :class:`~bridge.errors.InvalidReceiptHandleError`)."""

    def __post_init__(self) -> None:
        _check_shared(self)
        require_int("max_delivery_attempts", self.max_delivery_attempts, minimum=1)
        require_int("max_unacked_messages", self.max_unacked_messages, minimum=1)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (``None`` values are ignored); unknown names raise
        :class:`InvalidArgumentError`."""
        return _replaced(self, "simple consumer", changes)


def shared_settings(simple: SimpleConsumerConfig) -> PushConsumerConfig:
    """The settings that the parts a simple consumer shares with the push consumer read (the
    fetcher, the retry policy) take from ``simple``: CLUSTERING, its values, and a budget of
    ``max_delivery_attempts - 1`` failures (the last delivery's expiry sends the message
    to the DLQ)."""
    return PushConsumerConfig(
        consume_from_where=simple.consume_from_where,
        consume_timestamp_ms=simple.consume_timestamp_ms,
        pull_batch_size=simple.pull_batch_size,
        pull_threshold_for_queue=simple.pull_threshold_for_queue,
        pull_threshold_size_for_queue=simple.pull_threshold_size_for_queue,
        max_reconsume_times=simple.max_delivery_attempts - 1,
        send_back_retry_delay_ms=simple.send_back_retry_delay_ms,
        persist_consumer_offset_interval_ms=simple.persist_consumer_offset_interval_ms,
        drain_timeout_ms=simple.drain_timeout_ms,
    )
