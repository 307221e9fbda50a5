"""The trust rules of the coordinator (G12, docs/trust-model.md), as pure logic: which end
requests may decide a pending transaction, what a second half message under a pending
transaction id is, and the name limits of ``CoordinatorConfig`` (``allowed_topics``,
``allowed_producer_groups``)."""

from __future__ import annotations

import dataclasses
import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import (
    ALLOWED_PRODUCER_GROUPS_SETTING,
    ALLOWED_TOPICS_SETTING,
    NamePatterns,
    TrustLimits,
)
from bridge.coordinator.coordinator import CoordinatorConfig
from bridge.coordinator.transaction.state import (
    CheckPolicy,
    HalfArrival,
    HalfPartition,
    PendingHalf,
    end_refusal,
    same_message,
)
from bridge.errors import InvalidArgumentError
from bridge.message import MessageConst, MessageExt, PropertyValue

POLICY = CheckPolicy(transaction_timeout_ms=500, check_interval_ms=1_000, transaction_check_max=3)
T0 = 1_700_000_000_000
ALL = NamePatterns(ALLOWED_PRODUCER_GROUPS_SETTING)
PROPERTY = settings(max_examples=300, derandomize=True, database=None, deadline=None)


def half(
    tid: str = "t",
    group: str | None = "orders-tx",
    body: bytes = b"created",
    props: dict[str, PropertyValue] | None = None,
) -> MessageExt:
    properties: dict[str, PropertyValue] = {
        MessageConst.TRANSACTION_ID: tid,
        MessageConst.REAL_TOPIC: "orders",
    }
    if group is not None:
        properties[MessageConst.PRODUCER_GROUP] = group
    properties.update(props or {})
    return MessageExt(
        "orders",
        body,
        msg_id=tid,
        born_timestamp_ms=T0,
        born_host="10.0.0.1",
        properties=properties,
    )


def pending_of(state: HalfPartition, tid: str = "t") -> PendingHalf:
    return state.pending[tid]


# --- end requests: only the half message's own group decides ------------------------------


def test_an_end_request_of_another_group_decides_nothing_and_the_check_still_comes() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(group="orders-tx"), now_ms=T0)
    assert state.on_end(1, "t", "mallory") is None
    assert "t" in state.pending and not state.is_decided("t")
    assert state.position == 2  # the request is read past
    (due,) = state.due(T0 + 500, 10)  # still checked, with its own group
    assert due.producer_group == "orders-tx"
    state.checked(due, T0 + 500)
    pending = state.on_end(2, "t", "orders-tx")  # the group's own answer decides it
    assert pending is not None
    state.resolve(pending)
    assert state.is_decided("t")


def test_the_refusal_names_both_groups_and_the_transaction() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(group="orders-tx"), now_ms=T0)
    why = end_refusal(pending_of(state), "mallory", "COMMIT", ALL)
    assert why is not None
    assert "'mallory'" in why and "'orders-tx'" in why and "transaction t" in why
    assert end_refusal(pending_of(state), "orders-tx", "COMMIT", ALL) is None


def test_a_half_message_without_a_group_is_decided_by_any_group() -> None:
    # Written by another client (or by hand) without PGROUP: decidable as before the check.
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(group=None), now_ms=T0)
    assert pending_of(state).producer_group == ""
    assert end_refusal(pending_of(state), "anyone", "COMMIT", ALL) is None
    assert state.on_end(1, "t", "anyone") is not None


def test_a_commit_of_a_group_outside_the_allowed_groups_is_refused_a_rollback_is_not() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(group="legacy-tx"), now_ms=T0)
    allowed = NamePatterns.parse(ALLOWED_PRODUCER_GROUPS_SETTING, "orders-*")
    why = end_refusal(pending_of(state), "legacy-tx", "COMMIT", allowed)
    assert why is not None and "allowed_producer_groups" in why and "'legacy-tx'" in why
    assert end_refusal(pending_of(state), "legacy-tx", "ROLLBACK", allowed) is None


@PROPERTY
@given(
    own=st.one_of(st.none(), st.sampled_from(["g", "h", "orders-tx", ""])),
    ends=st.lists(st.tuples(st.sampled_from(["g", "h", "orders-tx", "", "G"]), st.booleans())),
)
def test_only_the_own_group_decides_whatever_comes_first(
    own: str | None, ends: list[tuple[str, bool]]
) -> None:
    """Random end requests (group, commit?) after one half message: the first one of its own
    group (of any group when it names none) decides it; none before it does."""
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(group=own), now_ms=T0)
    decided_by: str | None = None
    for offset, (group, _) in enumerate(ends, start=1):
        pending = state.on_end(offset, "t", group)
        if pending is None:
            continue
        assert decided_by is None
        decided_by = group
        state.resolve(pending)
    expected = next((g for g, _ in ends if not own or g == own), None)
    assert decided_by == expected
    assert state.is_decided("t") == (expected is not None)


# --- a second half message under a pending transaction id ---------------------------------


def test_a_different_half_message_under_a_pending_id_replaces_nothing() -> None:
    state = HalfPartition(0, POLICY)
    assert state.on_half(0, T0, b"a", half(), now_ms=T0) is HalfArrival.NEW
    forged = half(body=b"forged", props={MessageConst.REAL_TOPIC: "payments"})
    assert state.on_half(5, T0, b"b", forged, now_ms=T0) is HalfArrival.CONFLICT
    pending = pending_of(state)
    assert (pending.offset, pending.message.body, pending.envelope) == (0, b"created", b"a")
    assert pending.latest_offset == 5  # a decision names it: a restart finds it decided
    assert state.position == 6
    assert state.checkpoint() == 0


def test_an_identical_copy_or_a_check_copy_is_the_same_transaction() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"a", half(), now_ms=T0)
    assert state.on_half(1, T0, b"a", half(), now_ms=T0) is HalfArrival.COPY  # stored twice
    copy = half(props={MessageConst.TRANSACTION_CHECK_TIMES: "1"})
    assert state.on_half(2, T0, b"c", copy, now_ms=T0) is HalfArrival.COPY  # a check copy
    pending = pending_of(state)
    assert (pending.offset, pending.check_times, pending.message.body) == (2, 1, b"created")
    assert state.on_half(1, T0, b"a", half(), now_ms=T0) is HalfArrival.OLD  # read again


def test_a_second_half_message_of_a_decided_transaction_changes_nothing() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(), now_ms=T0)
    pending = state.on_end(1, "t", "orders-tx")
    assert pending is not None
    state.resolve(pending)
    assert state.on_half(2, T0, b"", half(body=b"forged"), now_ms=T0) is HalfArrival.OLD
    assert "t" not in state.pending


def test_a_different_message_while_the_commit_is_applied_on_its_own_is_a_conflict() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(), now_ms=T0)
    pending = state.on_end(1, "t", "orders-tx")
    assert pending is not None
    state.hold(pending)
    assert state.on_half(2, T0, b"", half(body=b"forged"), now_ms=T0) is HalfArrival.CONFLICT
    assert pending_of(state).message.body == b"created" and pending_of(state).latest_offset == 2


def test_a_conflicting_message_holds_the_checkpoint_only_until_a_copy_is_read_past_it() -> None:
    """A writer of HALF with its own half message (a 72 h immunity) and a second, different
    one under its id: once the put-back copy is read back past the second one, a restart from
    there never reads it, and the checkpoint (and the decisions kept) moves on."""
    policy = CheckPolicy(transaction_timeout_ms=6_000, check_interval_ms=60_000)
    state = HalfPartition(0, policy)
    immunity: dict[str, PropertyValue] = {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "259200"}
    assert state.on_half(0, T0, b"h", half("x", props=immunity), now_ms=T0) is HalfArrival.NEW
    other = half("x", body=b"other", props=immunity)
    assert state.on_half(1, T0, b"f", other, now_ms=T0) is HalfArrival.CONFLICT
    assert state.checkpoint() == 0  # a restart from 1 would take the other one for x
    for i in range(2, 2000):
        state.on_half(2 * i, T0, b"", half(f"g{i}"), now_ms=T0)
        decided = state.on_end(2 * i + 1, f"g{i}", "orders-tx")
        assert decided is not None
        state.resolve(decided)
    assert state.checkpoint() == 0  # x's own copy at 0 is still the one read
    (put_back,) = state.put_backs_due(T0 + 60_000, 10)
    assert put_back.transaction_id == "x"
    copy = half("x", props=immunity)
    assert state.on_half(5000, T0 + 60_000, b"h", copy, now_ms=T0 + 60_000) is HalfArrival.COPY
    assert state.checkpoint() == 5000
    assert state.decided_count < 1024  # the decisions before the checkpoint are forgotten
    assert pending_of(state, "x").message.body == b"created"


def test_a_pin_holds_while_anything_pending_lies_before_the_conflicting_message() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("x"), now_ms=T0)
    state.on_half(1, T0, b"", half("y"), now_ms=T0)
    assert state.on_half(2, T0, b"", half("x", body=b"other"), now_ms=T0) is HalfArrival.CONFLICT
    copy = half("x", props={MessageConst.TRANSACTION_CHECK_TIMES: "1"})
    assert state.on_half(3, T0, b"", copy, now_ms=T0) is HalfArrival.COPY
    # y at 1 lies before the conflicting message at 2: read from 1, a restart would meet it
    # before x's copy at 3, so it reads from x's copy at 0.
    assert state.checkpoint() == 0
    decided = state.on_end(4, "y", "orders-tx")
    assert decided is not None
    state.resolve(decided)
    assert state.checkpoint() == 3
    assert pending_of(state, "x").pins == []  # never needed again
    # A later conflicting message needs nothing: a restart reads x's copy at 3 before it.
    assert state.on_half(5, T0, b"", half("x", body=b"again"), now_ms=T0) is HalfArrival.CONFLICT
    assert state.checkpoint() == 3


def test_a_conflicting_message_after_every_copy_keeps_the_checkpoint_one_copy_behind() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("x"), now_ms=T0)
    offset = 1
    for checks in range(1, 6):
        other = half("x", body=f"other{checks}".encode())
        assert state.on_half(offset, T0, b"", other, now_ms=T0) is HalfArrival.CONFLICT
        copy = half("x", props={MessageConst.TRANSACTION_CHECK_TIMES: str(checks)})
        assert state.on_half(offset + 1, T0, b"", copy, now_ms=T0) is HalfArrival.COPY
        assert state.checkpoint() == offset + 1  # the copy just read: past every other one
        offset += 2
    assert state.on_half(offset, T0, b"", half("x", body=b"last"), now_ms=T0) is (
        HalfArrival.CONFLICT
    )
    assert state.checkpoint() == offset - 1


def test_pins_that_bring_each_others_conflicts_within_reach_all_apply() -> None:
    state = HalfPartition(0, POLICY)
    first: dict[str, PropertyValue] = {MessageConst.TRANSACTION_CHECK_TIMES: "1"}
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    state.on_half(1, T0, b"", half("b"), now_ms=T0)
    assert state.on_half(2, T0, b"", half("a", body=b"o"), now_ms=T0) is HalfArrival.CONFLICT
    assert state.on_half(3, T0, b"", half("a", props=first), now_ms=T0) is HalfArrival.COPY
    assert state.on_half(4, T0, b"", half("b", body=b"o"), now_ms=T0) is HalfArrival.CONFLICT
    assert state.on_half(5, T0, b"", half("b", props=first), now_ms=T0) is HalfArrival.COPY
    # Unpinned: 3 (a's copy), before b's conflicting message at 4: b's pin, 1. That is before
    # a's conflicting message at 2: a's pin, 0.
    assert state.checkpoint() == 0


@PROPERTY
@given(
    script=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["copy", "other", "end"])),
        max_size=25,
    )
)
def test_a_restart_from_the_checkpoint_meets_each_pending_message_before_any_other(
    script: list[tuple[str, str]],
) -> None:
    """Whatever the order of copies, conflicting messages and decisions: the first half
    message a restart from the checkpoint reads under a pending id is that transaction's own
    (the one the live state holds), never a conflicting one."""
    state = HalfPartition(0, POLICY)
    log: list[tuple[str, MessageExt | None]] = []

    def append(tid: str, msg: MessageExt | None) -> int:
        log.append((tid, msg))
        return len(log) - 1

    for tid in "abc":
        state.on_half(append(tid, half(tid)), T0, b"", half(tid), now_ms=T0)
    checks = dict.fromkeys("abc", 0)
    for tid, what in script:
        if what == "end":
            decided = state.on_end(append(tid, None), tid, "orders-tx")
            if decided is not None:
                state.resolve(decided)
            continue
        if what == "copy":
            checks[tid] += 1
            msg = half(tid, props={MessageConst.TRANSACTION_CHECK_TIMES: str(checks[tid])})
        else:
            msg = half(tid, body=b"other")
        state.on_half(append(tid, msg), T0, b"", msg, now_ms=T0)
        checkpoint = state.checkpoint()
        for pending in state.pending.values():
            first = next(m for t, m in log[checkpoint:] if t == pending.transaction_id)
            assert first is not None and same_message(first, pending.message)


VALUES = st.one_of(st.text(max_size=4), st.binary(max_size=4))
CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "body": st.binary(max_size=4),
        "msg_id": st.sampled_from(["t", "u"]),
        "born": st.integers(0, 2),
        "host": st.sampled_from(["10.0.0.1", "10.0.0.2"]),
        "props": st.dictionaries(
            st.sampled_from(
                [
                    MessageConst.REAL_TOPIC,
                    MessageConst.REAL_QUEUE_ID,
                    MessageConst.PRODUCER_GROUP,
                    MessageConst.KEYS,
                    "user",
                ]
            ),
            VALUES,
            max_size=3,
        ),
        "checks": st.one_of(st.integers(0, 3).map(str), st.sampled_from(["", "x", "²"])),
    },
)


def _changed(msg: MessageExt, changes: dict[str, object]) -> MessageExt:
    props = msg.properties
    props.update(changes.get("props", {}))  # type: ignore[call-overload]
    if "checks" in changes:
        props[MessageConst.TRANSACTION_CHECK_TIMES] = changes["checks"]  # type: ignore[assignment]
    return MessageExt(
        msg.topic,
        changes.get("body", msg.body),  # type: ignore[arg-type]
        msg_id=changes.get("msg_id", msg.msg_id),  # type: ignore[arg-type]
        born_timestamp_ms=msg.born_timestamp_ms + changes.get("born", 0),  # type: ignore[operator]
        born_host=changes.get("host", msg.born_host),  # type: ignore[arg-type]
        properties=props,
    )


@PROPERTY
@given(changes=st.lists(CHANGES, min_size=1, max_size=6))
def test_the_pending_message_is_only_ever_replaced_by_itself(
    changes: list[dict[str, object]],
) -> None:
    """After a half message, any sequence of half messages under its transaction id (copies
    differing in anything): the pending message keeps its content but for the check count;
    an arrival is a CONFLICT unless it is the same message, then a DUPLICATE (dropped) when
    it counts fewer checks than the copy the pending one is read from, else a COPY (read from
    there now)."""
    original = half()
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", original, now_ms=T0)
    for offset, change in enumerate(changes, start=1):
        msg = _changed(original, change)
        before = pending_of(state)
        read_count = check_count(before.message)
        arrival = state.on_half(offset, T0, b"", msg, now_ms=T0)
        if not same_message(original, msg):
            assert arrival is HalfArrival.CONFLICT
        elif check_count(msg) < read_count:
            assert arrival is HalfArrival.DUPLICATE
        else:
            assert arrival is HalfArrival.COPY
        pending = pending_of(state)
        assert same_message(pending.message, original)
        assert pending.latest_offset == offset
        assert pending.offset == (offset if arrival is HalfArrival.COPY else before.offset)
        assert check_count(pending.message) >= read_count  # a restart forgets no check


def check_count(msg: MessageExt) -> int:
    raw = msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)
    return int(raw) if isinstance(raw, str) and raw.isascii() and raw.isdigit() else 0


def test_a_copy_counting_fewer_checks_than_the_one_read_is_dropped() -> None:
    # A send stored twice whose second copy comes after the first check copy: read from
    # there, a restart would count the check made as never made.
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half(), now_ms=T0)
    (due,) = state.due(T0 + 500, 10)
    state.checked(due, T0 + 500)
    copy = half(props={MessageConst.TRANSACTION_CHECK_TIMES: "1"})
    assert state.on_half(1, T0 + 500, b"", copy, now_ms=T0 + 500) is HalfArrival.COPY
    assert state.on_half(2, T0 + 600, b"", half(), now_ms=T0 + 600) is HalfArrival.DUPLICATE
    pending = pending_of(state)
    assert (pending.offset, pending.check_times, pending.latest_offset) == (1, 1, 2)


# --- name limits ----------------------------------------------------------------------------


def test_default_limits_allow_every_topic_and_group() -> None:
    config = CoordinatorConfig(coordinator_id="c")
    limits = config.trust_limits
    assert limits == TrustLimits()
    assert limits.topics.allows_all and limits.producer_groups.allows_all
    assert limits.topics.refusal("topic", "anything.at-all") is None
    assert limits.producer_groups.refusal("producer group", "") is None


def test_limits_come_from_the_environment_and_refusals_name_the_setting() -> None:
    config = CoordinatorConfig.from_env(
        {
            "BRIDGE_COORDINATOR_ID": "c",
            "BRIDGE_ALLOWED_TOPICS": " orders , payments-* ,rmq.RETRY.*",
            "BRIDGE_ALLOWED_PRODUCER_GROUPS": "orders-tx",
        }
    )
    topics = config.trust_limits.topics
    assert topics.patterns == ("orders", "payments-*", "rmq.RETRY.*")
    assert topics.allows("payments-eu") and topics.allows("rmq.RETRY.billing")
    assert not topics.allows("Orders") and not topics.allows("orders-2")
    why = topics.refusal("topic", "audit")
    assert why == (
        "topic 'audit' is not allowed by allowed_topics (BRIDGE_ALLOWED_TOPICS)="
        "orders,payments-*,rmq.RETRY.*"
    )
    groups = config.trust_limits.producer_groups
    assert groups.allows("orders-tx") and not groups.allows("")
    assert ALLOWED_PRODUCER_GROUPS_SETTING in (groups.refusal("producer group", "x") or "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.allowed_topics = "*"  # type: ignore[misc]


@pytest.mark.parametrize("text", ["", ",", "orders,", "orders,,payments", "a b", "tab\there"])
def test_a_malformed_pattern_list_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="allowed_topics"):
        CoordinatorConfig(coordinator_id="c", allowed_topics=text)
    with pytest.raises(InvalidArgumentError, match="allowed_producer_groups"):
        CoordinatorConfig(coordinator_id="c", allowed_producer_groups=text)


@pytest.mark.parametrize(
    ("topics", "stray"),
    [("%RETRY%billing", "%"), ("orders,%DLQ%*", "%"), ("a/b", "/"), ("o:*", ":")],
)
def test_a_topic_pattern_no_kafka_topic_name_can_match_is_refused(topics: str, stray: str) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        CoordinatorConfig(coordinator_id="c", allowed_topics=topics)
    text = str(refused.value)
    assert text.startswith(ALLOWED_TOPICS_SETTING + ": "), text
    assert f"no topic name holds {stray!r}" in text, text
    assert "rmq.RETRY.<group>" in text and "not %RETRY%<group>" in text, text


def test_producer_group_patterns_take_the_characters_group_names_have() -> None:
    config = CoordinatorConfig(coordinator_id="c", allowed_producer_groups="%SYS%|tx-*,[!x]?.g_1")
    assert config.trust_limits.producer_groups.allows("%SYS%|tx-orders")
    with pytest.raises(InvalidArgumentError, match=r"allowed_producer_groups.*no producer group"):
        CoordinatorConfig(coordinator_id="c", allowed_producer_groups="orders/tx")
    # Every character a Kafka topic name can hold, and the glob ones, are accepted.
    limits = NamePatterns.parse(ALLOWED_TOPICS_SETTING, "aZ09._-*?[]!")
    assert limits.patterns == ("aZ09._-*?[]!",)


def test_patterns_must_be_text() -> None:
    with pytest.raises(InvalidArgumentError, match="allowed_topics"):
        CoordinatorConfig(coordinator_id="c", allowed_topics=["orders"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="at least one"):
        NamePatterns(ALLOWED_TOPICS_SETTING, ())


NAMES = st.text(alphabet="ab.-_*?[]!09", max_size=8)


@PROPERTY
@given(patterns=st.lists(st.text(alphabet="ab.-*?09", min_size=1, max_size=5), min_size=1,
                         max_size=4), name=NAMES)  # fmt: skip
def test_a_name_is_allowed_exactly_when_a_pattern_matches_it_whole(
    patterns: list[str], name: str
) -> None:
    limits = NamePatterns.parse(ALLOWED_TOPICS_SETTING, ",".join(patterns))
    expected = any(fnmatch.fnmatchcase(name, p) for p in patterns)
    assert limits.allows(name) == expected
    assert (limits.refusal("topic", name) is None) == expected
    assert NamePatterns(ALLOWED_TOPICS_SETTING).allows(name)  # the default allows all
