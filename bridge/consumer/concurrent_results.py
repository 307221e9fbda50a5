"""What a concurrent listener's answer means (RocketMQ's
``ConsumeMessageConcurrentlyService.processConsumeResult``): how many leading messages of a
batch it consumed, by its status and ``ack_index``, and the delay level of the others' retry,
by ``delay_level_when_next_consume``; an answer that is not what the API allows is read as
RocketMQ would (a failure, the default level) and logged."""

from __future__ import annotations

import logging
from typing import cast

from bridge.consumer.consumption import BatchListener, Failure, record_failure, status_failure
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    checked_ack_index,
    checked_delay_level,
)
from bridge.message import MessageExt

logger = logging.getLogger(__name__)


def delay_level(context: ConsumeConcurrentlyContext, msgs: list[MessageExt], group: str) -> int:
    """The listener's ``delay_level_when_next_consume`` for the failed ``msgs``; the default
    (0) if it is not an int."""
    level = checked_delay_level(context.delay_level_when_next_consume)
    if level is None:
        logger.warning(
            "push consumer %s: the listener set delay_level_when_next_consume=%r (not an "
            "int) for %s; using the default level",
            group,
            context.delay_level_when_next_consume,
            [m.msg_id for m in msgs],
        )
        return 0
    return level


def batch_consumed(
    listener: BatchListener,
    msgs: list[MessageExt],
    context: ConsumeConcurrentlyContext,
    group: str,
) -> int:
    """How many leading ``msgs`` a concurrent batch listener consumed. CONSUME_SUCCESS (or
    SUCCESS): up to the listener's ``ack_index`` (one that is not an int fails the whole
    batch); anything else: none."""
    # Its own list: one it empties or reorders must not change what the consumer holds.
    # Typed object: a listener may return anything (None, True, the other enum).
    listening = cast(MessageListenerConcurrently, listener)
    status: object = listening.consume_message(list(msgs), context)
    # Either enum's success, as per-message listeners may return.
    if status is ConsumeStatus.CONSUME_SUCCESS or status is ConsumeOrderlyStatus.SUCCESS:
        index = checked_ack_index(context.ack_index, len(msgs))
        if index is None:
            logger.warning(
                "push consumer %s: the listener set ack_index=%r (not an int) for %s: "
                "RECONSUME_LATER",
                group,
                context.ack_index,
                [m.msg_id for m in msgs],
            )
            record_failure(msgs, Failure.ACK_INDEX)
            return 0
        record_failure(msgs[index + 1 :], Failure.ACK_INDEX)
        return index + 1
    record_failure(msgs, status_failure(status, msgs[0].msg_id))
    return 0
