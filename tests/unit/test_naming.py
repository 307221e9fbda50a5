"""The RocketMQ <-> Kafka topic name mapping: reversible, collision-free, clear errors."""

from __future__ import annotations

import random
import re

import pytest

from topics.catalog import SystemTopic, TopicCatalog
from topics.errors import InvalidArgumentError, InvalidTopicNameError
from topics.naming import (
    COORDINATOR_SERVICE_KINDS,
    KAFKA_TOPIC_MAX_LENGTH,
    TopicKind,
    broadcast_group,
    check_topic,
    coordinator_group,
    coordinator_group_instance_id,
    coordinator_transactional_id,
    dlq_topic,
    escape_group,
    group_topics_pattern,
    is_kafka_internal,
    kafka_collision_key,
    operator_transactional_id,
    parse_kafka_topic,
    reader_group,
    real_topics_pattern,
    retry_topic,
    system_topic,
    to_kafka_topic,
    transaction_check_group,
    unescape_group,
    validate_user_group,
)

KAFKA_LEGAL = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
GROUP_ALPHABET = "abcXYZ019_-.%|"


def random_groups(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(rng.choice(GROUP_ALPHABET) for _ in range(rng.randint(1, 12))) for _ in range(count)
    ]


@pytest.mark.parametrize(
    ("rocketmq", "kafka"),
    [
        ("orders", "orders"),
        ("orders.v1_eu-west", "orders.v1_eu-west"),
        ("%RETRY%order_consumer", "rmq.RETRY.order__consumer"),
        ("%DLQ%order_consumer", "rmq.DLQ.order__consumer"),
        ("%RETRY%a.b", "rmq.RETRY.a_2Eb"),
        ("%DLQ%x|y%z", "rmq.DLQ.x_7Cy_25z"),
        ("%RETRY%CID-1", "rmq.RETRY.CID-1"),
    ],
)
def test_known_mappings(rocketmq: str, kafka: str) -> None:
    assert to_kafka_topic(rocketmq) == kafka
    assert KAFKA_LEGAL.match(kafka)


def test_mapping_is_reversible_for_random_groups() -> None:
    system_names = frozenset(t.value for t in SystemTopic)
    for group in random_groups(2000, seed=7):
        for name, kind in ((f"%RETRY%{group}", TopicKind.RETRY), (f"%DLQ%{group}", TopicKind.DLQ)):
            kafka = to_kafka_topic(name, "ns")
            assert KAFKA_LEGAL.match(kafka), kafka
            parsed = parse_kafka_topic(kafka, "ns", system_names)
            assert parsed.kind is kind
            assert parsed.rocketmq_name == name
            assert parsed.group == group
        assert unescape_group(escape_group(group)) == group
        parsed_check = parse_kafka_topic(check_topic(group, "ns"), "ns", system_names)
        assert (parsed_check.kind, parsed_check.group) == (TopicKind.CHECK, group)


def test_escaped_group_never_contains_a_dot() -> None:
    for group in random_groups(2000, seed=11):
        assert "." not in escape_group(group)


def test_no_two_names_collide_even_under_kafkas_dot_underscore_rule() -> None:
    groups = sorted(set(random_groups(5000, seed=3)) | {"a.b", "a_b", "a__b", "a_2Eb", "a|b"})
    catalog = TopicCatalog()
    names = [retry_topic(g) for g in groups] + [dlq_topic(g) for g in groups]
    names += [check_topic(g) for g in groups]
    names += [catalog.topic(t) for t in SystemTopic]
    keys = [kafka_collision_key(n) for n in names]
    assert len(set(names)) == len(names)
    assert len(set(keys)) == len(keys)


def test_real_topics_keep_their_names_and_parse_back_as_real() -> None:
    for name in ["orders", "a.b", "a_b", "payments-2024"]:
        assert to_kafka_topic(name) == name
        assert parse_kafka_topic(name).kind is TopicKind.REAL


def test_system_topics_parse_back() -> None:
    catalog = TopicCatalog(namespace="prod.eu")
    for system in SystemTopic:
        parsed = catalog.parse(catalog.topic(system))
        assert parsed.kind is TopicKind.SYSTEM
        assert parsed.rocketmq_name == system.value


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        ("orders with space", "[' ']"),
        ("ord|ers", "['|']"),
        ("%RETRY%", "must not be empty"),
        ("%RETRY%bad group", "[' ']"),
        ("rmq.orders", "reserved"),
        ("rmq_orders", "reserved"),
        ("x" * (KAFKA_TOPIC_MAX_LENGTH + 1), "more than Kafka's 249"),
        ("%DLQ%" + "g" * 201, "at most 200"),
    ],
)
def test_invalid_names_raise_a_typed_error_naming_the_problem(name: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicNameError) as info:
        to_kafka_topic(name)
    assert fragment in str(info.value)


@pytest.mark.parametrize("namespace", ["", "a_b", "a..b", ".a", "a b", "x" * 65])
def test_invalid_namespaces_are_refused(namespace: str) -> None:
    with pytest.raises(InvalidTopicNameError, match="namespace"):
        TopicCatalog(namespace=namespace)


def test_unescape_refuses_non_canonical_or_broken_escapes() -> None:
    for bad in ["a_", "a_zz", "a_41", "a.b"]:  # _41 is 'A', which escapes as itself
        with pytest.raises(InvalidTopicNameError):
            unescape_group(bad)


def test_unknown_name_in_namespace_is_an_error() -> None:
    with pytest.raises(InvalidTopicNameError, match="unknown topic"):
        TopicCatalog().parse("rmq.SOMETHING_ELSE")


# --- group names: the bridge's own, and what users may not take --------------------------------


def test_the_bridges_own_group_names() -> None:
    assert coordinator_group("ns", "timer") == "ns.coordinator.timer"
    assert transaction_check_group("ns", "orders_tx") == "ns.transaction-check.orders_tx"
    assert broadcast_group("g", "host@1") == "g.broadcast.host@1"
    assert coordinator_transactional_id("ns", "schedule", "c1") == "ns.coordinator.schedule.c1"
    assert coordinator_group_instance_id("c1", "transaction") == "c1-transaction"
    assert operator_transactional_id("ns", "abc") == "ns.operator.abc"
    assert reader_group("reader", "1a2b") == "bridge-reader-1a2b"
    with pytest.raises(InvalidArgumentError, match="kind"):
        coordinator_group("ns", "nope")


@pytest.mark.parametrize(
    ("group", "fragment"),
    [
        ("ns.coordinator.transaction", "namespace 'ns'"),
        ("ns.transaction-check.g", "namespace 'ns'"),
        ("ns.operator.x", "namespace 'ns'"),
        ("ns.anything", "namespace 'ns'"),
        ("other.coordinator.schedule", "coordinator"),
        ("a.b.transaction-check.g", "transaction-check"),
        ("orders.broadcast.host-1", "broadcast"),
    ],
)
def test_a_user_group_may_not_take_a_name_the_bridge_uses(group: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicNameError, match="reserved") as info:
        validate_user_group(group, "ns")
    assert fragment in str(info.value)


def test_every_group_name_of_the_bridge_is_refused_for_users() -> None:
    groups = [*random_groups(500, seed=5), "orders", "a.b", "ns"]
    own = {coordinator_group(ns, k) for ns in ("ns", "prod.eu") for k in COORDINATOR_SERVICE_KINDS}
    own |= {transaction_check_group(ns, g) for ns in ("ns", "prod.eu") for g in groups}
    own |= {broadcast_group(g, i) for g in groups for i in ("i-1", "host@12")}
    for name in own:
        with pytest.raises(InvalidTopicNameError):
            validate_user_group(name, "ns")
    for group in ["orders", "a.b", "ns", "ns-x", "nsx.a", "a.ns", "order_consumer", "%x|y"]:
        assert validate_user_group(group, "ns") == group


@pytest.mark.parametrize(
    ("name", "internal"),
    [
        ("__consumer_offsets", True),
        ("__transaction_state", True),
        ("._x", True),  # Kafka treats '.' like '_': it collides with '__x'
        ("_.x", True),
        ("_x", False),
        ("orders", False),
        ("rmq.SCHEDULE_TOPIC_XXXX", False),
    ],
)
def test_kafka_internal_topics_are_recognised(name: str, internal: bool) -> None:
    assert is_kafka_internal(name) is internal


@pytest.mark.parametrize("namespace", ["rmq", "a.b-c"])
def test_topic_patterns_split_real_topics_from_the_namespaces_own(namespace: str) -> None:
    real = re.compile(real_topics_pattern(namespace))
    groups = re.compile(group_topics_pattern(namespace))
    retry, dlq = retry_topic("g.1", namespace), dlq_topic("g_1", namespace)
    for name in (retry, dlq):
        assert groups.fullmatch(name) and not real.fullmatch(name)
    for system in SystemTopic:
        name = system_topic(system.value, namespace)
        assert not real.fullmatch(name) and not groups.fullmatch(name)
    for name in ("orders", "a", "RETRY.x", namespace + "x.RETRY.g"):
        assert real.fullmatch(name) and not groups.fullmatch(name)
    for name in ("__consumer_offsets", namespace + "_x"):
        assert not real.fullmatch(name)


@pytest.mark.parametrize("namespace", ["", "a_b", "x" * 65, [], {}])
def test_system_topic_refuses_a_bad_namespace_with_the_typed_error_every_time(
    namespace: object,
) -> None:
    # system_topic keeps the names it checked: a refusal is never kept, and a value a cache
    # cannot key on (an empty list, as an unchecked caller might pass) is refused as before
    # the cache, not with the cache's TypeError.
    for _ in range(2):
        with pytest.raises(InvalidTopicNameError, match="a namespace must be"):
            system_topic(SystemTopic.TIMER.value, namespace)  # type: ignore[arg-type]
    assert system_topic(SystemTopic.TIMER.value, "ns") == f"ns.{SystemTopic.TIMER.value}"
