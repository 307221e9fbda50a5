"""The chaos checker against small histories written with the real history writer: a clean run
passes, each broken rule is caught once and attributed to the fault window it fell in."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.checker import (
    ALL_ROW,
    NONE_ROW,
    POISON_ROW,
    SPARK_ROW,
    HistoryFormatError,
    Report,
    check,
    check_file,
    main,
    percentile,
)
from chaos.history import HistoryWriter, read_history

T0 = 1_700_000_000_000.0
"""Epoch ms of every history's start (the writer fills in 't' only when it is falsy)."""

S = 1000.0
UNBOUNDED = 10.0**12
"""A stall budget no test history reaches."""


class History:
    """Events for one run, written with :class:`HistoryWriter` and checked from the file."""

    def __init__(self, path: Path, config: dict[str, Any] | None = None) -> None:
        self.path = path
        self.writer = HistoryWriter(path)
        self.offsets: dict[str, int] = {}
        # Stalls are judged only where a test names a budget (the stall tests below).
        config = config or {"max_reconsume_times": 2, "stall_budget_ms": UNBOUNDED}
        self.write("phase", T0, name="start", config=config)

    def write(self, type_: str, t: float, **fields: Any) -> None:
        self.writer.write(type_, t=t, **fields)

    def send(self, op_id: str, kind: str, t: float, topic: str = "orders", **fields: Any) -> None:
        fields.setdefault("key", None)
        fields.setdefault("seq", None)
        self.write("send", t, id=op_id, kind=kind, topic=topic, **fields)

    def ack(self, op_id: str, t: float, ok: bool = True, indeterminate: bool = False) -> None:
        self.write("ack", t, id=op_id, ok=ok, indeterminate=indeterminate)

    def decide(self, op_id: str, t: float, status: str, via: str = "execute") -> None:
        self.write("decide", t, id=op_id, status=status, via=via)

    def read(self, op_id: str, t: float, topic: str = "orders", offset: int | None = None) -> None:
        if offset is None:
            offset = self.offsets.get(topic, 0)
            self.offsets[topic] = offset + 1
        self.write(
            "recv", t, id=op_id, observer="reader", role="reader", topic=topic, partition=0,
            offset=offset,
        )  # fmt: skip

    def listen(
        self,
        op_id: str,
        t: float,
        result: str = "success",
        reconsume_times: int = 0,
        observer: str = "c1",
        group: str = "g",
    ) -> None:
        self.write(
            "recv", t, id=op_id, observer=observer, role="listener", topic="orders",
            partition=0, offset=0, reconsume_times=reconsume_times, group=group, result=result,
        )  # fmt: skip

    def dlq(self, op_id: str, t: float) -> None:
        self.write("recv", t, id=op_id, observer="dlq", role="dlq_reader", topic="rmq.DLQ.g")

    def quarantine(self, op_id: str, t: float) -> None:
        self.write("recv", t, id=op_id, observer="q", role="quarantine_reader", topic="rmq.Q")

    def fault(self, name: str, start: float, end: float | None, target: str = "node-1") -> None:
        self.write("nemesis", start, name=name, phase="start", target=target, detail="")
        if end is not None:
            self.write("nemesis", end, name=name, phase="end", target=target, detail="")

    def committed(self, op_id: str, t: float, visible_after: float = 1 * S) -> None:
        """A transaction sent at ``t``, committed at once and read ``visible_after`` later."""
        self.send(op_id, "tx", t, intent="commit")
        self.decide(op_id, t + 10, "COMMIT")
        self.ack(op_id, t + 20)
        self.read(op_id, t + 10 + visible_after)

    def drained(self, t: float, detail: str = "every expected observation came") -> None:
        self.write("phase", t, name="drained", detail=detail)

    def check(self, **kwargs: Any) -> Report:
        self.writer.close()
        return check_file(self.path, **kwargs)


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    h = History(tmp_path / "history.jsonl")
    yield h
    h.writer.close()


def kinds(report: Report) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(v.kind, v.id, v.windows) for v in report.violations]


def clean_run(h: History) -> None:
    """One operation of every kind, each ending as the README promises."""
    h.committed("tx-c", T0 + 1 * S)
    h.send("tx-r", "tx", T0 + 2 * S, intent="rollback")
    h.decide("tx-r", T0 + 2 * S + 5, "ROLLBACK")
    h.ack("tx-r", T0 + 2 * S + 10)
    h.send("tx-u", "tx", T0 + 3 * S, intent="unknown_then_commit")
    h.decide("tx-u", T0 + 3 * S + 5, "UNKNOWN")
    h.ack("tx-u", T0 + 3 * S + 10)
    h.decide("tx-u", T0 + 9 * S, "COMMIT", via="check")
    h.read("tx-u", T0 + 9.5 * S)
    h.send("d1", "delay", T0 + 4 * S, delay_ms=5000)
    h.ack("d1", T0 + 4 * S + 10)
    h.read("d1", T0 + 9.2 * S)
    h.send("tm1", "timer", T0 + 4 * S, delay_ms=2000)
    h.ack("tm1", T0 + 4 * S + 10)
    h.read("tm1", T0 + 6.5 * S)
    h.send("c1", "consume", T0 + 5 * S, fail_times=1, group="g")
    h.ack("c1", T0 + 5 * S + 10)
    h.listen("c1", T0 + 5.1 * S, "fail", 0)
    h.listen("c1", T0 + 15.2 * S, "success", 1)
    h.send("c-dlq", "consume", T0 + 5 * S, fail_times=3, group="g")
    h.ack("c-dlq", T0 + 5 * S + 10)
    h.listen("c-dlq", T0 + 5.1 * S, "fail", 0)
    h.listen("c-dlq", T0 + 15.2 * S, "fail", 1)
    h.listen("c-dlq", T0 + 45.3 * S, "raise", 2)
    h.dlq("c-dlq", T0 + 45.5 * S)
    for seq in range(3):
        h.send(f"o{seq}", "orderly", T0 + 6 * S + seq, key="k1", seq=seq, group="go")
        h.ack(f"o{seq}", T0 + 6 * S + seq + 5)
    h.listen("o0", T0 + 6.1 * S, group="go")
    h.listen("o1", T0 + 6.2 * S, "fail", 0, group="go")
    h.listen("o1", T0 + 7.2 * S, "success", 1, group="go")
    h.listen("o2", T0 + 7.3 * S, group="go")
    h.send("b1", "broadcast", T0 + 7 * S, group="gb")
    h.ack("b1", T0 + 7 * S + 5)
    h.listen("b1", T0 + 7.1 * S, observer="bc-1", group="gb")
    h.listen("b1", T0 + 7.1 * S, "fail", observer="bc-2", group="gb")
    h.send("p1", "poison", T0 + 8 * S, poison="header name not UTF-8", expect="quarantine")
    h.ack("p1", T0 + 8 * S + 5)
    h.quarantine("p1", T0 + 8.5 * S)
    h.drained(T0 + 60 * S)
    h.write("spark", T0 + 70 * S, ids=["tx-c", "tx-u", "d1", "tm1", "c1"], topics=["orders"])
    h.write("phase", T0 + 71 * S, name="end")


# --- a clean run ----------------------------------------------------------------------------


def test_a_clean_history_passes(history: History) -> None:
    history.fault("leader_kill", T0 + 3.5 * S, T0 + 4 * S)
    clean_run(history)
    report = history.check()
    assert report.ok, report.render()
    assert report.drained
    assert report.pending == 0
    assert report.unmatched_ids == 0
    every = report.row(ALL_ROW)
    assert every.operations == 11  # the poison record counts only in its own row
    assert every.acknowledged == 11
    assert every.redelivered == 0
    assert report.row(POISON_ROW).operations == 1
    assert report.row(SPARK_ROW).operations == 4
    assert list(report.rows) == ["leader_kill", NONE_ROW, POISON_ROW, SPARK_ROW, ALL_ROW]
    # tx-c (decided at +1 s) is outside the fault, d1 (due at +9 s) is within its grace.
    assert report.row("leader_kill").operations + report.row(NONE_ROW).operations == 11
    assert report.row("leader_kill").lateness_ms == [200.0, 500.0]
    text = report.render()
    assert text.splitlines()[0].split()[:4] == ["nemesis", "faults", "operations", "acknowledged"]
    assert report.row("leader_kill").faults == report.row(ALL_ROW).faults == 1
    assert "OK; drained" in text
    assert "violations" not in text


# --- transactions -------------------------------------------------------------------------


def test_a_lost_commit_is_caught_in_its_window(history: History) -> None:
    history.fault("coordinator_kill", T0 + 10 * S, T0 + 20 * S, target="coordinator-1")
    history.committed("ok-before", T0 + 1 * S)
    history.send("lost", "tx", T0 + 15 * S, intent="commit")
    history.decide("lost", T0 + 15 * S, "COMMIT")
    history.ack("lost", T0 + 15 * S + 5)
    history.drained(T0 + 100 * S)
    report = history.check()
    assert kinds(report) == [("lost", "lost", ("coordinator_kill",))]
    assert report.row("coordinator_kill").lost == 1
    assert report.row(ALL_ROW).lost == 1
    assert report.row(NONE_ROW).lost == 0
    assert report.row(NONE_ROW).operations == 1
    # It waited from its decision until the history ended.
    assert report.row("coordinator_kill").max_stall_s == pytest.approx(85.0)
    assert not report.ok
    assert "lost" in report.render().splitlines()[-1]


def test_a_commit_decided_on_check_back_is_attributed_by_its_decision(history: History) -> None:
    history.fault("net_partition", T0 + 40 * S, T0 + 50 * S)
    history.send("late", "tx", T0 + 1 * S, intent="unknown_then_commit")
    history.decide("late", T0 + 1 * S, "UNKNOWN")
    history.ack("late", T0 + 1 * S + 5)
    history.decide("late", T0 + 45 * S, "COMMIT", via="check")
    history.drained(T0 + 100 * S)
    report = history.check()
    assert kinds(report) == [("lost", "late", ("net_partition",))]


def test_a_duplicated_commit_is_caught_and_a_reread_is_not(history: History) -> None:
    history.committed("dup", T0 + 1 * S)
    history.read("dup", T0 + 3 * S, offset=7)
    history.committed("reread", T0 + 2 * S)
    history.read("reread", T0 + 4 * S, offset=1)  # the offset "reread" was first read at
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("duplicated", "dup", ("none",))]
    assert report.row(NONE_ROW).duplicated == 1


def test_a_visible_rollback_is_caught(history: History) -> None:
    history.fault("coordinator_pause", T0, T0 + 5 * S, target="coordinator-2")
    history.send("rb", "tx", T0 + 1 * S, intent="rollback")
    history.decide("rb", T0 + 1 * S, "ROLLBACK")
    history.ack("rb", T0 + 1 * S + 5)
    history.read("rb", T0 + 3 * S)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("visible_rollback", "rb", ("coordinator_pause",))]
    assert report.row("coordinator_pause").other == 1


def test_a_transaction_parked_that_its_producer_commits_is_caught(history: History) -> None:
    history.fault("db_outage", T0, T0 + 10 * S, target="database")
    history.send("stormed", "tx", T0 + 1 * S, intent="unknown_then_commit")
    history.decide("stormed", T0 + 1 * S, "UNKNOWN")
    history.ack("stormed", T0 + 1 * S + 5)
    history.decide("stormed", T0 + 4 * S, "UNKNOWN", via="check")
    history.write(
        "recv", T0 + 9 * S, id="stormed", observer="parked", role="parked_reader",
        topic="rmq.TRANS_CHECK_MAX_TIME_TOPIC", partition=0, offset=0,
    )  # fmt: skip
    history.send("gave_up", "tx", T0 + 2 * S, intent="unknown_then_rollback")
    history.decide("gave_up", T0 + 2 * S, "UNKNOWN")
    history.ack("gave_up", T0 + 2 * S + 5)
    history.decide("gave_up", T0 + 5 * S, "ROLLBACK", via="check")
    history.drained(T0 + 60 * S)
    report = history.check()
    assert ("parked_would_commit", "stormed", ("db_outage",)) in kinds(report)
    assert all(k[1] != "gave_up" for k in kinds(report))
    assert report.row("db_outage").lost >= 1


def test_a_commit_after_rollback_in_check_keeps_the_last_decision(history: History) -> None:
    """An UNKNOWN after a decision changes nothing: the last COMMIT or ROLLBACK counts."""
    history.send("x", "tx", T0 + 1 * S, intent="unknown_then_rollback")
    history.decide("x", T0 + 1 * S, "UNKNOWN")
    history.ack("x", T0 + 1 * S + 5)
    history.decide("x", T0 + 8 * S, "ROLLBACK", via="check")
    history.decide("x", T0 + 38 * S, "UNKNOWN", via="check")
    history.drained(T0 + 60 * S)
    assert history.check().ok


def test_unacknowledged_transactions_are_never_lost_but_never_twice(history: History) -> None:
    history.send("timeout", "tx", T0 + 1 * S, intent="commit")
    history.decide("timeout", T0 + 1 * S, "COMMIT")
    history.ack("timeout", T0 + 4 * S, ok=False, indeterminate=True)
    history.send("failed", "tx", T0 + 1 * S, intent="commit")
    history.decide("failed", T0 + 1 * S, "COMMIT")
    history.ack("failed", T0 + 4 * S, ok=False)
    history.read("failed", T0 + 5 * S)
    history.send("twice", "tx", T0 + 1 * S, intent="commit")
    history.decide("twice", T0 + 1 * S, "COMMIT")
    history.read("twice", T0 + 5 * S)
    history.read("twice", T0 + 6 * S)  # no ack at all: indeterminate
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("duplicated", "twice", ("none",))]
    assert report.row(ALL_ROW).acknowledged == 0


def test_an_undecided_transaction_must_stay_invisible_and_be_checked(history: History) -> None:
    history.send("seen", "tx", T0 + 1 * S, intent="commit")
    history.ack("seen", T0 + 1 * S + 5)
    history.read("seen", T0 + 3 * S)
    history.send("never-checked", "tx", T0 + 1 * S, intent="unknown_then_commit")
    history.decide("never-checked", T0 + 1 * S, "UNKNOWN")
    history.ack("never-checked", T0 + 1 * S + 5)
    history.send("young", "tx", T0 + 60 * S, intent="unknown_then_commit")
    history.decide("young", T0 + 60 * S, "UNKNOWN")
    history.ack("young", T0 + 60 * S + 5)
    # 6 s + 30 s + 10 s + 10 s + 30 s grace after its send: "never-checked" is overdue at the
    # drain, "young" is not.
    history.drained(T0 + 100 * S)
    report = history.check()
    assert sorted(kinds(report)) == [
        ("unchecked", "never-checked", ("none",)),
        ("visible_undecided", "seen", ("none",)),
    ]
    assert report.row(NONE_ROW).stuck == 1
    assert report.row(NONE_ROW).other == 1


def test_a_commit_visible_before_its_answer_is_early(history: History) -> None:
    history.fault("coordinator_pause", T0, T0 + 1 * S, target="coordinator-1")
    history.send("x", "tx", T0 + 1 * S, intent="unknown_then_commit")
    history.decide("x", T0 + 1 * S, "UNKNOWN")
    history.ack("x", T0 + 1 * S + 5)
    history.read("x", T0 + 4 * S)
    history.decide("x", T0 + 7 * S, "COMMIT", via="check")
    history.decide("x", T0 + 37 * S, "COMMIT", via="check")  # a second check changes nothing
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("early", "x", ("coordinator_pause",))]
    assert "3000 ms before its first COMMIT answer" in report.violations[0].detail


def test_a_copy_on_another_topic_is_caught(history: History) -> None:
    history.send("t", "tx", T0 + 1 * S, topic="orders", intent="commit")
    history.decide("t", T0 + 1 * S, "COMMIT")
    history.ack("t", T0 + 1 * S + 5)
    history.read("t", T0 + 2 * S, topic="payments")
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("wrong_topic", "t", ("none",))]
    assert "payments" in report.violations[0].detail


def test_commit_to_visible_latency_and_max_stall(history: History) -> None:
    history.fault("coordinator_kill", T0 + 50 * S, T0 + 51 * S, target="coordinator-1")
    for i in range(100):  # visible 1 ms .. 100 ms after the decision
        history.committed(f"fast-{i}", T0 + 1 * S + i * 10, visible_after=i + 1)
    history.committed("slow", T0 + 60 * S, visible_after=23 * S)
    history.drained(T0 + 100 * S)
    report = history.check()
    assert report.ok, report.render()
    none = report.row(NONE_ROW)
    assert none.visible_p50_ms == pytest.approx(50.0)
    assert none.visible_p99_ms == pytest.approx(99.0)
    assert none.max_stall_s == pytest.approx(0.1)
    assert report.row("coordinator_kill").max_stall_s == pytest.approx(23.0)
    assert report.row("coordinator_kill").max_stall_id == "slow"
    assert "coordinator_kill 23.0 s (slow)" in report.render()
    assert report.row(ALL_ROW).max_stall_s == pytest.approx(23.0)
    assert report.row(ALL_ROW).visible_p99_ms == pytest.approx(100.0)


def test_a_stall_past_the_budget_is_caught_and_a_fault_extends_the_budget(tmp_path: Path) -> None:
    # Defaults: session 10 s + Kafka transaction 10 s + broker abort interval 10 s + 10 s.
    h = History(tmp_path / "h.jsonl", {"max_reconsume_times": 2})
    h.committed("quiet-ok", T0 + 1 * S, visible_after=39 * S)
    h.committed("quiet-late", T0 + 2 * S, visible_after=41 * S)
    # A 20 s partition while it waited: 40 s + 20 s allowed.
    h.fault("net_partition", T0 + 100 * S, T0 + 120 * S, target="proxy")
    h.committed("fault-ok", T0 + 99 * S, visible_after=59 * S)
    h.committed("fault-late", T0 + 99 * S + 5, visible_after=61 * S)
    h.drained(T0 + 300 * S)
    report = h.check()
    assert sorted((v.kind, v.id) for v in report.violations) == [
        ("stalled", "fault-late"),
        ("stalled", "quiet-late"),
    ], report.render()
    assert report.row(ALL_ROW).stuck == 2
    assert "the bound here is 60.0 s" in next(
        v.detail for v in report.violations if v.id == "fault-late"
    )


def test_the_stall_budget_follows_the_configured_timeouts(tmp_path: Path) -> None:
    config = {
        "session_timeout_ms": 3000,
        "kafka_transaction_timeout_ms": 4000,
        "transaction_abort_interval_ms": 1000,
    }
    h = History(tmp_path / "h.jsonl", config)
    h.committed("in-time", T0 + 1 * S, visible_after=17.9 * S)  # 3 + 4 + 1 + 10 s
    h.committed("late", T0 + 2 * S, visible_after=18.1 * S)
    h.drained(T0 + 100 * S)
    assert kinds(h.check()) == [("stalled", "late", ("none",))]


# --- delays and timers --------------------------------------------------------------------


def test_an_early_timer_is_caught_in_the_window_of_its_due_time(history: History) -> None:
    # Sent before the fault, due within it: attributed to the fault.
    history.fault("rolling_restart", T0 + 10 * S, T0 + 20 * S)
    history.send("early", "timer", T0 + 1 * S, delay_ms=12_000)
    history.ack("early", T0 + 1 * S + 5)
    history.read("early", T0 + 12.9 * S)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("early", "early", ("rolling_restart",))]
    assert report.row("rolling_restart").early == 1
    assert report.row(NONE_ROW).operations == 0
    assert report.row("rolling_restart").lateness_ms == [pytest.approx(-100.0)]


def test_an_early_delay_is_caught_even_by_one_ms(history: History) -> None:
    history.send("d", "delay", T0 + 1 * S, delay_ms=5000)
    history.ack("d", T0 + 1 * S + 5)
    history.read("d", T0 + 6 * S - 1)
    history.send("on-time", "delay", T0 + 1 * S, delay_ms=5000)
    history.ack("on-time", T0 + 1 * S + 5)
    history.read("on-time", T0 + 6 * S)
    history.drained(T0 + 60 * S)
    assert kinds(history.check()) == [("early", "d", ("none",))]


def test_lateness_percentiles_per_window(history: History) -> None:
    history.fault("net_latency", T0 + 100 * S, T0 + 200 * S)
    for i in range(1, 201):  # lateness i ms, due at +i s
        history.send(f"d{i}", "delay", T0 + (i - 1) * S, delay_ms=1000)
        history.ack(f"d{i}", T0 + (i - 1) * S + 5)
        history.read(f"d{i}", T0 + i * S + i)
    history.drained(T0 + 300 * S)
    report = history.check(grace_s=0)
    assert report.ok
    # Due at +100 s .. +200 s: in the fault (101 values); the rest outside it.
    window = report.row("net_latency")
    assert window.operations == 101
    assert window.lateness_p50_ms == 150.0
    assert window.lateness_p99_ms == 199.0
    assert window.lateness_max_ms == 200.0
    assert report.row(NONE_ROW).lateness_max_ms == 99.0
    assert report.row(ALL_ROW).lateness_p50_ms == 100.0


def test_a_delay_not_due_yet_is_pending_not_lost(history: History) -> None:
    history.send("later", "delay", T0 + 1 * S, delay_ms=7_200_000)
    history.ack("later", T0 + 1 * S + 5)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert report.ok
    assert report.pending == 1


def test_the_grace_after_a_fault_is_a_parameter(history: History) -> None:
    history.fault("net_drop", T0 + 10 * S, T0 + 20 * S)
    history.committed("in-grace", T0 + 49 * S)
    history.send("past-grace", "tx", T0 + 51 * S, intent="commit")
    history.decide("past-grace", T0 + 51 * S, "COMMIT")
    history.ack("past-grace", T0 + 51 * S + 5)
    history.drained(T0 + 100 * S)
    report = history.check()
    assert kinds(report) == [("lost", "past-grace", ("none",))]
    assert report.row("net_drop").operations == 1
    wider = check_file(history.path, grace_s=40)
    assert kinds(wider) == [("lost", "past-grace", ("net_drop",))]


def test_an_operation_in_two_faults_counts_in_both_rows(history: History) -> None:
    history.fault("leader_kill", T0 + 10 * S, T0 + 20 * S)
    history.fault("disk_full", T0 + 15 * S, None)  # never ended: lasts to the history's end
    history.send("x", "timer", T0 + 16 * S, delay_ms=0)
    history.ack("x", T0 + 16 * S + 5)
    history.drained(T0 + 100 * S)
    report = history.check()
    assert kinds(report) == [("lost", "x", ("leader_kill", "disk_full"))]
    assert report.row("leader_kill").lost == report.row("disk_full").lost == 1
    assert report.row(ALL_ROW).lost == 1
    assert [w.ended for w in report.windows] == [True, False]


# --- stuck or lost -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("drain", "kind"),
    [
        ("every expected observation came", "lost"),
        ("gave up after 600 s with 1 missing", "stuck"),
        (None, "stuck"),
    ],
)
def test_missing_is_lost_after_a_full_drain_and_stuck_otherwise(
    history: History, drain: str | None, kind: str
) -> None:
    history.send("d", "delay", T0 + 1 * S, delay_ms=1000)
    history.ack("d", T0 + 1 * S + 5)
    if drain is not None:
        history.drained(T0 + 60 * S, detail=drain)
    history.write("phase", T0 + 61 * S, name="end")
    report = history.check()
    assert kinds(report) == [(kind, "d", ("none",))]
    assert report.drained is (kind == "lost")
    row = report.row(ALL_ROW)
    assert (row.lost, row.stuck) == ((1, 0) if kind == "lost" else (0, 1))


def test_a_drain_marked_incomplete_by_a_field_means_stuck(history: History) -> None:
    history.send("d", "delay", T0 + 1 * S, delay_ms=1000)
    history.ack("d", T0 + 1 * S + 5)
    history.write("phase", T0 + 60 * S, name="drained", complete=False)
    assert kinds(history.check()) == [("stuck", "d", ("none",))]


# --- push consumers -------------------------------------------------------------------------


def test_a_lost_consume_and_a_redelivery(history: History) -> None:
    history.fault("leader_kill", T0 + 1 * S, T0 + 2 * S)
    history.send("never", "consume", T0 + 1 * S, fail_times=0, group="g")
    history.ack("never", T0 + 1 * S + 5)
    history.send("twice", "consume", T0 + 100 * S, fail_times=0, group="g")
    history.ack("twice", T0 + 100 * S + 5)
    history.listen("twice", T0 + 100.1 * S)
    history.listen("twice", T0 + 130 * S)  # redelivered after a rebalance
    history.drained(T0 + 200 * S)
    report = history.check()
    assert kinds(report) == [("lost", "never", ("leader_kill",))]
    assert report.row(NONE_ROW).redelivered == 1
    assert report.row(NONE_ROW).violations == 0
    # The first call of "twice" came 95 ms after its ack.
    assert report.row(NONE_ROW).max_stall_s == pytest.approx(0.095)


def test_a_failed_consume_waiting_for_its_retry_is_pending(history: History) -> None:
    history.send("c", "consume", T0 + 1 * S, fail_times=1, group="g")
    history.ack("c", T0 + 1 * S + 5)
    history.listen("c", T0 + 55 * S, "fail", 0)  # retry due 10 s later, after the end
    history.drained(T0 + 60 * S)
    report = history.check()
    assert report.ok
    assert report.pending == 1


def test_a_late_retry_is_a_stall(history: History) -> None:
    history.send("c", "consume", T0 + 1 * S, fail_times=1, group="g")
    history.ack("c", T0 + 1 * S + 5)
    history.listen("c", T0 + 2 * S, "fail", 0)
    history.listen("c", T0 + 40 * S, "success", 1)  # due at +12 s (level 3: 10 s)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert report.ok
    assert report.row(NONE_ROW).max_stall_s == pytest.approx(28.0)


def test_in_the_dlq_and_consumed_is_a_violation(history: History) -> None:
    history.fault("net_partition", T0, T0 + 10 * S)
    history.send("both", "consume", T0 + 1 * S, fail_times=3, group="g")
    history.ack("both", T0 + 1 * S + 5)
    for r in range(3):
        history.listen("both", T0 + (2 + r) * S, "fail", r)
    history.dlq("both", T0 + 5 * S)
    history.listen("both", T0 + 6 * S, "success", 2)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("dlq_and_success", "both", ("net_partition",))]


def test_a_success_after_a_failed_dlq_copy_is_not_flagged(history: History) -> None:
    """A DLQ copy whose write failed is consumed again locally with reconsume_times + 1, above
    the maximum; the failed write may still have landed (README: consumed again locally)."""
    history.send("c", "consume", T0 + 1 * S, fail_times=3, group="g")
    history.ack("c", T0 + 1 * S + 5)
    for r in range(3):
        history.listen("c", T0 + (2 + r) * S, "fail", r)
    history.listen("c", T0 + 10 * S, "success", 3)
    history.dlq("c", T0 + 11 * S)
    history.drained(T0 + 60 * S)
    assert history.check().ok


def test_a_dlq_copy_before_the_retries_are_spent_is_caught(history: History) -> None:
    history.send("c", "consume", T0 + 1 * S, fail_times=3, group="g")
    history.ack("c", T0 + 1 * S + 5)
    history.listen("c", T0 + 2 * S, "fail", 0)
    history.listen("c", T0 + 13 * S, "fail", 1)  # max_reconsume_times is 2 in this config
    history.dlq("c", T0 + 14 * S)
    history.drained(T0 + 60 * S)
    assert kinds(history.check()) == [("premature_dlq", "c", ("none",))]


def test_max_reconsume_times_per_group_from_the_config(tmp_path: Path) -> None:
    h = History(tmp_path / "h.jsonl", {"groups": {"g": {"max_reconsume_times": 1}}})
    h.send("c", "consume", T0 + 1 * S, fail_times=3, group="g")
    h.ack("c", T0 + 1 * S + 5)
    h.listen("c", T0 + 2 * S, "fail", 0)
    h.listen("c", T0 + 13 * S, "fail", 1)
    h.dlq("c", T0 + 14 * S)
    h.drained(T0 + 60 * S)
    assert h.check().ok


def test_a_skipped_reconsume_count_is_caught_a_repeated_one_is_not(history: History) -> None:
    history.send("skip", "consume", T0 + 1 * S, fail_times=2, group="g")
    history.ack("skip", T0 + 1 * S + 5)
    history.listen("skip", T0 + 2 * S, "fail", 0)
    history.listen("skip", T0 + 40 * S, "success", 2)
    history.send("again", "consume", T0 + 1 * S, fail_times=1, group="g")
    history.ack("again", T0 + 1 * S + 5)
    history.listen("again", T0 + 2 * S, "fail", 0)
    history.listen("again", T0 + 3 * S, "fail", 0)  # redelivered after a rebalance
    history.listen("again", T0 + 13 * S, "success", 1)
    history.listen("again", T0 + 14 * S, "success", 1)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("reconsume_skipped", "skip", ("none",))]
    assert report.row(NONE_ROW).redelivered == 1


def test_a_skipped_reconsume_count_is_allowed_with_batches(tmp_path: Path) -> None:
    """In a batch, the messages after the first failure are retried without a call."""
    h = History(tmp_path / "h.jsonl", {"consume_message_batch_max_size": 4})
    h.send("skip", "consume", T0 + 1 * S, fail_times=0, group="g")
    h.ack("skip", T0 + 1 * S + 5)
    h.listen("skip", T0 + 12 * S, "success", 1)
    h.drained(T0 + 60 * S)
    assert h.check().ok


def test_orderly_reordering_is_caught(history: History) -> None:
    history.fault("rolling_restart", T0, T0 + 5 * S)
    for seq in range(4):
        history.send(f"o{seq}", "orderly", T0 + 1 * S + seq, key="k", seq=seq, group="go")
        history.ack(f"o{seq}", T0 + 1 * S + seq + 5)
    history.send("other-key", "orderly", T0 + 1 * S, key="j", seq=0, group="go")
    history.ack("other-key", T0 + 1 * S + 5)
    history.listen("o0", T0 + 2 * S, group="go")
    history.listen("o2", T0 + 3 * S, group="go")
    history.listen("other-key", T0 + 3.5 * S, group="go")
    history.listen("o3", T0 + 4 * S, group="go")
    history.listen("o1", T0 + 5 * S, group="go")  # skipped, then consumed last
    history.listen("o0", T0 + 6 * S, group="go")  # a redelivery is not a reordering
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("reordered", "o1", ("rolling_restart",))]
    assert "seq 1 consumed after seq 3" in report.violations[0].detail
    assert report.row("rolling_restart").reordered == 1
    assert report.row("rolling_restart").redelivered == 1


def test_orderly_retries_in_place_without_limit(history: History) -> None:
    history.send("o", "orderly", T0 + 1 * S, key="k", seq=0, fail_times=30, group="go")
    history.ack("o", T0 + 1 * S + 5)
    for r in range(30):
        history.listen("o", T0 + (2 + r) * S, "fail", r, group="go")
    history.listen("o", T0 + 32 * S, "success", 30, group="go")
    history.drained(T0 + 60 * S)
    report = history.check()
    assert report.ok
    assert report.row(NONE_ROW).max_stall_s == pytest.approx(0.995)


def test_an_orderly_message_never_consumed_is_lost_not_reordered(history: History) -> None:
    for seq in range(3):
        history.send(f"o{seq}", "orderly", T0 + 1 * S + seq, key="k", seq=seq, group="go")
        history.ack(f"o{seq}", T0 + 1 * S + seq + 5)
    history.listen("o0", T0 + 2 * S, group="go")
    history.listen("o2", T0 + 3 * S, group="go")
    history.drained(T0 + 60 * S)
    assert kinds(history.check()) == [("lost", "o1", ("none",))]


def test_broadcast_missing_at_one_observer_is_lost(history: History) -> None:
    history.fault("net_drop", T0 + 20 * S, T0 + 30 * S)
    for i, t in enumerate((T0 + 1 * S, T0 + 21 * S)):
        history.send(f"b{i}", "broadcast", t, group="gb")
        history.ack(f"b{i}", t + 5)
        history.listen(f"b{i}", t + 100, observer="bc-1", group="gb")
    history.listen("b0", T0 + 1.1 * S, "fail", observer="bc-2", group="gb")  # dropped: fine
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("lost", "b1", ("net_drop",))]
    assert "bc-2" in report.violations[0].detail


def test_broadcast_observers_from_the_config(tmp_path: Path) -> None:
    h = History(tmp_path / "h.jsonl", {"broadcast_observers": {"bc-1": T0, "bc-3": T0 + 10 * S}})
    h.send("b0", "broadcast", T0 + 1 * S, group="gb")  # before bc-3 listened
    h.ack("b0", T0 + 1 * S + 5)
    h.listen("b0", T0 + 1.1 * S, observer="bc-1", group="gb")
    h.send("b1", "broadcast", T0 + 11 * S, group="gb")
    h.ack("b1", T0 + 11 * S + 5)
    h.listen("b1", T0 + 11.1 * S, observer="bc-1", group="gb")
    h.drained(T0 + 60 * S)
    report = h.check()
    assert kinds(report) == [("lost", "b1", ("none",))]
    assert "bc-3" in report.violations[0].detail


# --- poison records -------------------------------------------------------------------------


def test_poison_records_are_never_lost_and_quarantined_when_expected(history: History) -> None:
    history.send("p-any", "poison", T0 + 1 * S, poison="unknown")
    history.ack("p-any", T0 + 1 * S + 5)
    history.send("p-q", "poison", T0 + 1 * S, poison="bad header", expect="quarantine")
    history.ack("p-q", T0 + 1 * S + 5)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert kinds(report) == [("not_quarantined", "p-q", ("poison-records",))]
    assert report.row(POISON_ROW).operations == 2
    assert report.row(POISON_ROW).other == 1
    assert report.row(ALL_ROW).operations == 0


def test_poison_records_are_not_judged_when_the_drain_gave_up(history: History) -> None:
    history.send("p-q", "poison", T0 + 1 * S, poison="bad header", expect="quarantine")
    history.ack("p-q", T0 + 1 * S + 5)
    history.drained(T0 + 60 * S, detail="gave up")
    assert history.check().ok


# --- spark ---------------------------------------------------------------------------------


def test_spark_missing_and_duplicated_rows(history: History) -> None:
    history.committed("a", T0 + 1 * S)
    history.committed("b", T0 + 2 * S)
    history.committed("c", T0 + 3 * S)
    history.send("rb", "tx", T0 + 1 * S, intent="rollback")
    history.decide("rb", T0 + 1 * S, "ROLLBACK")
    history.ack("rb", T0 + 1 * S + 5)
    history.send("d", "delay", T0 + 1 * S, topic="elsewhere", delay_ms=1000)
    history.ack("d", T0 + 1 * S + 5)
    history.read("d", T0 + 2.5 * S, topic="elsewhere")
    history.drained(T0 + 60 * S)
    history.write("spark", T0 + 90 * S, ids=["a", "a", "c", "rb", "zzz"], topics=["orders"])
    report = history.check()
    assert sorted(kinds(report)) == [
        ("spark_duplicated", "a", ("spark",)),
        ("spark_missing", "b", ("spark",)),
        ("spark_visible_rollback", "rb", ("spark",)),
    ]
    spark = report.row(SPARK_ROW)
    assert (spark.operations, spark.lost, spark.duplicated, spark.other) == (3, 1, 1, 1)
    assert report.row(ALL_ROW).lost == 1
    assert report.row(NONE_ROW).lost == 0  # spark's findings have their own row


def test_spark_is_not_asked_for_what_landed_after_it_started(history: History) -> None:
    history.committed("early", T0 + 1 * S)
    history.committed("late", T0 + 80 * S)
    history.write("spark", T0 + 90 * S, ids=["early"], topics=[], start_t=T0 + 50 * S)
    history.drained(T0 + 100 * S)
    report = history.check()
    assert report.ok, report.render()
    assert report.row(SPARK_ROW).operations == 1


# --- reading -------------------------------------------------------------------------------


def test_a_truncated_last_line_is_tolerated(history: History) -> None:
    history.committed("a", T0 + 1 * S)
    history.drained(T0 + 60 * S)
    history.writer.close()
    with history.path.open("a", encoding="utf-8") as f:
        f.write('{"t": 1700000061000, "type": "recv", "id": "a", "ro')
    report = check_file(history.path)
    assert report.ok
    assert report.row(ALL_ROW).operations == 1


def test_bad_events_are_refused_with_a_typed_error() -> None:
    with pytest.raises(HistoryFormatError, match="unknown kind 'nope'"):
        check([{"t": T0, "type": "send", "id": "x", "kind": "nope"}])
    with pytest.raises(HistoryFormatError, match="sent twice"):
        check([{"t": T0, "type": "send", "id": "x", "kind": "tx"}] * 2)
    with pytest.raises(HistoryFormatError, match="needs an 'id'"):
        check([{"t": T0, "type": "ack", "ok": True}])
    with pytest.raises(HistoryFormatError, match="timer send needs 'delay_ms'"):
        check([{"t": T0, "type": "send", "id": "x", "kind": "timer"}])
    with pytest.raises(HistoryFormatError, match="'delay_ms' must be a number"):
        check([{"t": T0, "type": "send", "id": "x", "kind": "delay", "delay_ms": "5s"}])
    with pytest.raises(ValueError, match="grace_s"):
        check([], grace_s=-1)


def test_observations_of_ids_never_sent_are_counted_not_judged(history: History) -> None:
    history.read("ghost", T0 + 1 * S)
    history.listen("ghost2", T0 + 1 * S)
    history.drained(T0 + 60 * S)
    report = history.check()
    assert report.ok
    assert report.unmatched_ids == 2


def test_render_lists_the_first_violations(history: History) -> None:
    for i in range(5):
        history.send(f"d{i}", "delay", T0 + i * S, delay_ms=1000)
        history.ack(f"d{i}", T0 + i * S + 5)
    history.drained(T0 + 60 * S)
    report = history.check()
    text = report.render(max_violations=2)
    assert "violations (first 2 of 5):" in text
    assert text.rstrip().splitlines()[-1].startswith("lost")
    assert "d1" in text and "d2" not in text
    markdown = report.render_markdown(max_violations=3)
    assert markdown.startswith("| nemesis | faults | operations | acknowledged | lost |")
    assert "| all | 0 | 5 | 5 | 5 | 0 |" in markdown
    assert "| none | - | 5 | 5 | 5 | 0 |" in markdown
    assert "5 violations; drained" in markdown
    assert "- `lost` `d2` [none]:" in markdown


def test_the_command_line_prints_the_table_and_fails_on_a_violation(
    history: History, capsys: pytest.CaptureFixture[str]
) -> None:
    history.send("d", "delay", T0 + 1 * S, delay_ms=1000)
    history.ack("d", T0 + 1 * S + 5)
    history.drained(T0 + 60 * S)
    history.writer.close()
    assert main([str(history.path), "--markdown"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("| nemesis |")
    assert "- `lost` `d` [none]" in out
    assert main([str(history.path), "--grace", "0", "--violations", "0"]) == 1
    assert "violations (first 0 of 1)" in capsys.readouterr().out


def test_outcomes_written_before_their_send_still_count() -> None:
    """Threads write in any order: an ack or decision may precede its send in the file."""
    events = [
        {"t": T0 + 2, "type": "decide", "id": "x", "status": "COMMIT", "via": "execute"},
        {"t": T0 + 3, "type": "ack", "id": "x", "ok": True},
        {"t": T0 + 1, "type": "send", "id": "x", "kind": "tx", "topic": "orders"},
        {"t": T0 + 9, "type": "phase", "name": "drained"},
    ]
    report = check(events)
    assert kinds(report) == [("lost", "x", ("none",))]
    assert report.row(ALL_ROW).acknowledged == 1


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == 5.0
    assert percentile(values, 90) == 9.0
    assert percentile(values, 99) == 10.0
    assert percentile(list(reversed(values)), 10) == 1.0


# --- properties ----------------------------------------------------------------------------

_KIND = st.sampled_from(["tx", "tx", "delay", "timer", "consume", "orderly", "broadcast"])
_NEMESIS = st.sampled_from(["coordinator_kill", "leader_kill", "net_latency"])


def _reader(events: list[dict[str, Any]], op_id: str, at: float, offset: int) -> None:
    events.append(
        {"t": at, "type": "recv", "id": op_id, "observer": "reader", "role": "reader",
         "topic": "orders", "partition": 0, "offset": offset}
    )  # fmt: skip


def _listener(
    events: list[dict[str, Any]], op_id: str, at: float, result: str, r: int, observer: str = "c1"
) -> None:
    events.append(
        {"t": at, "type": "recv", "id": op_id, "observer": observer, "role": "listener",
         "topic": "orders", "partition": 0, "offset": 0, "reconsume_times": r, "group": "g",
         "result": result}
    )  # fmt: skip


@st.composite
def correct_runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """The events of a run that keeps every promise: random operations, outcomes and faults;
    each event a dict with 't' and 'type' in time order."""
    events: list[dict[str, Any]] = []
    config = {
        "max_reconsume_times": 2,
        "broadcast_observers": ["bc-1", "bc-2"],
        "stall_budget_ms": UNBOUNDED,
    }
    events.append({"t": T0, "type": "phase", "name": "start", "config": config})
    for _ in range(draw(st.integers(0, 3))):
        start = T0 + draw(st.integers(0, 100)) * S
        end = start + draw(st.integers(1, 20)) * S
        name = draw(_NEMESIS)
        for phase, t in (("start", start), ("end", end)):
            events.append(
                {"t": t, "type": "nemesis", "name": name, "phase": phase, "target": "node-1"}
            )
    offset = 0
    on_topic: list[str] = []
    seqs: dict[str, int] = {}
    orderly_at = T0 + 200 * S
    for n in range(draw(st.integers(1, 25))):
        op_id, kind = f"op{n}", draw(_KIND)
        t = T0 + draw(st.integers(1, 100_000))
        send: dict[str, Any] = {
            "t": t, "type": "send", "id": op_id, "kind": kind, "topic": "orders", "key": None,
            "seq": None,
        }  # fmt: skip
        acked = draw(st.booleans()) or kind in ("consume", "orderly", "broadcast")
        events.append(send)
        events.append({"t": t + 5, "type": "ack", "id": op_id, "ok": acked})
        if kind == "tx":
            intent = draw(st.sampled_from(["commit", "rollback", "unknown_then_commit"]))
            send["intent"] = intent
            via = "check" if intent.startswith("unknown") else "execute"
            decided_at = t + (6 * S if via == "check" else 2)
            status = "ROLLBACK" if intent == "rollback" else "COMMIT"
            events.append(
                {"t": decided_at, "type": "decide", "id": op_id, "status": status, "via": via}
            )
            if status == "COMMIT" and (acked or draw(st.booleans())):
                offset += 1
                _reader(events, op_id, decided_at + draw(st.integers(1, 30_000)), offset)
                on_topic.append(op_id)
        elif kind in ("delay", "timer"):
            send["delay_ms"] = draw(st.integers(0, 30_000))
            if acked or draw(st.booleans()):
                offset += 1
                at = t + send["delay_ms"] + draw(st.integers(0, 5_000))
                _reader(events, op_id, at, offset)
                on_topic.append(op_id)
        elif kind == "consume":
            fails = send["fail_times"] = draw(st.integers(0, 4))
            send["group"] = "g"
            at = t + 10
            for r in range(min(fails, 3)):
                _listener(events, op_id, at, "fail", r)
                at += (10 + 20 * r) * S
            if fails <= 2:
                _listener(events, op_id, at, "success", fails)
            else:
                events.append(
                    {"t": at + 10, "type": "recv", "id": op_id, "observer": "dlq",
                     "role": "dlq_reader", "topic": "rmq.DLQ.g"}
                )  # fmt: skip
        elif kind == "orderly":
            key = draw(st.sampled_from(["k1", "k2"]))
            send["key"], send["seq"] = key, seqs.get(key, 0)
            seqs[key] = send["seq"] + 1
            orderly_at += draw(st.integers(1, 1000))
            _listener(events, op_id, orderly_at, "success", 0)
        else:
            send["group"] = "gb"
            _listener(events, op_id, t + 50, "success", 0, "bc-1")
            _listener(events, op_id, t + 60, draw(st.sampled_from(["success", "fail"])), 0, "bc-2")
    if draw(st.booleans()):
        events.append({"t": T0 + 9000 * S, "type": "spark", "ids": on_topic, "topics": []})
    events.sort(key=lambda e: e["t"])  # orderly events keep their relative order (stable)
    events.append({"t": T0 + 10_000 * S, "type": "phase", "name": "drained", "detail": ""})
    return events


def round_trip(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` written with :class:`HistoryWriter` and read back."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.jsonl"
        with HistoryWriter(path) as writer:
            for event in events:
                fields = {k: v for k, v in event.items() if k != "type"}
                writer.write(event["type"], **fields)
        return list(read_history(path))


_PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(correct_runs())
def test_every_correct_run_passes(events: list[dict[str, Any]]) -> None:
    report = check(round_trip(events))
    assert report.ok, report.render()
    assert report.row(ALL_ROW).operations == sum(1 for e in events if e["type"] == "send")


def _committed_reads(events: list[dict[str, Any]]) -> list[int]:
    """Indexes of the reader observations of acknowledged committed transactions."""
    acked = {e["id"] for e in events if e["type"] == "ack" and e["ok"]}
    commits = {e["id"] for e in events if e["type"] == "decide" and e["status"] == "COMMIT"}
    return [
        i
        for i, e in enumerate(events)
        if e["type"] == "recv" and e["role"] == "reader" and e["id"] in acked & commits
    ]


@_PROPERTY
@given(correct_runs(), st.data())
def test_deleting_one_committed_copy_is_exactly_one_loss(
    events: list[dict[str, Any]], data: st.DataObject
) -> None:
    candidates = _committed_reads(events)
    if not candidates:
        return
    index = data.draw(st.sampled_from(candidates))
    victim = events[index]["id"]
    report = check(round_trip(events[:index] + events[index + 1 :]))
    assert [(v.kind, v.id) for v in report.violations] == [("lost", victim)]
    assert report.row(ALL_ROW).lost == 1


@_PROPERTY
@given(correct_runs(), st.data())
def test_a_second_committed_copy_is_exactly_one_duplicate(
    events: list[dict[str, Any]], data: st.DataObject
) -> None:
    candidates = _committed_reads(events)
    if not candidates:
        return
    index = data.draw(st.sampled_from(candidates))
    copy = dict(events[index], offset=10**9, t=events[index]["t"] + data.draw(st.integers(1, 10)))
    again = dict(events[index])  # the same record read again is no second copy
    report = check(round_trip([*events[: index + 1], again, copy, *events[index + 1 :]]))
    assert [(v.kind, v.id) for v in report.violations] == [("duplicated", events[index]["id"])]
    assert report.row(ALL_ROW).duplicated == 1


# --- the database in the loop (db) ----------------------------------------------------------


def db_orders(h: History) -> None:
    """Three orders: one placed and applied, one refused by its business rule, one whose
    commit the listener could not tell (UNKNOWN) and the check-back answered from the log."""
    h.send("db-1", "db", T0 + 1 * S, intent="commit")
    h.decide("db-1", T0 + 1 * S + 5, "COMMIT")
    h.ack("db-1", T0 + 1 * S + 10)
    h.read("db-1", T0 + 1.5 * S)
    h.send("db-2", "db", T0 + 2 * S, intent="rollback")
    h.decide("db-2", T0 + 2 * S + 5, "ROLLBACK")
    h.ack("db-2", T0 + 2 * S + 10)
    h.send("db-3", "db", T0 + 3 * S, intent="commit")
    h.decide("db-3", T0 + 3 * S + 5, "UNKNOWN")
    h.ack("db-3", T0 + 3 * S + 10)
    h.decide("db-3", T0 + 11 * S, "COMMIT", via="check")
    h.read("db-3", T0 + 12 * S)


def test_a_database_run_whose_three_sources_agree_passes(history: History) -> None:
    db_orders(history)
    history.drained(T0 + 60 * S)
    history.write("database", T0 + 61 * S, orders=["db-1", "db-3"], effects={"db-1": 1, "db-3": 1})
    report = history.check()
    assert report.ok, report.render()
    assert report.row(ALL_ROW).operations == 3


@pytest.mark.parametrize(
    ("orders", "effects", "reads", "expected"),
    [
        # An order row whose message never came.
        (["db-1", "db-3", "db-4"], {"db-1": 1, "db-3": 1}, [], [("lost", "db-4")]),
        # Its message read twice; its effect applied twice; never applied.
        (["db-1", "db-3"], {"db-1": 1, "db-3": 1}, ["db-1"], [("duplicated", "db-1")]),
        (["db-1", "db-3"], {"db-1": 2, "db-3": 1}, [], [("effect_duplicated", "db-1")]),
        (["db-1", "db-3"], {"db-1": 1}, [], [("effect_lost", "db-3")]),
        # No order row: a COMMIT answer, a message or an effect is one without a row.
        (["db-1"], {"db-1": 1, "db-3": 1}, [], [("without_row", "db-3"), ("without_row", "db-3")]),
        (["db-1", "db-3"], {"db-1": 1, "db-3": 1, "db-2": 1}, [], [("without_row", "db-2")]),
        (["db-1", "db-3"], {"db-1": 1, "db-3": 1}, ["db-2"], [("without_row", "db-2")]),
        # The refused order's row committed, with its message and effect, against its
        # ROLLBACK answer.
        (
            ["db-1", "db-2", "db-3"],
            {"db-1": 1, "db-2": 1, "db-3": 1},
            ["db-2"],
            [
                ("failed_work_committed", "db-2"),
                ("rollback_with_row", "db-2"),
                ("visible_undecided", "db-2"),
            ],
        ),
    ],
)
def test_each_disagreement_of_the_three_sources_is_caught(
    history: History,
    orders: list[str],
    effects: dict[str, int],
    reads: list[str],
    expected: list[tuple[str, str]],
) -> None:
    db_orders(history)
    if "db-4" in orders:
        history.send("db-4", "db", T0 + 4 * S, intent="commit")
        history.decide("db-4", T0 + 4 * S + 5, "COMMIT")
        history.ack("db-4", T0 + 4 * S + 10)
    for op_id in reads:
        history.read(op_id, T0 + 20 * S)
    history.drained(T0 + 60 * S)
    history.write("database", T0 + 61 * S, orders=orders, effects=effects)
    report = history.check()
    assert sorted((kind, op_id) for kind, op_id, _ in kinds(report)) == sorted(expected)
    assert not report.ok


@pytest.mark.parametrize(
    ("answers", "read", "expected"),
    [
        # A row answered ROLLBACK (then COMMIT: the answer that contradicts the row).
        (["ROLLBACK", "COMMIT"], True, ["rollback_with_row"]),
        # A row never answered COMMIT, its message read anyway.
        (["UNKNOWN"], True, ["visible_undecided"]),
        # A row never answered COMMIT and never delivered: lost.
        (["UNKNOWN"], False, ["lost"]),
    ],
)
def test_answers_that_disagree_with_the_row_are_caught(
    history: History, answers: list[str], read: bool, expected: list[str]
) -> None:
    history.send("db-1", "db", T0 + 1 * S, intent="commit")
    for i, status in enumerate(answers):
        history.decide("db-1", T0 + 1 * S + 5 + i * S, status)
    history.ack("db-1", T0 + 1 * S + 10)
    if read:
        history.read("db-1", T0 + 5 * S)
    history.drained(T0 + 60 * S)
    history.write("database", T0 + 61 * S, orders=["db-1"], effects={"db-1": 1}, running=0)
    assert [k for k, _, _ in kinds(history.check())] == expected


def test_an_order_committed_after_the_drain_is_pending(history: History) -> None:
    history.send("db-1", "db", T0 + 1 * S, intent="commit")
    history.drained(T0 + 60 * S)
    history.decide("db-1", T0 + 61 * S, "COMMIT")
    history.ack("db-1", T0 + 61 * S + 10)
    history.write("database", T0 + 62 * S, orders=["db-1"], effects={}, running=0)
    report = history.check()
    assert report.ok and report.pending == 1, report.render()


def test_rows_of_no_db_operation_are_unmatched(history: History) -> None:
    db_orders(history)
    history.drained(T0 + 60 * S)
    history.write(
        "database", T0 + 61 * S, orders=["db-1", "db-3"],
        effects={"db-1": 1, "db-3": 1, "4F0A": 1}, running=0,
    )  # fmt: skip
    report = history.check()
    assert report.ok and report.unmatched_ids == 1, report.render()


def test_an_effect_missing_after_an_incomplete_drain_is_stuck(history: History) -> None:
    db_orders(history)
    history.drained(T0 + 60 * S, detail="gave up after 60 s")
    history.write("database", T0 + 61 * S, orders=["db-1", "db-3"], effects={"db-1": 1})
    assert [(k, i) for k, i, _ in kinds(history.check())] == [("stuck", "db-3")]


def test_a_message_read_before_its_commit_answer_is_early(history: History) -> None:
    history.send("db-1", "db", T0 + 1 * S, intent="commit")
    history.read("db-1", T0 + 1 * S + 2)
    history.decide("db-1", T0 + 1 * S + 5, "COMMIT")
    history.ack("db-1", T0 + 1 * S + 10)
    history.drained(T0 + 60 * S)
    history.write("database", T0 + 61 * S, orders=["db-1"], effects={"db-1": 1})
    assert [k for k, _, _ in kinds(history.check())] == ["early"]


def test_without_a_database_event_a_db_order_is_judged_as_a_transaction(
    history: History,
) -> None:
    db_orders(history)
    history.send("db-4", "db", T0 + 4 * S, intent="commit")
    history.decide("db-4", T0 + 4 * S + 5, "COMMIT")
    history.ack("db-4", T0 + 4 * S + 10)
    history.drained(T0 + 60 * S)
    assert kinds(history.check()) == [("lost", "db-4", (NONE_ROW,))]


@pytest.mark.parametrize(
    "fields",
    [{"orders": "db-1", "effects": {}}, {"orders": [], "effects": {"db-1": -1}}, {"orders": []}],
)
def test_a_malformed_database_event_is_refused(history: History, fields: dict[str, Any]) -> None:
    history.write("database", T0 + 61 * S, **fields)
    with pytest.raises(HistoryFormatError, match="database"):
        history.check()
