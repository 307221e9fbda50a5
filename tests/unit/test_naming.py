"""The RocketMQ <-> Kafka topic name mapping: reversible, collision-free, clear errors."""

from __future__ import annotations

import random
import re

import pytest

from topics.catalog import SystemTopic, TopicCatalog
from topics.errors import InvalidTopicNameError
from topics.naming import (
    KAFKA_TOPIC_MAX_LENGTH,
    TopicKind,
    check_topic,
    dlq_topic,
    escape_group,
    kafka_collision_key,
    parse_kafka_topic,
    retry_topic,
    to_kafka_topic,
    unescape_group,
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
