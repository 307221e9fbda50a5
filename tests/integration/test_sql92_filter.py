"""SQL92 property filters on a real broker: a push consumer (threaded, asyncio, BROADCASTING)
with ``MessageSelector.by_sql`` gets exactly the matching messages; the rest are committed and
never come back; a property that is missing or not UTF-8 behaves as RocketMQ's rules say; a
record whose headers cannot be read is quarantined as before; an invalid expression is refused
at subscribe."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    FilterExpression,
    FilterExpressionError,
    FilterExpressionType,
    Message,
    MessageExt,
    MessageModel,
    MessageSelector,
    Producer,
    PushConsumer,
    aio,
)
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from tests.integration.test_consumer import coordinator, retry_config  # noqa: F401 - fixtures
from tests.integration.test_consumer import start_consumer as start
from tests.integration.test_consumer_isolation import produce_with_raw_header_names
from topics.catalog import TopicSpec

pytestmark = pytest.mark.broker

EXPRESSION = "TAGS IN ('TagA', 'TagB') AND amount > 100 AND region <> 'us'"
SENT: list[tuple[str, str | None, dict[str, str]]] = [
    # (body, tag, user properties)
    ("match-1", "TagA", {"amount": "150", "region": "eu"}),
    ("match-2", "TagB", {"amount": "101", "region": "asia"}),
    ("low", "TagA", {"amount": "100", "region": "eu"}),
    ("other-tag", "TagC", {"amount": "500", "region": "eu"}),
    ("no-tag", None, {"amount": "500", "region": "eu"}),
    ("us", "TagA", {"amount": "500", "region": "us"}),
    ("no-amount", "TagA", {"region": "eu"}),  # missing: amount > 100 is null, never a match
    ("no-region", "TagA", {"amount": "500"}),  # missing: region <> 'us' is null too
    ("not-a-number", "TagB", {"amount": "lots", "region": "eu"}),  # an error: no match
    ("decimal", "TagB", {"amount": "150.5", "region": "eu"}),  # Integer.valueOf fails
    ("match-3", "TagA", {"amount": "2147483647", "region": "eu"}),
]
MATCHING = {"match-1", "match-2", "match-3"}


class Received:
    """The bodies a listener got, in order."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            self.bodies.append(msg.body.decode())
        return ConsumeStatus.CONSUME_SUCCESS

    def snapshot(self) -> list[str]:
        with self.lock:
            return list(self.bodies)


@pytest.fixture()
def consumers() -> Iterator[list[PushConsumer]]:
    made: list[PushConsumer] = []
    yield made
    for consumer in made:
        consumer.shutdown()


def make_topic(config: ClientConfig, name: str, partitions: int = 2) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(name, partitions)])
    return name


def send_all(config: ClientConfig, topic: str) -> None:
    with Producer("sql92_pg", config=config) as producer:
        for i, (body, tag, props) in enumerate(SENT):
            producer.send_sync(Message(topic, body, tags=tag, keys=f"k{i}", properties=props))


def committed_total(config: ClientConfig, group: str, topic: str, partitions: int = 2) -> int:
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    try:
        offsets = reader.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
        return sum(max(tp.offset, 0) for tp in offsets)
    finally:
        reader.close()


def test_a_sql92_selector_delivers_exactly_the_matching_messages_and_commits_the_rest(
    client_config: ClientConfig,
    consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:
    topic = make_topic(client_config, unique("t"))
    send_all(client_config, topic)
    group = unique("g")
    received = Received()
    consumer = start(
        consumers, client_config, group, topic, received, MessageSelector.by_sql(EXPRESSION)
    )
    filtered = len(SENT) - len(MATCHING)
    wait_until(lambda: consumer.stats().filtered == filtered and len(received.snapshot()) == 3)
    assert sorted(received.snapshot()) == sorted(MATCHING)
    assert consumer.stats().consumed == len(MATCHING)
    # Filtered messages are done: the committed offsets pass them.
    wait_until(lambda: committed_total(client_config, group, topic) == len(SENT))
    consumer.shutdown()

    # A new member of the group gets none of them again, only what comes next.
    again = Received()
    restarted = start(
        consumers, client_config, group, topic, again,
        FilterExpression(EXPRESSION, FilterExpressionType.SQL92),
    )  # fmt: skip
    with Producer("sql92_pg", config=client_config) as producer:
        producer.send_sync(
            Message(topic, "after", tags="TagB", properties={"amount": "999", "region": "eu"})
        )
        producer.send_sync(Message(topic, "after-filtered", tags="TagC"))
    wait_until(lambda: again.snapshot() == ["after"] and restarted.stats().filtered == 1)
    wait_until(lambda: committed_total(client_config, group, topic) == len(SENT) + 2)
    assert again.snapshot() == ["after"]


def test_property_bytes_that_are_not_utf8_read_as_rocketmq_decodes_them(
    client_config: ClientConfig,
    consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:
    """A header another Kafka client wrote as bytes that are not UTF-8 is compared as the text
    RocketMQ's broker would decode (U+FFFD for the bad bytes); a header *name* that is not
    UTF-8 cannot be read at all: the record is quarantined, as without a filter, and the
    others go on."""
    topic = make_topic(client_config, unique("t"), partitions=1)
    records: list[tuple[bytes, list[tuple[bytes, bytes]]]] = [
        (b"bad-bytes", [(b"TAGS", b"TagA"), (b"region", b"\xffeu")]),
        (b"plain", [(b"TAGS", b"TagA"), (b"region", b"eu")]),
        (b"bad-name", [(b"TAGS", b"TagA"), (b"\xff\xferegion", b"eu")]),
        (b"no-headers", []),
        (b"bad-number", [(b"TAGS", b"TagA"), (b"region", b"eu"), (b"n", b"\xff1")]),
    ]
    produce_with_raw_header_names(client_config.bootstrap_servers, topic, records)
    ends = Received()
    starts = Received()
    group_a, group_b = unique("g"), unique("g")
    a = start(consumers, client_config, group_a, topic, ends,
              MessageSelector.by_sql("region ENDSWITH 'eu' AND NOT (n > 0)"))  # fmt: skip
    b = start(consumers, client_config, group_b, topic, starts,
              MessageSelector.by_sql("region = 'eu' OR region = '\ufffdeu'"))  # fmt: skip
    matched_b = ["bad-bytes", "bad-number", "plain"]
    for consumer, listener, wanted in ((a, ends, []), (b, starts, matched_b)):
        wait_until(lambda c=consumer: c.stats().quarantined == 1)  # type: ignore[misc]
        wait_until(
            lambda c=consumer, w=wanted: c.stats().filtered == 4 - len(w)  # type: ignore[misc]
        )
        assert sorted(listener.snapshot()) == wanted
    # "NOT (n > 0)": n missing is null, NOT null is null; n not a number is an error.
    assert a.stats().filtered == 4


def test_broadcasting_consumers_filter_alike(
    client_config: ClientConfig,
    consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:
    topic = make_topic(client_config, unique("t"))
    group = unique("g")
    instances = [Received(), Received()]
    selector = MessageSelector.by_sql(EXPRESSION)
    broadcasting = MessageModel.BROADCASTING
    started = [
        start(consumers, client_config, group, topic, r, selector, message_model=broadcasting)
        for r in instances
    ]
    send_all(client_config, topic)
    for consumer, listener in zip(started, instances, strict=True):
        wait_until(lambda c=consumer: c.stats().filtered == len(SENT) - 3)  # type: ignore[misc]
        wait_until(lambda r=listener: len(r.snapshot()) == 3)  # type: ignore[misc]
        assert sorted(listener.snapshot()) == sorted(MATCHING)


def test_the_asyncio_consumer_filters_with_sql92(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(client_config, unique("t"))
    send_all(client_config, topic)

    async def scenario() -> list[str]:
        got: list[str] = []
        done = asyncio.Event()

        async def listener(msg: MessageExt) -> ConsumeStatus:
            got.append(msg.body.decode())
            if len(got) == len(MATCHING):
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = aio.PushConsumer(
            unique("g"),
            config=client_config,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        with pytest.raises(FilterExpressionError, match="offset 4"):
            consumer.subscribe(topic, listener, MessageSelector.by_sql("a = NULL"))
        consumer.subscribe(topic, listener, MessageSelector.by_sql(EXPRESSION))
        async with consumer:
            await asyncio.wait_for(done.wait(), 60)
            while consumer.stats().filtered < len(SENT) - len(MATCHING):
                await asyncio.sleep(0.05)
        return got

    assert sorted(asyncio.run(scenario())) == sorted(MATCHING)


def test_an_invalid_expression_fails_at_subscribe_and_leaves_the_consumer_usable(
    client_config: ClientConfig,
    consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:
    topic = make_topic(client_config, unique("t"), partitions=1)
    consumer = PushConsumer(
        unique("g"),
        config=client_config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    received = Received()
    with pytest.raises(FilterExpressionError) as caught:
        consumer.subscribe(topic, received, MessageSelector.by_sql("amount > 100 region = 'eu'"))
    assert (caught.value.position, caught.value.found) == (13, "region")
    consumer.subscribe(topic, received, MessageSelector.by_sql("amount > 100"))
    consumer.start()
    consumers.append(consumer)
    with Producer("sql92_pg", config=client_config) as producer:
        for amount in ("50", "150"):
            producer.send_sync(Message(topic, amount, properties={"amount": amount}))
    wait_until(lambda: received.snapshot() == ["150"] and consumer.stats().filtered == 1)


def test_a_retry_copy_is_not_filtered_again(
    retry_config: ClientConfig,  # noqa: F811 - the fixture imported above
    coordinator: object,  # noqa: F811
    consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:
    """The retry copy carries RECONSUME_TIME, which this selector refuses: filtered again, it
    would be committed and lost instead of redelivered."""
    topic = make_topic(retry_config, unique("t"), partitions=1)
    seen: list[tuple[str, int]] = []

    def fail_first(msg: MessageExt) -> ConsumeStatus:
        seen.append((msg.body.decode(), msg.reconsume_times))
        if msg.reconsume_times:
            return ConsumeStatus.CONSUME_SUCCESS
        return ConsumeStatus.RECONSUME_LATER

    selector = MessageSelector.by_sql("RECONSUME_TIME IS NULL AND TAGS = 'TagA'")
    consumer = start(consumers, retry_config, unique("g"), topic, fail_first, selector)
    with Producer("sql92_pg", config=retry_config) as producer:
        producer.send_sync(Message(topic, "first", tags="TagA"))
        producer.send_sync(Message(topic, "other", tags="TagB"))
    wait_until(lambda: len(seen) == 2 and consumer.stats().filtered == 1, timeout_s=60)
    assert seen == [("first", 0), ("first", 1)]
    assert consumer.stats().filtered == 1
