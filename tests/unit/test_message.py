"""Message model, properties, keys and message ids."""

from __future__ import annotations

import re
import threading
from typing import get_args

import pytest

from bridge.errors import InvalidMessageError, InvalidPropertyError
from bridge.message import (
    RESERVED_PROPERTIES,
    SYSTEM_PROPERTIES,
    Message,
    MessageConst,
    MessageIdGenerator,
    SystemPropertyName,
    copied_message,
)

ID_FORMAT = re.compile(r"^[0-9A-F]{32}$")


def test_message_keeps_keys_tags_and_properties() -> None:
    msg = Message("orders", "héllo", keys="k1 k2", tags="TagA", properties={"region": "eu"})
    assert msg.body == "héllo".encode()
    assert msg.keys == ["k1", "k2"]
    assert msg.kafka_key() == b"k1 k2"
    assert msg.wire_properties() == {"region": "eu", "KEYS": "k1 k2", "TAGS": "TagA"}
    assert msg.user_properties == {"region": "eu"}


def test_sharding_key_wins_as_kafka_key() -> None:
    msg = Message("orders", b"x", keys=["k1"], sharding_key="customer-7")
    assert msg.kafka_key() == b"customer-7"
    assert Message("orders", b"x").kafka_key() is None


def test_rocketmq_style_setters() -> None:
    msg = Message("orders")
    msg.set_keys("a")
    msg.set_tags("T")
    msg.set_body(b"b")
    msg.set_property("p", "v")
    assert (msg.keys, msg.tags, msg.body, msg.get_property("p")) == (["a"], "T", b"b", "v")


def test_messages_without_keys_share_none_of_their_keys() -> None:
    first, second = Message("orders", b"a"), Message("orders", b"b")
    first.keys.append("leaked")  # a copy
    first.set_keys("k1")
    assert (first.keys, second.keys) == (["k1"], [])
    assert second.kafka_key() is None
    assert Message("orders", b"c") == Message("orders", b"c", keys=[])


@pytest.mark.parametrize("name", sorted(RESERVED_PROPERTIES))
def test_reserved_property_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidPropertyError, match="used by the system"):
        Message("orders", b"x", properties={name: "v"})


def test_property_values_must_be_strings_or_bytes() -> None:
    with pytest.raises(InvalidPropertyError, match="string value or bytes, got int"):
        Message("orders", b"x", properties={"n": 1})  # type: ignore[dict-item]
    # A system name users may set holds a number: text only.
    with pytest.raises(InvalidPropertyError, match="string value, got bytes"):
        Message("orders", b"x", properties={MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: b"5"})


def test_the_system_property_name_type_lists_every_message_const_name() -> None:
    assert set(get_args(SystemPropertyName)) == SYSTEM_PROPERTIES


def test_body_must_be_bytes_or_str() -> None:
    with pytest.raises(InvalidMessageError, match="bytes or str"):
        Message("orders", 42)  # type: ignore[arg-type]


def test_keys_must_not_contain_spaces_when_given_as_a_list() -> None:
    with pytest.raises(InvalidMessageError, match="without spaces"):
        Message("orders", b"x", keys=["a b"])


def test_delay_level_zero_or_negative_means_none() -> None:
    msg = Message("orders", b"x", delay_time_level=3)
    assert msg.get_property(MessageConst.DELAY_TIME_LEVEL) == "3"
    msg.set_delay_time_level(0)
    assert msg.delay_time_level == 0
    assert MessageConst.DELAY_TIME_LEVEL not in msg.properties
    msg.set_delay_time_level(-2)
    assert msg.delay_time_level == 0


def test_message_ids_are_unique_across_threads_and_well_formed() -> None:
    gen = MessageIdGenerator()
    ids: list[list[str]] = [[] for _ in range(4)]

    def work(slot: list[str]) -> None:
        slot.extend(gen.next_id() for _ in range(25_000))

    threads = [threading.Thread(target=work, args=(s,), name=f"ids-{i}") for i, s in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for slot in ids for i in slot]
    assert len(set(flat)) == len(flat) == 100_000
    assert all(ID_FORMAT.match(i) for i in flat[:1000])


def test_two_generators_do_not_collide_at_the_same_millisecond() -> None:
    a, b = MessageIdGenerator(), MessageIdGenerator()
    now = 1_700_000_000_000
    ids_a = {a.next_id(now) for _ in range(1000)}
    ids_b = {b.next_id(now) for _ in range(1000)}
    assert len(ids_a) == len(ids_b) == 1000
    assert not ids_a & ids_b


def test_message_id_time_part_rolls_with_the_month() -> None:
    gen = MessageIdGenerator()
    # 2024-01-31T23:59:59.999Z and 2024-02-01T00:00:00.000Z
    end_of_jan = gen.next_id(1_706_745_599_999)
    start_of_feb = gen.next_id(1_706_745_600_000)
    assert end_of_jan[20:28] == f"{31 * 86_400_000 - 1:08X}"
    assert start_of_feb[20:28] == "00000000"


def test_a_copy_keeps_body_keys_tags_and_properties_but_the_dropped() -> None:
    msg = Message("orders", b"x", keys="k1 k2", tags="TagA")
    msg.put_system_property("region", "eu")
    msg.put_system_property("bin", b"\xfe")
    msg.put_system_property("drop-me", "y")
    msg._properties["buf"] = bytearray(b"\x01")  # type: ignore[assignment]
    copy = copied_message(msg, "%RETRY%g", frozenset({"drop-me"}))
    assert (copy.topic, copy.body, copy.keys, copy.tags) == ("%RETRY%g", b"x", ["k1", "k2"], "TagA")
    assert copy.properties == {"region": "eu", "bin": b"\xfe", "buf": b"\x01"}
    assert type(copy.properties["buf"]) is bytes
    copy.keys = "k3"  # the shared key list is replaced, never changed in place
    assert msg.keys == ["k1", "k2"]
