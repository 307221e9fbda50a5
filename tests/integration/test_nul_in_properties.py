"""NUL in what a message carries, against a real broker: a property name holding NUL is
refused before anything is written (librdkafka cuts header names at the first NUL, so
``"UNIQ_KEY\\x00"`` would arrive as a second ``UNIQ_KEY``), while NUL in a property value, a key
or the tags travels intact (header values and the record key are length-delimited)."""

from __future__ import annotations

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.errors import InvalidPropertyError

pytestmark = pytest.mark.broker


def test_nul_in_values_keys_and_tags_round_trips_and_a_nul_name_is_refused(
    client_config: ClientConfig, topic: str
) -> None:
    with Producer("nul", config=client_config) as producer:
        for name in ("UNIQ_KEY\x00", "TAGS\x00x", "a\x00b"):
            spoofed = Message(topic, b"spoof", tags="real-tag")
            with pytest.raises(InvalidPropertyError, match="contains NUL"):
                spoofed.put_user_property(name, "spoofed")
            producer.send_sync(spoofed)  # sent without the refused property
        msg = Message(
            topic,
            b"body\x00",
            keys=["k\x00ey", "\x00"],
            tags="t\x00ag",
            properties={"text": "a\x00b\x00", "binary": b"\x00\xff\x00"},
        )
        sent = producer.send_sync(msg)

    received = list(read_messages(client_config, [topic], max_messages=4, timeout_ms=10_000))
    assert len(received) == 4
    for spoof in received[:3]:
        assert (spoof.tags, spoof.user_properties) == ("real-tag", {})
        assert spoof.get_property("UNIQ_KEY") == spoof.msg_id != "spoofed"
    last = received[3]
    assert last.msg_id == sent.msg_id
    assert last.body == b"body\x00"
    assert last.keys == ["k\x00ey", "\x00"]
    assert last.tags == "t\x00ag"
    assert last.user_properties == {"text": "a\x00b\x00", "binary": b"\x00\xff\x00"}
