"""RocketMQ's ``cleanExpireMsg`` for the concurrent strategy: a message in its listener for
longer than ``consume_timeout`` is sent back (so its partition's offset can be committed past)
and its listener's late result will not count; the failed messages its task kept and the ones
it had not started go on without it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from bridge.consumer.consumption import Failure, record_failure
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.retry_policy import RetryPolicy
from bridge.message import MessageExt

logger = logging.getLogger(__name__)

CONSUME_TIMEOUT_DELAY_LEVEL: Final = 3
"""The delay level of a message sent back for running past ``consume_timeout`` (RocketMQ's
``cleanExpireMsg``)."""


def send_back_overdue(
    pq: ProcessQueue,
    now: float,
    *,
    timeout_min: float,
    policy: RetryPolicy,
    resubmit: Callable[[ProcessQueue, list[MessageExt]], None],
    group: str,
) -> None:
    """Send back the messages of ``pq`` in their listener since more than ``timeout_min``
    minutes before ``now`` (monotonic seconds), at delay level 3 (dropped, BROADCASTING);
    send back those their tasks failed before the hung calls (the tasks would send them back
    only once they end), and ``resubmit`` those the tasks had not started, to other tasks."""
    rest: list[MessageExt] = []
    failed: list[tuple[MessageExt, int]] = []
    late = pq.overdue(now, timeout_min * 60, rest, failed)
    if not late:
        return
    logger.warning(
        "push consumer %s: %d messages of %s[%d] in their listener for more than "
        "consume_timeout (%s min), sending them back; the listener's results for them "
        "will be ignored: %s",
        group,
        len(late),
        pq.topic,
        pq.partition,
        timeout_min,
        [m.msg_id for m in late],
    )
    record_failure(late, Failure.CONSUME_TIMEOUT)
    try:
        policy.fail(pq, late, [CONSUME_TIMEOUT_DELAY_LEVEL] * len(late))
    finally:
        if failed:
            # Failed before the hung call by the same task, which would send them back only
            # once it ends.
            back = [m for m, _ in failed]
            try:
                policy.fail(pq, back, [level for _, level in failed])
            except Exception:
                logger.exception(
                    "push consumer %s: handling %d failed messages; consuming them again later",
                    group,
                    len(back),
                )
                policy.retry_locally(pq, [m for m in back if pq.holds(m.queue_offset)])
        if rest:
            rest.sort(key=_offset)
            logger.warning(
                "push consumer %s: %d messages of %s[%d] that the same tasks had not started "
                "go to other tasks",
                group,
                len(rest),
                pq.topic,
                pq.partition,
            )
            resubmit(pq, rest)


def _offset(msg: MessageExt) -> int:
    return msg.queue_offset
