"""The same workloads against Apache RocketMQ 5.3 and against the bridge; the outcomes compared.

Each workload runs on both sides at once (RocketMQ's in a JVM of its own) with the scaled
settings of :mod:`tests.differential.settings`; each test reads one and asserts, for each side,
what must hold on both, and asserts every difference listed in ``docs/compatibility.md`` as it
is, so a difference that appears, disappears or changes fails here. Timings are compared within
``SLACK_MS``: the suite runs on a shared 2-core machine. Measured figures are printed in the
session summary. The workloads run ahead of their tests, two at a time (:mod:`.lanes`).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from bridge.runtime.rocketmq import LocalRocketMQ
from tests.differential import settings as s
from tests.differential.bridge_side import BridgeEnv, Event
from tests.differential.conftest import MEASURED
from tests.differential.lanes import Sides, scenario
from tests.differential.observe import (
    BRIDGE_ONLY,
    FAILURE_METADATA,
    ROCKETMQ_BROKER,
    ROCKETMQ_PULLED,
    ROCKETMQ_PUSHED,
    RocketMQV5Run,
    attempts,
    consumed_counts,
    gaps,
    of,
    one,
    prop_diff,
    run_both,
    run_both_v5,
    same_values,
    v5_names,
)

pytestmark = pytest.mark.broker

SLACK_MS = 1500
"""Scheduling slack on a busy 2-core machine."""
LATE_SLACK_MS = 4000
"""How late a delayed message may arrive on a busy machine. Both sides once ran more than
``SLACK_MS`` late in the same CI run (the same stall hit both); a stuck schedule still fails."""
ORDER_SLACK_MS = 1000
"""Arrival order is asserted only for due times further apart than the timer precision plus
this (jitter between two messages' lateness can swap closer ones under load)."""
EARLY_MS = 100
"""Clock and scheduling jitter allowed below a due time (waits count from the send's start)."""
SIDES = ("rocketmq", "bridge")


def note(workload: str, figure: str, rocketmq: object, bridge: object) -> None:
    """Record a measured figure for the session summary."""
    MEASURED.setdefault("rows", []).append((workload, figure, str(rocketmq), str(bridge)))


def pct(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else -1


# --- seed 003: 30 transactional messages, three check answers -----------------------------


@scenario(expected_s=33)
def seed003(sides: Sides) -> dict[str, list[Event]]:
    rmq, bridge = run_both(
        "transaction", sides,
        count=s.TRANSACTIONS, deadline_ms=60_000, quiet_ms=2000,
    )  # fmt: skip
    return {"rocketmq": rmq, "bridge": bridge}


UNKNOWN = {f"KEY{i}" for i in range(s.TRANSACTIONS) if i % 3 == 0}
COMMITTED = {f"KEY{i}" for i in range(s.TRANSACTIONS) if i % 3 == 1}
ROLLED_BACK = {f"KEY{i}" for i in range(s.TRANSACTIONS) if i % 3 == 2}


@pytest.mark.parametrize("side", SIDES)
def test_seed003_outcomes_are_the_same(seed003: dict[str, list[Event]], side: str) -> None:
    events = seed003[side]
    sent = of(events, "sent")
    assert len(sent) == s.TRANSACTIONS
    assert {(e["status"], e["local"]) for e in sent} == {("SEND_OK", "UNKNOW")}
    assert all(e["msg_id"] == e["transaction_id"] for e in sent)
    # Which messages a consumer sees: the ones committed on check, each once.
    assert consumed_counts(events) == dict.fromkeys(COMMITTED, 1)
    # How many checks each undecided message got, and what it carried.
    checks: dict[str, list[Event]] = {}
    for e in of(events, "check"):
        checks.setdefault(e["key"], []).append(e)
    for key in COMMITTED | ROLLED_BACK:
        assert [c["props"]["TRANSACTION_CHECK_TIMES"] for c in checks[key]] == ["1"], key
    for key in UNKNOWN:
        assert [c["props"]["TRANSACTION_CHECK_TIMES"] for c in checks[key]] == [
            str(n) for n in range(1, s.TRANSACTION_CHECK_MAX + 1)
        ], key
    # Where the unresolved ones end: parked after the last check, with its count.
    parked = of(events, "parked")
    assert {p["key"] for p in parked} == UNKNOWN
    assert {p["props"]["TRANSACTION_CHECK_TIMES"] for p in parked} == {str(s.TRANSACTION_CHECK_MAX)}
    assert {p["props"]["REAL_TOPIC"] for p in parked} == {one(events, "consume", "KEY1")["topic"]}


@pytest.mark.parametrize("side", SIDES)
def test_seed003_check_times_follow_timeout_and_interval(
    seed003: dict[str, list[Event]], side: str
) -> None:
    events = seed003[side]
    checks: dict[str, list[int]] = {}
    for e in of(events, "check"):
        checks.setdefault(e["key"], []).append(e["since_sent"])
    first = [times[0] for times in checks.values()]
    assert min(first) >= s.TRANSACTION_TIMEOUT_MS - EARLY_MS
    # A check pass runs every interval: the first check comes within one interval of the
    # timeout (RocketMQ) or at the timeout (the bridge).
    assert max(first) <= s.TRANSACTION_TIMEOUT_MS + s.CHECK_INTERVAL_MS + SLACK_MS
    later = [g for key in UNKNOWN for g in gaps(checks[key])]
    assert min(later) >= s.CHECK_INTERVAL_MS // 2
    assert max(later) <= 2 * s.CHECK_INTERVAL_MS + SLACK_MS
    parked_after = [p["parked_since_sent"] - checks[p["key"]][-1] for p in of(events, "parked")]
    # Seen by polling the parked messages (the bridge's poll takes up to 2 s).
    assert max(parked_after) <= s.CHECK_INTERVAL_MS + SLACK_MS + 2500
    MEASURED.setdefault("tx", {})[side] = (
        f"first check p50 {pct(first, 0.5)} max {max(first)} ms; later gaps "
        f"p50 {pct(later, 0.5)} max {max(later)} ms; parked seen "
        f"p50 {pct(parked_after, 0.5)} ms after the last check"
    )


def test_seed003_properties_differ_only_as_documented(
    seed003: dict[str, list[Event]],
) -> None:
    rmq, bridge = seed003["rocketmq"], seed003["bridge"]
    # A committed message as a consumer sees it: RocketMQ leaves the half message's
    # properties on it; the bridge removes them, as RocketMQ's end-transaction code means to.
    only_rmq, only_bridge = prop_diff(one(rmq, "consume", "KEY1"), one(bridge, "consume", "KEY1"))
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PUSHED | {
        "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "TRANSACTION_CHECK_TIMES",
    }  # fmt: skip
    assert only_bridge == BRIDGE_ONLY
    assert not same_values(
        one(rmq, "consume", "KEY1"), one(bridge, "consume", "KEY1"), "KEYS", "TAGS", "PGROUP"
    )
    # The message a check hands to the listener.
    rmq_check = of(rmq, "check")[0]
    bridge_check = next(c for c in of(bridge, "check") if c["key"] == rmq_check["key"])
    only_rmq, only_bridge = prop_diff(rmq_check, bridge_check)
    assert only_rmq == ROCKETMQ_BROKER
    assert only_bridge == set()
    assert not same_values(
        rmq_check, bridge_check, "KEYS", "TAGS", "PGROUP", "REAL_TOPIC", "TRAN_MSG",
        "TRANSACTION_CHECK_TIMES",
    )  # fmt: skip
    # RocketMQ picks the queue when the half message is sent, the bridge when it commits.
    assert rmq_check["props"]["REAL_QID"] in {"0", "1", "2", "3"}
    assert bridge_check["props"]["REAL_QID"] == "-1"
    # A parked message.
    only_rmq, only_bridge = prop_diff(one(rmq, "parked", "KEY0"), one(bridge, "parked", "KEY0"))
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PULLED
    assert only_bridge == set()


LAGGING_OP_BATCH_MS = 10_000
"""An OP batch interval of ten check intervals (RocketMQ's default is a tenth of one)."""


def test_rocketmq_checks_decided_transactions_again_when_op_records_lag(
    rocketmq: LocalRocketMQ,
    driver_home: Path,
    seed003: dict[str, list[Event]],
    bridge_env: BridgeEnv,
) -> None:
    """RocketMQ writes the OP records that end transactions in batches; when checks run more
    often than the batches are written, a decided transaction is checked again and every
    COMMIT answer writes the message again (the duplicates of RocketMQ issues #5574 and
    #8158). The bridge decides by transaction id in the same Kafka transaction as the commit:
    each committed message once (its run above, with the same check settings)."""
    from tests.differential.rocketmq_side import DriverRun

    # It sets RocketMQ's OP batch interval for the whole broker while it runs, so no other
    # transactional workload may run beside it: the only one, seed003's, has ended (its result
    # is an argument here), and the workloads still running in the lanes send no transaction.
    run = DriverRun(
        "transaction", rocketmq.namesrv_addr, driver_home, 240,
        topic="diff-transaction-lagging-op", producer_group="diff_lag_p",
        consumer_group="diff_lag_c", count=s.TRANSACTIONS, deadline_ms=30_000, quiet_ms=4000,
        broker_addr=rocketmq.broker_addr,
        broker_config=f"transactionOpBatchInterval:{LAGGING_OP_BATCH_MS}",
        restore_broker_config=f"transactionOpBatchInterval:{s.OP_BATCH_INTERVAL_MS}",
    )  # fmt: skip
    events = run.events()
    counts = consumed_counts(events)
    assert set(counts) == COMMITTED
    duplicated = {k: n for k, n in counts.items() if n > 1}
    assert duplicated, "RocketMQ delivered each commit once with lagging OP records"
    assert consumed_counts(seed003["bridge"]) == dict.fromkeys(COMMITTED, 1)
    note(
        "transaction", "commits delivered more than once (OP batch 10 s, check every 1 s)",
        f"{len(duplicated)}/{len(COMMITTED)} (up to {max(duplicated.values())} copies)", "0",
    )  # fmt: skip


# --- delay levels and timers ---------------------------------------------------------------

DELAYS = {
    "plain": 0,
    "level1": 1000,
    "level2": 2000,
    "level3": 3000,
    "level99": 5000,  # clamped to the last level
    "delayms1500": 1500,
    "delaysec2": 2000,
    "at2700": 2700,
    "atm60000": 0,  # a timer in the past
    "level1+delayms4000": 1000,  # the level wins
}
TIMERS = {"delayms1500", "delaysec2", "at2700"}


@scenario(expected_s=9)
def delays(sides: Sides) -> dict[str, list[Event]]:
    rmq, bridge = run_both(
        "delay", sides,
        messages=",".join(DELAYS), deadline_ms=30_000, quiet_ms=1500,
    )  # fmt: skip
    return {"rocketmq": rmq, "bridge": bridge}


@pytest.mark.parametrize("side", SIDES)
def test_delays_are_never_early_and_arrive_in_due_order(
    delays: dict[str, list[Event]], side: str
) -> None:
    events = delays[side]
    assert consumed_counts(events) == dict.fromkeys(DELAYS, 1)
    waited = {e["key"]: e["since_sent"] for e in of(events, "consume")}
    for key, due in DELAYS.items():
        assert waited[key] >= due - EARLY_MS, f"{key} early: {waited}"
        late_by = (s.TIMER_PRECISION_MS if key in TIMERS else 0) + LATE_SLACK_MS
        assert waited[key] <= due + late_by, f"{key} late by more than {late_by} ms: {waited}"
    arrival = [e["key"] for e in of(events, "consume")]
    for a, due_a in DELAYS.items():
        for b, due_b in DELAYS.items():
            if due_a + s.TIMER_PRECISION_MS + ORDER_SLACK_MS <= due_b:
                assert arrival.index(a) < arrival.index(b), f"{b} before {a}: {waited}"
    timer_late = [waited[k] - DELAYS[k] for k in sorted(TIMERS)]
    MEASURED.setdefault("timer_late", {})[side] = timer_late
    MEASURED.setdefault("level_late", {})[side] = [
        waited[k] - DELAYS[k] for k in ("level1", "level2", "level3", "level99")
    ]


def test_delivered_delayed_messages_differ_only_as_documented(
    delays: dict[str, list[Event]],
) -> None:
    rmq, bridge = delays["rocketmq"], delays["bridge"]
    base = ROCKETMQ_BROKER | ROCKETMQ_PUSHED
    leftovers = {
        "plain": set(),
        # RocketMQ removes DELAY (and the timer properties) from the delivered copy's property
        # map after serialising it, so they stay, with REAL_TOPIC/REAL_QID.
        "level1": {"DELAY", "REAL_TOPIC", "REAL_QID"},
        "level99": {"DELAY", "REAL_TOPIC", "REAL_QID"},
        "level1+delayms4000": {"DELAY", "REAL_TOPIC", "REAL_QID"},
        "delayms1500": {"REAL_TOPIC", "REAL_QID", "TIMER_DELAY_MS", "TIMER_OUT_MS",
                        "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS"},
        "delaysec2": {"REAL_TOPIC", "REAL_QID", "TIMER_DELAY_SEC", "TIMER_OUT_MS",
                      "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS"},
        "at2700": {"REAL_TOPIC", "REAL_QID", "TIMER_DELIVER_MS", "TIMER_OUT_MS",
                   "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS"},
        "atm60000": {"TIMER_DELIVER_MS"},
    }  # fmt: skip
    for key, extra in leftovers.items():
        only_rmq, only_bridge = prop_diff(one(rmq, "consume", key), one(bridge, "consume", key))
        assert only_rmq == base | extra, key
        assert only_bridge == BRIDGE_ONLY, key
        assert not same_values(
            one(rmq, "consume", key), one(bridge, "consume", key), "KEYS", "TAGS", "p"
        ), key
    assert one(rmq, "consume", "level99")["props"]["DELAY"] == "5"  # clamped


# --- the retry ladder --------------------------------------------------------------------


@scenario(expected_s=14)
def retries(sides: Sides) -> dict[str, list[Event]]:
    rmq, bridge = run_both(
        "retry", sides,
        max_reconsume=s.MAX_RECONSUME_TIMES, deadline_ms=60_000, quiet_ms=2000,
    )  # fmt: skip
    return {"rocketmq": rmq, "bridge": bridge}


@pytest.mark.parametrize("side", SIDES)
def test_retry_ladder_is_the_same(retries: dict[str, list[Event]], side: str) -> None:
    events = retries[side]
    tries = attempts(events)
    topic = tries["ok"][0]["topic"]
    assert {k: [e["reconsume"] for e in v] for k, v in tries.items()} == {
        "ok": [0],
        "once": [0, 1],
        "always": list(range(s.MAX_RECONSUME_TIMES + 1)),
    }
    # The listener sees the original topic on every attempt.
    assert {e["topic"] for v in tries.values() for e in v} == {topic}
    # Attempt n + 1 waits at delay level 3 + n.
    ladder = gaps([e["t"] for e in tries["always"]])
    for n, gap in enumerate(ladder):
        due = s.LEVEL_DELAYS_MS[2 + n]
        assert due - EARLY_MS <= gap <= due + SLACK_MS, (n, gap)
    retried = tries["always"][1:]
    assert {e["props"]["RETRY_TOPIC"] for e in retried} == {topic}
    assert len({e["props"]["ORIGIN_MESSAGE_ID"] for e in retried}) == 1
    # The dead-letter queue: %DLQ%<group>, after max reconsume times, counted once more.
    (dead,) = of(events, "dlq")
    assert dead["key"] == "always"
    assert dead["topic"] == dead["dlq_topic"]
    assert dead["topic"].startswith("%DLQ%diff_retry_c_")
    assert dead["reconsume"] == s.MAX_RECONSUME_TIMES + 1
    assert dead["props"]["RETRY_TOPIC"] == topic
    assert dead["props"]["ORIGIN_MESSAGE_ID"] == retried[0]["props"]["ORIGIN_MESSAGE_ID"]
    MEASURED.setdefault("retry_gaps", {})[side] = ladder


def test_retried_messages_differ_only_as_documented(retries: dict[str, list[Event]]) -> None:
    rmq, bridge = retries["rocketmq"], retries["bridge"]
    r_try, b_try = attempts(rmq)["always"][1], attempts(bridge)["always"][1]
    only_rmq, only_bridge = prop_diff(r_try, b_try)
    # RocketMQ's retry copy went through SCHEDULE_TOPIC_XXXX and keeps DELAY and REAL_*; its
    # reconsume count is a message field, the bridge's a property (Kafka records have none).
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PUSHED | {"DELAY", "REAL_TOPIC", "REAL_QID"}
    assert only_bridge == BRIDGE_ONLY | {"RECONSUME_TIME", "MAX_RECONSUME_TIMES"} | FAILURE_METADATA
    assert r_try["props"]["REAL_TOPIC"].startswith("%RETRY%")
    # ORIGIN_MESSAGE_ID: RocketMQ's broker writes the original's offset message id; the
    # bridge the original's message id (UNIQ_KEY), as RocketMQ's client-side send-back does.
    assert r_try["props"]["ORIGIN_MESSAGE_ID"] != r_try["props"]["UNIQ_KEY"]
    assert b_try["props"]["ORIGIN_MESSAGE_ID"] == b_try["props"]["UNIQ_KEY"]
    r_dead, b_dead = of(rmq, "dlq")[0], of(bridge, "dlq")[0]
    only_rmq, only_bridge = prop_diff(r_dead, b_dead)
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PULLED | {"DELAY", "REAL_TOPIC", "REAL_QID"}
    assert only_bridge == BRIDGE_ONLY | {"RECONSUME_TIME", "MAX_RECONSUME_TIMES"} | FAILURE_METADATA


# --- orderly consumption with a failing message -------------------------------------------


@scenario(expected_s=10)
def orderly(sides: Sides) -> dict[str, list[Event]]:
    rmq, bridge = run_both(
        "orderly", sides,
        count=6, max_reconsume=s.MAX_RECONSUME_TIMES, suspend_ms=s.SUSPEND_MS,
        deadline_ms=60_000, quiet_ms=2000,
    )  # fmt: skip
    return {"rocketmq": rmq, "bridge": bridge}


@pytest.mark.parametrize("side", SIDES)
def test_orderly_retries_in_place_and_dead_letters_after_max(
    orderly: dict[str, list[Event]], side: str
) -> None:
    events = orderly[side]
    sequence = [(e["key"], e["reconsume"]) for e in of(events, "consume")]
    assert sequence == [
        ("m0", 0), ("m1", 0), ("m2", 0), ("m2", 1), ("m2", 2), ("m3", 0),
        ("m4", 0), ("m4", 1), ("m4", 2), ("m5", 0),
    ]  # fmt: skip
    for key in ("m2", "m4"):
        for gap in gaps([e["t"] for e in attempts(events)[key]]):
            assert s.SUSPEND_MS - EARLY_MS <= gap <= s.SUSPEND_MS + SLACK_MS, (key, gap)
    (dead,) = of(events, "dlq")
    assert dead["key"] == "m4"
    assert dead["reconsume"] == s.MAX_RECONSUME_TIMES + 1
    assert dead["props"]["RECONSUME_TIME"] == str(s.MAX_RECONSUME_TIMES + 1)
    assert dead["props"]["MAX_RECONSUME_TIMES"] == str(s.MAX_RECONSUME_TIMES)
    assert dead["props"]["RETRY_TOPIC"] == attempts(events)["m0"][0]["topic"]
    MEASURED.setdefault("suspend_gaps", {})[side] = gaps([e["t"] for e in attempts(events)["m2"]])


def test_orderly_messages_differ_only_as_documented(orderly: dict[str, list[Event]]) -> None:
    rmq, bridge = orderly["rocketmq"], orderly["bridge"]
    r_again, b_again = attempts(rmq)["m2"][1], attempts(bridge)["m2"][1]
    only_rmq, only_bridge = prop_diff(r_again, b_again)
    # An orderly retry happens in place: RocketMQ counts it in the message's field only (its
    # orderly consumer sets no CONSUME_START_TIME); the bridge's message says how the last
    # attempt failed.
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PULLED
    assert only_bridge == BRIDGE_ONLY | {"RECONSUME_TIME", "CONSUME_FAILURE"}
    only_rmq, only_bridge = prop_diff(of(rmq, "dlq")[0], of(bridge, "dlq")[0])
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PULLED | {"DELAY"}
    assert only_bridge == BRIDGE_ONLY | FAILURE_METADATA


# --- broadcasting with a failure ---------------------------------------------------------


@scenario(expected_s=7)
def broadcasting(sides: Sides) -> dict[str, list[Event]]:
    rmq, bridge = run_both(
        "broadcasting", sides,
        deadline_ms=60_000, quiet_ms=s.LEVEL_DELAYS_MS[2] + 1500,
    )  # fmt: skip
    return {"rocketmq": rmq, "bridge": bridge}


@pytest.mark.parametrize("side", SIDES)
def test_broadcasting_delivers_to_each_instance_and_drops_failures(
    broadcasting: dict[str, list[Event]], side: str
) -> None:
    events = broadcasting[side]
    for instance in ("a", "b"):
        tries = attempts(events, instance)
        # Each instance gets every message once; the failed one is dropped, not retried
        # (a retry would come back after delay level 3, within the quiet period).
        assert {k: [e["reconsume"] for e in v] for k, v in tries.items()} == {
            "ok1": [0], "bad": [0], "ok2": [0],
        }  # fmt: skip
        assert tries["bad"][0]["fail"] is True


# --- SQL92 property filters --------------------------------------------------------------

# The messages (key: tag, user properties); every message's body and first key is its key.
SQL_MESSAGES: dict[str, tuple[str | None, dict[str, str]]] = {
    "m01": ("TagA", {"a": "5", "b": "abc"}),
    "m02": ("TagB", {"a": "-3", "f": "1.5"}),
    "m03": ("TagC", {"a": "2147483648"}),
    "m04": (None, {"a": "NaN"}),
    "m05": ("TagA", {"a": " 7 "}),
    "m06": ("TagA", {"a": "\u0663"}),  # ARABIC-INDIC DIGIT THREE
    "m07": ("TagB", {"a": "true"}),
    "m08": ("TagA", {"a": "1e3", "b": "1e3"}),
    "m09": ("TagA", {"a": "0x1p4"}),
    "m10": ("TagB", {"a": "-0.0"}),
    "m11": ("TagA", {}),
    "m12": ("TagA", {"a": "5.0", "b": "5"}),  # RocketMQ refuses an empty property value
    "m13": ("TagC", {"a": "10", "b": "9"}),
    "m14": ("TagA", {"a": "Infinity"}),
    "m15": ("TagB", {"a": "it's"}),
    "m16": ("TagA", {"a": "2.5d"}),
    "m17": ("TagA", {"a": "+5"}),
    "m18": ("TagA", {"a": "1_000"}),
    "m19": ("TagB", {"a": "\U0001f600", "b": "\U0001f600"}),
}
SQL_KEYS = {"m19": "m19 extra"}
"""Messages with more than one key (RocketMQ joins them with a space in ``KEYS``)."""

SQL_SAME = [
    "a = 5", "a > 4", "a >= 5.0", "a < 0", "a BETWEEN 1 AND 10", "a NOT BETWEEN 1 AND 10",
    "a > 2147483647", "a = 1000.0", "a = 16.0", "a > 100.0", "a = TRUE", "a = FALSE",
    "a = 'it''s'", "a IS NULL", "a IS NOT NULL", "a IN ('5', 'true', '')", "a NOT IN ('5')",
    "TAGS IN ('TagA', 'TagB')", "TAGS IS NULL", "TAGS <> 'TagA'", "NOT a = 5", "NOT (a = 5)",
    "a = 5 OR b = 5", "b = 5 OR a = 5", "a > b", "a = b", "nosuch = other", "a = -'x'",
    "a CONTAINS '1'", "a NOT CONTAINS '1'", "a STARTSWITH '-'", "a ENDSWITH 'd'",
    "KEYS = 'm19 extra'", "KEYS CONTAINS 'extra'", "a", "TRUE", "FALSE", "NULL", "a = 2.5",
    "a > -1 AND TAGS = 'TagA' AND b IS NULL", "-a = -5", "a = 5L", "a = 0", "a = 5e0",
    "a = 5 -- a comment to the end", "a /* here */ = 5", "a between 1 and 10 or a is null",
    "a = '\U0001f600'", "a <> b",
]  # fmt: skip
"""Expressions both sides must take and filter alike."""
SQL_BOTH_REFUSE = [
    "a = NULL", "a > 'x'", "a BETWEEN 10 AND 1", "a = 0.0", "5 IN ('5')",
    "NOT a BETWEEN 1 AND 2", "TRUE = 1", "a != 5", "a = ", "(a = 5",
]  # fmt: skip
SQL_TRAILING = {"a = 5 b = 6": "a = 5", "a = 5) OR TRUE": "a = 5", "a > 4 5": "a > 4"}
"""What RocketMQ reads as a shorter expression (ignoring the rest), which the bridge refuses
(docs/compatibility.md)."""
SQL_ALL = SQL_SAME + SQL_BOTH_REFUSE + list(SQL_TRAILING)


def _sql_message(key: str) -> str:
    tag, props = SQL_MESSAGES[key]
    fields = {"key": key, "keys": SQL_KEYS.get(key, key), **({"tags": tag} if tag else {})}
    return urlencode({**fields, **props}, quote_via=quote)


@scenario(expected_s=9)
def sql92(sides: Sides) -> dict[str, dict[str, set[str] | None]]:
    """Each side's outcome per expression: the keys it delivered, or None if it refused it."""
    args: dict[str, Any] = {f"m{i}": _sql_message(key) for i, key in enumerate(SQL_MESSAGES)}
    args |= {f"e{i}": quote(expression) for i, expression in enumerate(SQL_ALL)}
    rmq, bridge = run_both(
        "sql", sides,
        rocketmq_only={"broker_addr": sides.rocketmq.broker_addr}, **args,
    )  # fmt: skip
    outcomes: dict[str, dict[str, set[str] | None]] = {}
    for side, events in (("rocketmq", rmq), ("bridge", bridge)):
        seen: dict[str, set[str] | None] = {e["expression"]: None for e in of(events, "invalid")}
        for e in of(events, "selected"):
            seen[e["expression"]] = set(filter(None, e["keys"].split(",")))
        assert set(seen) == set(SQL_ALL), side
        outcomes[side] = seen
    return outcomes


@pytest.mark.parametrize("expression", SQL_SAME)
def test_sql92_filters_select_the_same_messages(
    sql92: dict[str, dict[str, set[str] | None]], expression: str
) -> None:
    rocketmq = sql92["rocketmq"][expression]
    assert rocketmq is not None, "RocketMQ refused it"
    assert sql92["bridge"][expression] == rocketmq


def test_sql92_expressions_both_refuse(sql92: dict[str, dict[str, set[str] | None]]) -> None:
    for expression in SQL_BOTH_REFUSE:
        assert sql92["rocketmq"][expression] is None, expression
        assert sql92["bridge"][expression] is None, expression


def test_sql92_trailing_text_is_ignored_by_rocketmq_and_refused_by_the_bridge(
    sql92: dict[str, dict[str, set[str] | None]],
) -> None:
    for expression, read_as in SQL_TRAILING.items():
        assert sql92["rocketmq"][expression] == sql92["rocketmq"][read_as], expression
        assert sql92["bridge"][expression] is None, expression
    agree = sum(1 for e in SQL_SAME if sql92["rocketmq"][e] == sql92["bridge"][e])
    note("sql92", f"of {len(SQL_SAME)} expressions, selecting the same messages", agree, agree)


SQL_ANCHORS = {
    "TRUE": set(SQL_MESSAGES),
    "FALSE": set(),
    "a = 5": {"m01", "m17"},  # "+5" is 5 to Integer.valueOf; "5.0" is an error
    "a IS NULL": {"m11"},
    "a > 100.0": {"m03", "m04", "m08", "m14"},  # 2147483648, NaN, 1e3, Infinity
    "NOT a = 5": set(),
    "KEYS = 'm19 extra'": {"m19"},
}
"""A few rows' outcomes written out, so that the table cannot agree by selecting nothing."""


@pytest.mark.parametrize("side", SIDES)
def test_sql92_anchor_rows_select_what_rocketmqs_rules_say(
    sql92: dict[str, dict[str, set[str] | None]], side: str
) -> None:
    for expression, expected in SQL_ANCHORS.items():
        assert sql92[side][expression] == expected, expression


# --- RocketMQ 5's client model: SimpleConsumer (gRPC client and proxy) -------------------

REVIVE_WAIT_MS = 2000
"""RocketMQ's broker brings back an unacked message only once its revive scan has passed the
message's deadline by ``PopAckConstants.ackTimeInterval`` + 1 s (so that an ack sent just before
the deadline is seen first; ``PopReviveService``)."""
REVIVE_LATE_MS = REVIVE_WAIT_MS + s.TIMER_PRECISION_MS + 1000 + LATE_SLACK_MS
"""The latest RocketMQ may bring one back: the wait, the timer wheel that delivers the broker's
checkpoint records, its 1 s ``reviveInterval``, and the busy machine's slack."""


@scenario(expected_s=29)
def simple_v5(sides: Sides) -> dict[str, list[Event]]:
    started = time.monotonic()
    rmq, bridge = run_both_v5(
        "simple", sides,
        setup={"queues": 4, "message_type": "NORMAL", "fifo": "false",
               "retry_max_times": s.MAX_DELIVERY_ATTEMPTS - 1, "backoff_ms": s.INVISIBLE_MS},
        invisible_ms=s.INVISIBLE_MS, extend_ms=s.EXTEND_MS, max_attempts=s.MAX_DELIVERY_ATTEMPTS,
        await_ms=s.AWAIT_MS, deadline_ms=90_000, quiet_ms=s.INVISIBLE_MS + REVIVE_LATE_MS,
    )  # fmt: skip
    MEASURED.setdefault("row_s", {})["simple consumer"] = time.monotonic() - started
    return {"rocketmq": rmq, "bridge": bridge}


def receives(events: list[Event]) -> dict[str, list[Event]]:
    """A simple consumer's deliveries by key, in order."""
    out: dict[str, list[Event]] = {}
    for e in of(events, "receive"):
        out.setdefault(e["key"], []).append(e)
    return out


def back_after(events: list[Event]) -> dict[str, list[int]]:
    """How long after its invisible duration ended each redelivery came, by key (ms): from the
    receive (or the ``change_invisible_duration``) before it, less that duration."""
    got = receives(events)
    (changed,) = of(events, "changed")
    return {
        "late": [got["late"][1]["t"] - got["late"][0]["t"] - s.INVISIBLE_MS],
        "extend": [got["extend"][1]["t"] - changed["t"] - s.EXTEND_MS],
        "never": [gap - s.INVISIBLE_MS for gap in gaps([e["t"] for e in got["never"]])],
    }


@pytest.mark.parametrize("side", SIDES)
def test_v5_simple_consumer_redelivers_extends_and_dead_letters(
    simple_v5: dict[str, list[Event]], side: str
) -> None:
    events = simple_v5[side]
    got = receives(events)
    assert {k: [e["attempt"] for e in v] for k, v in got.items()} == {
        "ack": [1],
        "late": [1, 2],
        "extend": [1, 2],
        "never": list(range(1, s.MAX_DELIVERY_ATTEMPTS + 1)),
    }
    assert sorted(e["key"] for e in of(events, "ack")) == ["ack", "extend", "late"]
    topic = got["ack"][0]["topic"]
    for key, views in got.items():
        # Every delivery is the same message, from the topic it was sent to, as it was sent.
        assert len({e["msg_id"] for e in views}) == 1, key
        assert {e["topic"] for e in views} == {topic}, key
        assert all(e["props"] == {"p": key} and e["body"] == key for e in views), key
    # Never back before its invisible duration (as changed) ended.
    for key, lateness in back_after(events).items():
        assert min(lateness) >= -EARLY_MS, (key, lateness)
    # After the group's max delivery attempts: %DLQ%<group>, the same message.
    (dead,) = of(events, "dlq")
    assert dead["key"] == "never"
    assert dead["topic"] == dead["dlq_topic"]
    assert dead["topic"].startswith("%DLQ%diff_simple_c_")
    assert dead["msg_id"] == got["never"][0]["msg_id"]
    assert (dead["body"], dead["props"]["p"], dead["tags"]) == ("never", "never", "T")


def test_v5_simple_consumer_redelivery_lateness_differs_as_documented(
    simple_v5: dict[str, list[Event]],
) -> None:
    rmq = [x for v in back_after(simple_v5["rocketmq"]).values() for x in v]
    bridge = [x for v in back_after(simple_v5["bridge"]).values() for x in v]
    # The bridge's consumer sends a message back when its deadline passes (checked every
    # 100 ms) and reads it from the retry topic; RocketMQ's broker waits REVIVE_WAIT_MS more.
    assert max(bridge) <= SLACK_MS, bridge
    assert min(rmq) >= REVIVE_WAIT_MS - EARLY_MS, rmq
    assert max(rmq) <= REVIVE_LATE_MS, rmq
    note("simple consumer", "redeliveries after the invisible duration ends (ms)", rmq, bridge)


def test_v5_simple_consumer_dead_letters_differ_only_as_documented(
    simple_v5: dict[str, list[Event]],
) -> None:
    rmq, bridge = simple_v5["rocketmq"], simple_v5["bridge"]
    r_dead, b_dead = one(rmq, "dlq", "never"), one(bridge, "dlq", "never")
    # RocketMQ moves a spent message when a receive of the group meets it again after its last
    # invisible duration (and its revive), counting that once more; the bridge moves it when
    # the last invisible duration ends.
    assert r_dead["reconsume"] == s.MAX_DELIVERY_ATTEMPTS + 1
    assert b_dead["reconsume"] == s.MAX_DELIVERY_ATTEMPTS
    r_last = receives(rmq)["never"][-1]["since_sent"]
    b_last = receives(bridge)["never"][-1]["since_sent"]
    assert r_dead["store_minus_born"] >= r_last + s.INVISIBLE_MS + REVIVE_WAIT_MS - EARLY_MS
    assert b_dead["store_minus_born"] <= b_last + s.INVISIBLE_MS + SLACK_MS
    note(
        "simple consumer", "DLQ copy stored after the last delivery (ms)",
        r_dead["store_minus_born"] - r_last, b_dead["store_minus_born"] - b_last,
    )  # fmt: skip
    only_rmq, only_bridge = prop_diff(r_dead, b_dead)
    assert only_rmq == ROCKETMQ_BROKER | ROCKETMQ_PULLED | {
        "1ST_POP_TIME", "BORN_TIMESTAMP", "DELAY", "PGROUP", "__BORNHOST",
    }  # fmt: skip
    assert only_bridge == BRIDGE_ONLY | FAILURE_METADATA | {"MAX_RECONSUME_TIMES"}
    # RocketMQ's revived copies come from the group's POP retry topic, which it records.
    topic = receives(rmq)["never"][0]["topic"]
    group = r_dead["topic"].removeprefix("%DLQ%")
    assert r_dead["props"]["RETRY_TOPIC"] == f"%RETRY%{group}_{topic}"
    assert b_dead["props"]["RETRY_TOPIC"] == receives(bridge)["never"][0]["topic"]


# --- RocketMQ 5's client model: FIFO message groups ---------------------------------------

FIFO_GROUPS = ("g1", "g2", "g3")
FIFO_PER_GROUP = 3
FIFO_SENT = [f"{g}-{i}" for i in range(FIFO_PER_GROUP) for g in FIFO_GROUPS]
"""Send order: round robin over the groups. g1-1 always fails, g2-1 fails once."""


@scenario(expected_s=31)
def fifo_v5(sides: Sides) -> dict[str, list[Event]]:
    """The FIFO workload on a topic of one queue on both sides; RocketMQ's consumer as
    configured by default, and (``rocketmq_accelerated``) with the v5 client's FIFO consume
    accelerator, which runs the groups of one received batch in parallel: there every message
    is sent before the consumer starts, so that one batch holds them all (messages received
    in a later batch wait until the earlier batch is done, whatever their groups)."""
    args: dict[str, Any] = {
        "groups": ",".join(FIFO_GROUPS), "per_group": FIFO_PER_GROUP, "work_ms": s.FIFO_WORK_MS,
        "threads": 4, "max_attempts": s.MAX_DELIVERY_ATTEMPTS, "backoff_ms": s.FIFO_BACKOFF_MS,
        "deadline_ms": 90_000, "quiet_ms": 2000,
    }  # fmt: skip
    setup = {
        "queues": 1, "message_type": "FIFO", "fifo": "true",
        "retry_max_times": s.MAX_DELIVERY_ATTEMPTS - 1, "backoff_ms": s.FIFO_BACKOFF_MS,
    }  # fmt: skip
    started = time.monotonic()
    # The accelerated run goes on in the background, beside the other two.
    accelerated = RocketMQV5Run(
        "fifo", sides, v5_names("fifo"), setup,
        accelerator="true", preload="true", **args,
    )  # fmt: skip
    try:
        rmq, bridge = run_both_v5(
            "fifo", sides, setup=setup,
            rocketmq_only={"accelerator": "false", "preload": "false"}, **args,
        )  # fmt: skip
    except BaseException:
        accelerated.kill()
        raise
    events = {"rocketmq": rmq, "bridge": bridge, "rocketmq_accelerated": accelerated.events()}
    MEASURED.setdefault("row_s", {})["fifo"] = time.monotonic() - started
    return events


FIFO_SIDES = ("rocketmq", "rocketmq_accelerated", "bridge")


@pytest.mark.parametrize("side", FIFO_SIDES)
def test_v5_fifo_groups_are_consumed_in_order_one_at_a_time(
    fifo_v5: dict[str, list[Event]], side: str
) -> None:
    events = fifo_v5[side]
    consumes = of(events, "consume")
    tries = attempts(events)
    assert {k: [e["attempt"] for e in v] for k, v in tries.items()} == {
        key: list(range(1, s.MAX_DELIVERY_ATTEMPTS + 1)) if key == "g1-1"
        else [1, 2] if key == "g2-1" else [1]
        for key in FIFO_SENT
    }  # fmt: skip
    for group in FIFO_GROUPS:
        mine = [e for e in consumes if e["group"] == group]
        # In send order, each message only after the one before it is done (its retries in
        # place included), and never beside another message of its group.
        assert [e["key"] for e in mine] == [
            key for key in FIFO_SENT if key.startswith(f"{group}-") for _ in tries[key]
        ], group
        assert all(e["in_group"] == 1 for e in mine), group
        for before, after in itertools.pairwise(mine):
            assert after["t"] >= before["t"] + s.FIFO_WORK_MS - EARLY_MS, (before, after)
        assert all(e["props"]["__SHARDINGKEY"] == group for e in mine), group
    # A failure is retried in place after the back-off, then dead-lettered.
    for key in ("g1-1", "g2-1"):
        for gap in gaps([e["t"] for e in tries[key]]):
            due = s.FIFO_BACKOFF_MS + s.FIFO_WORK_MS
            assert due - EARLY_MS <= gap <= due + SLACK_MS, (key, gap)
    (dead,) = of(events, "dlq")
    assert dead["key"] == "g1-1"
    assert dead["topic"] == dead["dlq_topic"]
    assert dead["topic"].startswith("%DLQ%diff_fifo_c_")
    assert (dead["body"], dead["props"]["p"], dead["props"]["__SHARDINGKEY"]) == (
        "g1-1", "g1-1", "g1",
    )  # fmt: skip


def test_v5_fifo_failing_group_blocks_others_as_documented(
    fifo_v5: dict[str, list[Event]],
) -> None:
    """RocketMQ 5.3's FIFO consumer (by default) consumes a queue's messages one at a time in
    queue order, whatever their groups: g1-1's retries in place hold up g2 and g3 in the same
    queue. With the client's FIFO consume accelerator the other groups of one received batch
    flow while g1-1 is retried; on the bridge every group of the partition does."""
    first = {
        side: {e["key"]: e["t"] for e in reversed(of(fifo_v5[side], "consume"))}
        for side in FIFO_SIDES
    }
    last_g1_1 = {side: attempts(fifo_v5[side])["g1-1"][-1]["t"] for side in FIFO_SIDES}
    rmq = of(fifo_v5["rocketmq"], "consume")
    assert list(dict.fromkeys(e["key"] for e in rmq)) == FIFO_SENT
    assert all(e["t"] > last_g1_1["rocketmq"] for e in rmq if e["key"] in ("g2-1", "g3-1"))
    for side in ("rocketmq_accelerated", "bridge"):
        # g3's messages after g1-1 are done before g1-1's second attempt.
        assert first[side]["g3-2"] < attempts(fifo_v5[side])["g1-1"][1]["t"], side
        assert first[side]["g2-2"] < last_g1_1[side], side
    note(
        "fifo", "g3-2 consumed, ms after g1-1's last attempt (default; accelerated)",
        f"{first['rocketmq']['g3-2'] - last_g1_1['rocketmq']}; "
        f"{first['rocketmq_accelerated']['g3-2'] - last_g1_1['rocketmq_accelerated']}",
        first["bridge"]["g3-2"] - last_g1_1["bridge"],
    )  # fmt: skip


def test_v5_fifo_dead_letter_counts_differ_as_documented(
    fifo_v5: dict[str, list[Event]],
) -> None:
    # RocketMQ retries in place in the client: its broker delivered the message once, and the
    # client's forward to the DLQ counts that one. The bridge's copy counts the retries.
    for side in ("rocketmq", "rocketmq_accelerated"):
        assert one(fifo_v5[side], "dlq", "g1-1")["reconsume"] == 1, side
    assert one(fifo_v5["bridge"], "dlq", "g1-1")["reconsume"] == s.MAX_DELIVERY_ATTEMPTS


# --- RocketMQ 5.3's recall of timer messages ----------------------------------------------

RECALLED = ("recalled-1", "recalled-2")
"""Recalled at once after their send, about ``RECALL_DUE_MS`` before their time."""
DELIVERED = ("kept", "late")
"""Never recalled in time: "kept" is not recalled, "late" only once it was received."""


@scenario(expected_s=16)
def recall_v5(sides: Sides) -> dict[str, list[Event]]:
    """Timer messages recalled before their time and after their delivery, on a topic of
    message type DELAY (RocketMQ's proxy recalls only on such a topic, and takes only timers
    there); RocketMQ's broker runs with ``recallMessageEnable=true``."""
    started = time.monotonic()
    rmq, bridge = run_both_v5(
        "recall", sides,
        setup={"queues": 4, "message_type": "DELAY", "fifo": "false",
               "retry_max_times": s.MAX_DELIVERY_ATTEMPTS - 1, "backoff_ms": s.INVISIBLE_MS},
        due_ms=s.RECALL_DUE_MS, late_due_ms=s.RECALL_LATE_DUE_MS, invisible_ms=s.INVISIBLE_MS,
        await_ms=s.AWAIT_MS, deadline_ms=90_000, quiet_ms=s.RECALL_QUIET_MS,
    )  # fmt: skip
    MEASURED.setdefault("row_s", {})["recall"] = time.monotonic() - started
    return {"rocketmq": rmq, "bridge": bridge}


@pytest.mark.parametrize("side", SIDES)
def test_v5_recalled_timers_never_arrive_and_the_others_arrive_once(
    recall_v5: dict[str, list[Event]], side: str
) -> None:
    events = recall_v5[side]
    sent = {e["key"]: e for e in of(events, "sent")}
    # Every timer's send gives a recall handle.
    assert set(sent) == {"warmup", *RECALLED, *DELIVERED}
    assert all(e["handle"] for e in sent.values())
    # What arrives after the warm-up: "kept" and "late", each once, never a recalled one.
    got = receives(events)
    assert {k: len(v) for k, v in got.items()} == dict.fromkeys(DELIVERED, 1)
    (start,) = of(events, "start")
    for key in DELIVERED:
        (view,) = got[key]
        assert view["msg_id"] == sent[key]["msg_id"], key
        assert (view["body"], view["props"], view["tags"]) == (key, {"p": key}, "T"), key
        # Never before its time (epoch ms).
        assert start["epoch_ms"] + view["t"] >= sent[key]["due_ms"] - EARLY_MS, key
    # The receive loop ran past the recalled ones' time by RECALL_QUIET_MS.
    (done,) = of(events, "done")
    assert done["t"] - sent["kept"]["t"] >= s.RECALL_DUE_MS + s.RECALL_QUIET_MS - SLACK_MS
    # A recall in time returns the message's id.
    recalls = {e["key"]: e for e in of(events, "recall")}
    for key in RECALLED:
        assert recalls[key]["ok"] is True, recalls[key]
        assert recalls[key]["msg_id"] == sent[key]["msg_id"]
        assert recalls[key]["before_due_ms"] >= s.RECALL_DUE_MS - SLACK_MS
    # The late recall came after the message was received.
    assert recalls["late"]["before_due_ms"] < 0
    assert recalls["late"]["t"] >= got["late"][0]["t"]


def test_v5_recall_after_delivery_is_refused_as_documented(
    recall_v5: dict[str, list[Event]],
) -> None:
    """Both refuse a recall made after the message was delivered (and it was delivered once,
    above). RocketMQ's broker (``RecallMessageProcessor``) answers ILLEGAL_OPERATION "recall
    failed, timestamp invalid" once the handle's time has passed; the proxy in local mode
    (``LocalMessageService.recallMessage``) turns every refusal into INTERNAL_SERVER_ERROR,
    which the 5.2.0 client raises as ``InternalErrorException``: only the text says why. The
    bridge raises ``RecallTooLateError``, with the message's id and times."""
    late = {side: one(recall_v5[side], "recall", "late") for side in SIDES}
    assert all(late[side]["ok"] is False for side in SIDES), late
    assert late["rocketmq"]["error"] == "InternalErrorException"
    assert "response-code=50001" in late["rocketmq"]["message"]
    assert "recall failed, timestamp invalid" in late["rocketmq"]["message"]
    assert late["bridge"]["error"] == "RecallTooLateError"
    (sent,) = [e for e in of(recall_v5["bridge"], "sent") if e["key"] == "late"]
    assert sent["msg_id"] in late["bridge"]["message"]
    note(
        "recall", "late recall, ms after the message's time",
        -late["rocketmq"]["before_due_ms"], -late["bridge"]["before_due_ms"],
    )  # fmt: skip
