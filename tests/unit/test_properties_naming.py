"""Properties of the RocketMQ <-> Kafka name mapping (``topics.naming``), for any input.

What the module promises: every mapped name is a legal Kafka topic name; the mapping reads back
(``parse_kafka_topic``), so no two RocketMQ names share a Kafka topic; the names the bridge makes
(retry, DLQ, check and system topics) never collide with each other or with a user's topic even
under Kafka's ``.``/``_`` rule; Kafka's internal topics are recognised however they are spelt;
the groups the bridge uses itself are refused to users; and whatever cannot be mapped is refused
with :class:`InvalidTopicNameError`, never another exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.errors import InvalidTopicNameError
from topics.catalog import SystemTopic
from topics.naming import (
    COORDINATOR_SERVICE_KINDS,
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicKind,
    broadcast_group,
    check_topic,
    coordinator_group,
    dlq_topic,
    escape_group,
    is_kafka_internal,
    kafka_collision_key,
    parse_kafka_topic,
    retry_topic,
    system_topic,
    to_kafka_topic,
    transaction_check_group,
    unescape_group,
    validate_group,
    validate_namespace,
    validate_user_group,
)

PROPERTY = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Fixed examples (no example database, nothing random between runs), a few hundred each."""

KAFKA_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")
"""Kafka's ``Topic.validate``: 1-249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
GROUP_ALPHABET = "abcXYZ019._-%|"
SYSTEM_NAMES = frozenset(t.value for t in SystemTopic)

groups = st.text(alphabet=GROUP_ALPHABET, min_size=1, max_size=40)
"""Names RocketMQ (and the bridge) accept as groups: ``[%|a-zA-Z0-9._-]``."""
namespaces = st.lists(
    st.text(alphabet="abz09-", min_size=1, max_size=6), min_size=1, max_size=3
).map(".".join)
"""Valid namespaces: dot-separated words of ``[a-zA-Z0-9-]``."""
awkward_text = st.lists(
    st.one_of(
        st.sampled_from("aZ09._-%| \n\t/:\x00"),
        st.characters(),
        st.characters(categories=["Cs"]),
    ),
    max_size=30,
).map("".join)
"""Anything a caller might pass: legal characters, separators, control and non-ASCII ones, lone
surrogates."""
awkward_char = st.one_of(
    st.sampled_from("%| \n\r\t\x00/:+"), st.characters(), st.characters(categories=["Cs"])
)
near_legal = st.builds(
    lambda head, char, tail: head + char + tail,
    st.text(alphabet="aZ09._-", min_size=1, max_size=10),
    awkward_char,
    st.one_of(st.just(""), st.text(alphabet="aZ09._-", max_size=3)),
)
"""A legal name with one character that is not legal in it, at its end as often as not (where
a regular expression's ``$`` also matches before a final newline)."""
rocketmq_names = st.one_of(
    awkward_text,
    near_legal,
    st.builds(
        lambda prefix, rest: prefix + rest,
        st.sampled_from(
            ["", RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX, "rmq.", "rmq_", "__", "._"]
        ),
        st.one_of(groups, near_legal, awkward_text),
    ),
)
"""Topic names as a user writes them: plain, retry, DLQ, in the namespace, internal-looking."""


def is_legal_kafka_topic(name: str) -> bool:
    return KAFKA_LEGAL.fullmatch(name) is not None and name not in (".", "..")


def swap_dots_and_underscores(name: str, mask: list[bool]) -> str:
    """``name`` with the ``.``/``_`` at the positions ``mask`` selects swapped (a name Kafka
    considers the same topic)."""
    out = []
    for i, ch in enumerate(name):
        flip = mask[i % len(mask)] if mask else False
        out.append({".": "_", "_": "."}.get(ch, ch) if flip else ch)
    return "".join(out)


@PROPERTY
@given(name=rocketmq_names, namespace=namespaces)
def test_every_mapped_name_is_a_legal_kafka_topic_and_anything_else_a_typed_error(
    name: str, namespace: str
) -> None:
    try:
        kafka = to_kafka_topic(name, namespace)
    except InvalidTopicNameError:
        return
    assert is_legal_kafka_topic(kafka), repr(kafka)


@PROPERTY
@given(name=rocketmq_names, namespace=namespaces)
def test_every_mapped_name_reads_back_to_the_name_it_came_from(name: str, namespace: str) -> None:
    # Read-back is what makes the mapping injective: two RocketMQ names on one Kafka topic
    # could not both read back.
    try:
        kafka = to_kafka_topic(name, namespace)
    except InvalidTopicNameError:
        return
    parsed = parse_kafka_topic(kafka, namespace, SYSTEM_NAMES)
    assert parsed.rocketmq_name == name
    if name.startswith(RETRY_GROUP_TOPIC_PREFIX):
        assert (parsed.kind, parsed.group) == (TopicKind.RETRY, name[len("%RETRY%") :])
    elif name.startswith(DLQ_GROUP_TOPIC_PREFIX):
        assert (parsed.kind, parsed.group) == (TopicKind.DLQ, name[len("%DLQ%") :])
    else:
        assert parsed.kind is TopicKind.REAL
        assert kafka == name, "a legal Kafka name keeps its name"


@PROPERTY
@given(group=groups, namespace=namespaces)
def test_retry_dlq_and_check_topics_of_any_group_read_back(group: str, namespace: str) -> None:
    for kafka, kind in (
        (retry_topic(group, namespace), TopicKind.RETRY),
        (dlq_topic(group, namespace), TopicKind.DLQ),
        (check_topic(group, namespace), TopicKind.CHECK),
    ):
        assert is_legal_kafka_topic(kafka)
        assert not is_kafka_internal(kafka), "the bridge never names a topic of its own __*"
        parsed = parse_kafka_topic(kafka, namespace, SYSTEM_NAMES)
        assert (parsed.kind, parsed.group) == (kind, group)


@PROPERTY
@given(
    names=st.lists(
        st.builds(
            lambda prefix, rest: prefix + rest,
            st.sampled_from(["", "%RETRY%", "%DLQ%", "ns.", "ns_", "ns."]),
            st.text(alphabet="a._-|%", min_size=1, max_size=5),
        ),
        min_size=2,
        max_size=25,
        unique=True,
    ),
    check_groups=st.lists(st.text(alphabet="a._-|%", min_size=1, max_size=5), max_size=5),
)
def test_the_bridges_own_topics_never_collide_under_kafkas_dot_underscore_rule(
    names: list[str], check_groups: list[str]
) -> None:
    # A small alphabet, so that names differing only by '.' and '_' are common.
    namespace = "ns"
    owner: dict[str, tuple[str, bool]] = {}
    """collision key -> (the RocketMQ name that took it, whether the bridge made the name)"""
    made = [(system_topic(s, namespace), f"system {s}", True) for s in sorted(SYSTEM_NAMES)]
    made += [(check_topic(g, namespace), f"check {g}", True) for g in check_groups]
    for name in names:
        try:
            kafka = to_kafka_topic(name, namespace)
        except InvalidTopicNameError:
            continue
        made.append((kafka, name, name.startswith("%")))
    for kafka, name, ours in made:
        key = kafka_collision_key(kafka)
        if key in owner and owner[key][0] != name:
            other, other_ours = owner[key]
            # Two user topics that differ only by '.'/'_' are the user's own choice (Kafka
            # refuses the second); a name the bridge made must never take part.
            assert not ours and not other_ours, (name, other, kafka)
        owner.setdefault(key, (name, ours))


@PROPERTY
@given(name=st.text(alphabet="._ab", min_size=1, max_size=8), mask=st.lists(st.booleans()))
def test_internal_topics_are_recognised_however_dots_and_underscores_are_spelt(
    name: str, mask: list[bool]
) -> None:
    same_to_kafka = swap_dots_and_underscores(name, mask)
    assert is_kafka_internal(name) == is_kafka_internal(same_to_kafka)
    assert is_kafka_internal("__" + name)
    assert is_kafka_internal(name) == kafka_collision_key(name).startswith("__")


@PROPERTY
@given(group=groups)
def test_escaping_is_reversible_and_leaves_no_dot(group: str) -> None:
    escaped = escape_group(group)
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", escaped), escaped
    assert unescape_group(escaped) == group


@PROPERTY
@given(escaped=st.one_of(awkward_text, st.text(alphabet="_0123456789ABCDEFaz.-", max_size=12)))
def test_unescape_takes_only_canonical_escapes_and_refuses_the_rest_with_a_typed_error(
    escaped: str,
) -> None:
    try:
        group = unescape_group(escaped)
    except InvalidTopicNameError:
        return
    assert escape_group(group) == escaped


@PROPERTY
@given(group=st.one_of(near_legal, awkward_text))
def test_an_accepted_group_holds_only_rocketmqs_group_characters(group: str) -> None:
    try:
        validate_group(group)
    except InvalidTopicNameError:
        return
    assert re.fullmatch(r"[%|a-zA-Z0-9._-]{1,200}", group), repr(group)


@PROPERTY
@given(namespace=st.one_of(namespaces, near_legal, awkward_text))
def test_an_accepted_namespace_prefixes_only_legal_names(namespace: str) -> None:
    try:
        validate_namespace(namespace)
    except InvalidTopicNameError:
        return
    assert re.fullmatch(r"[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*", namespace), repr(namespace)
    for system in SYSTEM_NAMES:
        assert is_legal_kafka_topic(system_topic(system, namespace))


@PROPERTY
@given(kafka_name=st.one_of(awkward_text, rocketmq_names), namespace=namespaces)
def test_parsing_any_kafka_name_answers_or_raises_a_typed_error(
    kafka_name: str, namespace: str
) -> None:
    try:
        parsed = parse_kafka_topic(kafka_name, namespace, SYSTEM_NAMES)
    except InvalidTopicNameError:
        return
    if parsed.kind in (TopicKind.RETRY, TopicKind.DLQ):
        assert to_kafka_topic(parsed.rocketmq_name, namespace) == kafka_name


@PROPERTY
@given(
    namespace=namespaces,
    other_namespace=namespaces,
    group=groups,
    instance=st.text(alphabet="ab1-@.", min_size=1, max_size=8),
)
def test_no_user_group_may_take_a_group_the_bridge_uses(
    namespace: str, other_namespace: str, group: str, instance: str
) -> None:
    own = [
        coordinator_group(ns, kind)
        for ns in (namespace, other_namespace)
        for kind in COORDINATOR_SERVICE_KINDS
    ]
    own += [transaction_check_group(ns, group) for ns in (namespace, other_namespace)]
    own.append(broadcast_group(group, instance))
    for name in own:
        try:
            validate_user_group(name, namespace)
        except InvalidTopicNameError:
            continue
        raise AssertionError(f"{name!r} is the bridge's own group, yet a user may take it")


# --- regressions found by the properties above -------------------------------------------------


@pytest.mark.parametrize(
    ("check", "name"),
    [
        (lambda n: to_kafka_topic(n, "rmq"), "orders\n"),
        (lambda n: to_kafka_topic("%RETRY%" + n, "rmq"), "g\n"),
        (validate_group, "g\n"),
        (validate_namespace, "rmq\n"),
        (lambda n: system_topic("RMQ_SYS_TRANS_HALF_TOPIC", n), "rmq\n"),
    ],
)
def test_a_name_with_a_trailing_newline_is_refused(
    check: Callable[[str], object], name: str
) -> None:
    # A '$' in a pattern used with re.match also matches before a final newline: such names
    # were taken as legal ("orders\n" mapped to itself, which Kafka cannot take).
    with pytest.raises(InvalidTopicNameError):
        check(name)
