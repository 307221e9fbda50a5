"""The push consumer's public vocabulary and its pure rules: RocketMQ's names throughout.

* :class:`ConsumeStatus` / :class:`ConsumeOrderlyStatus`: what a listener returns;
* :class:`MessageListenerConcurrently` / :class:`MessageListenerOrderly` and their contexts;
* :class:`MessageModel`, :class:`ConsumeFromWhere`;
* :class:`TagFilter`: a subscription expression (``"*"`` or ``"TagA || TagB"``);
* :class:`FilterExpression` / :class:`MessageSelector` (RocketMQ 5's and 4's names) and
  :class:`FilterExpressionType`: a TAG or SQL92 expression for ``subscribe``, made into a
  filter by :func:`subscription_filter` (SQL92 ones by :mod:`bridge.consumer.sql92`);
* :func:`retry_route`: where a failed message goes next (retry level or dead-letter queue);
* :func:`checked_ack_index`, :func:`checked_delay_level`, :func:`checked_suspend_millis`: what
  a listener left in its context, checked before it is trusted.
"""

from __future__ import annotations

import abc
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, NamedTuple, cast

from bridge.consumer.sql92 import SqlFilter, compile_sql92
from bridge.errors import InvalidArgumentError
from bridge.message import MessageExt

DEFAULT_MAX_RECONSUME_TIMES: Final = 16
"""RocketMQ's retry budget of a concurrent listener (``maxReconsumeTimes = -1`` means this)."""
ORDERLY_UNLIMITED_RECONSUME: Final = sys.maxsize
"""An orderly listener's budget when none is set: retry in place for ever (as RocketMQ)."""
FIRST_RETRY_LEVEL: Final = 3
"""A message sent back after ``n`` failures waits at delay level ``3 + n`` (10 s, 30 s, ...)."""
ACK_INDEX_ALL: Final = sys.maxsize
"""``ConsumeConcurrentlyContext.ack_index`` before the listener sets it: the whole batch."""


class ConsumeStatus(Enum):
    """What a concurrent listener returns for a batch (RocketMQ's ``ConsumeConcurrentlyStatus``,
    named as in RocketMQ's Python client)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(Enum):
    """What an orderly listener returns: go on, or retry the same batch in place later."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class MessageModel(Enum):
    """CLUSTERING: a group shares the messages; BROADCASTING: every consumer gets all."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(Enum):
    """Where a group starts on a partition it has no committed offset for. Retry topics
    always start from their first message."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class MessageQueue(NamedTuple):
    """A Kafka partition in RocketMQ's terms: ``topic`` is the RocketMQ name."""

    topic: str
    queue_id: int


@dataclass(slots=True)
class ConsumeConcurrentlyContext:
    """Passed to a concurrent listener with its batch.

    ``ack_index``: the index of the last message consumed successfully when the listener
    returns CONSUME_SUCCESS (the rest are sent back); ``delay_level_when_next_consume``: 0
    keeps the default (``3 + reconsume times``), a positive level overrides it, a negative one
    sends the failed messages straight to the dead-letter queue.
    """

    message_queue: MessageQueue
    ack_index: int = ACK_INDEX_ALL
    delay_level_when_next_consume: int = 0


@dataclass(slots=True)
class ConsumeOrderlyContext:
    """Passed to an orderly listener: ``suspend_current_queue_time_millis`` overrides, for
    this batch, how long the partition waits before the failed batch is retried (ms)."""

    message_queue: MessageQueue
    suspend_current_queue_time_millis: int = -1


class MessageListenerConcurrently(abc.ABC):
    """A listener that consumes batches on many threads at once."""

    @abc.abstractmethod
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        """Consume ``msgs``; an exception counts as RECONSUME_LATER."""


class MessageListenerOrderly(abc.ABC):
    """A listener that consumes each partition one batch at a time, in order."""

    @abc.abstractmethod
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        """Consume ``msgs``; an exception counts as SUSPEND_CURRENT_QUEUE_A_MOMENT."""


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A subscription expression: ``"*"`` (or empty) takes every message, ``"TagA || TagB"``
    takes messages whose tag is one of those (RocketMQ's TAG expression)."""

    expression: str = "*"
    tags: frozenset[str] | None = field(init=False)
    """None: every message."""

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise InvalidArgumentError(
                f"a subscription expression must be a string, got {self.expression!r}"
            )
        text = self.expression.strip()
        if text in ("", "*"):
            object.__setattr__(self, "tags", None)
            return
        tags = frozenset(part.strip() for part in text.split("||") if part.strip())
        bad = [t for t in tags if any(c.isspace() for c in t) or t == "*" or "|" in t]
        if not tags or bad:
            raise InvalidArgumentError(
                f"subscription expression {self.expression!r} is not '*' or 'TagA || TagB'"
                + (f" (bad tags: {sorted(bad)})" if bad else "")
            )
        object.__setattr__(self, "tags", tags)

    def matches(self, tag: str | None) -> bool:
        """True if a message with ``tag`` passes the filter."""
        return self.tags is None or (tag is not None and tag in self.tags)


class FilterExpressionType(Enum):
    """What a subscription's expression is: TAG (``"*"`` or ``"TagA || TagB"``) or SQL92 (a
    condition on the message's properties, RocketMQ's property filter)."""

    TAG = "TAG"
    SQL92 = "SQL92"
    SQL = "SQL92"
    """The same as ``SQL92``: RocketMQ 5's Python client names it ``FilterType.SQL``."""


@dataclass(frozen=True, slots=True)
class FilterExpression:
    """RocketMQ 5's ``FilterExpression``: an expression and its type (TAG by default), for
    ``subscribe(topic, listener, FilterExpression("a > 5", FilterExpressionType.SQL92))``.

    The expression is checked by ``subscribe``, which raises
    :class:`~bridge.errors.FilterExpressionError` for an invalid SQL92 one."""

    expression: str = "*"
    filter_type: FilterExpressionType = FilterExpressionType.TAG

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise InvalidArgumentError(
                f"a filter expression must be a string, got {type(self.expression).__name__}"
            )
        if not isinstance(self.filter_type, FilterExpressionType):
            raise InvalidArgumentError(
                f"filter_type must be a FilterExpressionType, got {self.filter_type!r}"
            )

    @property
    def expression_type(self) -> FilterExpressionType:
        """The type (RocketMQ 4's ``getExpressionType``)."""
        return self.filter_type


class MessageSelector(FilterExpression):
    """RocketMQ 4's ``MessageSelector``: ``MessageSelector.by_sql("a > 5")`` or
    ``MessageSelector.by_tag("TagA || TagB")`` (Java's ``bySql``/``byTag``)."""

    __slots__ = ()

    @classmethod
    def by_sql(cls, sql: str) -> MessageSelector:
        """An SQL92 condition on the message's properties (``TAGS``, ``KEYS`` and the user's)."""
        return cls(sql, FilterExpressionType.SQL92)

    @classmethod
    def by_tag(cls, tag: str) -> MessageSelector:
        """A tag expression: ``"*"`` or ``"TagA || TagB"``."""
        return cls(tag, FilterExpressionType.TAG)


SubscriptionFilter = TagFilter | SqlFilter
"""What a subscription keeps of its expression: the tags it takes, or a compiled SQL92 filter."""


def subscription_filter(expression: str | FilterExpression) -> SubscriptionFilter:
    """The filter of a subscription: a string is a tag expression, as in RocketMQ's
    ``subscribe(topic, "TagA || TagB")``; a :class:`FilterExpression` (or
    :class:`MessageSelector`) says its type. An SQL92 expression is parsed here, once:
    :class:`~bridge.errors.FilterExpressionError` names where it is invalid."""
    if isinstance(expression, FilterExpression):
        if expression.filter_type is FilterExpressionType.SQL92:
            return compile_sql92(expression.expression)
        return TagFilter(expression.expression)
    return TagFilter(expression)


class RetryRoute(NamedTuple):
    """Where a failed message goes: the group's dead-letter queue, or its retry topic after
    ``delay_level`` (0: straight to the retry topic, without a wait)."""

    to_dlq: bool
    delay_level: int
    reconsume_times: int
    """The ``RECONSUME_TIME`` the copy carries (one more than the failed message's)."""


def retry_route(
    reconsume_times: int, max_reconsume_times: int, delay_level_when_next_consume: int = 0
) -> RetryRoute:
    """RocketMQ's send-back rule (``SendMessageProcessor.consumerSendMessageBack``).

    A message that already failed ``max_reconsume_times`` times, or whose listener asked for a
    negative level, goes to the dead-letter queue; otherwise it waits at the listener's level
    or at ``3 + reconsume_times``.
    """
    if reconsume_times >= max_reconsume_times or delay_level_when_next_consume < 0:
        return RetryRoute(True, 0, reconsume_times + 1)
    level = delay_level_when_next_consume or FIRST_RETRY_LEVEL + reconsume_times
    return RetryRoute(False, level, reconsume_times + 1)


def effective_max_reconsume_times(max_reconsume_times: int, *, orderly: bool) -> int:
    """``-1`` means RocketMQ's default: 16 for concurrent listeners, unlimited for orderly."""
    if max_reconsume_times == -1:
        return ORDERLY_UNLIMITED_RECONSUME if orderly else DEFAULT_MAX_RECONSUME_TIMES
    return max_reconsume_times


def _is_int(value: object) -> bool:
    """True for an ``int`` that is not a ``bool`` (``True`` is no index nor level here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def checked_ack_index(value: object, count: int) -> int | None:
    """``ConsumeConcurrentlyContext.ack_index`` as left by a listener that returned
    CONSUME_SUCCESS for ``count`` messages: clamped to ``[-1, count - 1]`` (-1: none consumed),
    or None if it is not an int (the whole batch then counts as failed)."""
    if not _is_int(value):
        return None
    return max(-1, min(cast(int, value), count - 1))


def checked_delay_level(value: object) -> int | None:
    """``ConsumeConcurrentlyContext.delay_level_when_next_consume`` as left by a listener, or
    None if it is not an int (the default level then applies)."""
    return cast(int, value) if _is_int(value) else None


def checked_suspend_millis(value: object) -> int | None:
    """``ConsumeOrderlyContext.suspend_current_queue_time_millis`` as left by a listener (ms;
    negative: the consumer's setting), or None if it is not an int (the setting applies)."""
    return cast(int, value) if _is_int(value) else None
