"""The scaled-down settings both sides run with, under RocketMQ's names and the bridge's.

Delays are scaled down alike on both sides so the suite takes minutes: the delay level table,
the transaction check timings and the orderly suspension are the same numbers on both.
RocketMQ writes the OP records that end transactions in batches (``transactionOpBatchInterval``,
3 s against a 30 s check interval by default); it is scaled with the check interval, keeping
that ratio, so that a decided transaction is not checked again only because the check runs
more often than RocketMQ was built for (the suite shows separately what happens when it does).
"""

from __future__ import annotations

from typing import Final

MESSAGE_DELAY_LEVEL: Final = "1s 2s 3s 4s 5s"
"""Levels 1-3 wait 1, 2, 3 s; a retry waits at level 3 + reconsume times (3 s, then 4 s)."""
LEVEL_DELAYS_MS: Final = (1000, 2000, 3000, 4000, 5000)
TIMER_PRECISION_MS: Final = 1000
"""RocketMQ's and the bridge's default ``timerPrecisionMs``."""
TRANSACTION_TIMEOUT_MS: Final = 2000
CHECK_INTERVAL_MS: Final = 1000
TRANSACTION_CHECK_MAX: Final = 3
OP_BATCH_INTERVAL_MS: Final = 100
"""RocketMQ's ``transactionOpBatchInterval``, a tenth of the check interval as by default."""
MAX_RECONSUME_TIMES: Final = 2
SUSPEND_MS: Final = 500
"""Orderly consumers' ``suspendCurrentQueueTimeMillis``."""
CLIENT_REBALANCE_INTERVAL_MS: Final = 1000
"""RocketMQ clients' ``rocketmq.client.rebalance.waitInterval`` (20 s by default), set on the
driver's JVM (see ``rocketmq_side``)."""
TRANSACTIONS: Final = 30
"""Seed 003's flow, with 30 messages: 10 each of unknown, commit and rollback on check."""

# RocketMQ 5's client model (SimpleConsumer, FIFO message groups), through the proxy.
INVISIBLE_MS: Final = 3000
"""The simple consumer's invisible duration (RocketMQ's proxy refuses less than 10 s for a
receive by default, ``minInvisibleTimeMillsForRecv``, set to 1 s on the suite's proxy)."""
EXTEND_MS: Final = 6000
"""What ``change_invisible_duration`` sets at a message's first receive."""
MAX_DELIVERY_ATTEMPTS: Final = 3
"""The groups' max delivery attempts: RocketMQ's ``retryMaxTimes`` 2, plus one."""
AWAIT_MS: Final = 2000
"""The simple consumer's await duration (long polling of a receive)."""
FIFO_BACKOFF_MS: Final = 1000
"""A FIFO group's in-place retry back-off: RocketMQ's group retry policy (exponential, initial
= max = this) and the bridge's ``suspend_current_queue_time_millis``."""
FIFO_WORK_MS: Final = 200
"""How long the FIFO listener works on each message."""
RECALL_DUE_MS: Final = 4000
"""When the recall row's timers are due, after their send: the recalls made at once come
about 4 s before, well outside the bridge's 1 s recall margin."""
RECALL_LATE_DUE_MS: Final = 1500
"""When the recall row's "late" timer is due: it is recalled once it was received."""
RECALL_QUIET_MS: Final = 3000
"""How long the recall row keeps receiving after the timers' due time, so that a recalled
message delivered anyway (late by up to the precision and the machine's stalls) is seen."""
PROXY_PROPERTIES: Final = {
    "minInvisibleTimeMillsForRecv": 1000,
    "grpcClientConsumerMinLongPollingTimeoutMillis": 1000,
}
"""``rmq-proxy.json`` entries the suite's proxy runs with."""
