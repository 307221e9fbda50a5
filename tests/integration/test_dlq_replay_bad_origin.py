"""A dead letter whose origin topic cannot be named in Kafka (its ``RETRY_TOPIC`` header was
written by another Kafka client: ``not a topic!``, ``\\ufffd``) does not stop the replay of the
group's other dead letters: they are written back, the bad ones are named with why and stay in
the DLQ, and ``bridge dlq replay`` exits 1 (``--dry-run`` lists them and exits 1 too).
Against a real broker; the dead letters are written as another client writes them."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from confluent_kafka import Producer as RawProducer

from bridge import read_messages
from bridge.client.records import plain_record
from bridge.config import ClientConfig
from bridge.consumer import admin
from bridge.consumer.admin import DeadLetterReplayError, read_dead_letters, replay_dead_letters
from bridge.kafka.admin import TopicAdmin
from bridge.message import Message, MessageConst
from tests.integration.test_cli_operator_errors import EXIT_ERROR, bridge_cli, error_line
from topics.catalog import TopicSpec
from topics.naming import dlq_topic

pytestmark = pytest.mark.broker

BAD_ORIGINS = {"ID-BAD-SPACE": "not a topic!", "ID-BAD-FFFD": "\ufffd"}


def _dead_letters(config: ClientConfig, unique: Callable[[str], str]) -> tuple[str, str, list[str]]:
    """A group whose DLQ holds, in this order, a good letter, the two bad ones and another
    good one (one partition, so the bad ones come before a good one); its origin topic; the
    good letters' ids."""
    group, origin = unique("g"), unique("t")
    dlq = dlq_topic(group, config.namespace)
    TopicAdmin(config).ensure_topics([TopicSpec(dlq, 1), TopicSpec(origin, 1)])
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    letters = [("ID-GOOD-1", origin), *BAD_ORIGINS.items(), ("ID-GOOD-2", origin)]
    for msg_id, topic in letters:
        letter = Message(f"%DLQ%{group}", msg_id.encode())
        letter.put_system_property(MessageConst.RETRY_TOPIC, topic)
        record = plain_record(letter, dlq, msg_id, 1, b"h")
        raw.produce(dlq, record.value, record.key, headers=list(record.headers))
    assert raw.flush(10) == 0
    return group, origin, ["ID-GOOD-1", "ID-GOOD-2"]


def _replayed_ids(config: ClientConfig, origin: str, expected: int) -> list[str]:
    """The ids on ``origin``: ``expected`` of them, then nothing more for a second."""
    got = [m.msg_id for m in read_messages(config, [origin], max_messages=expected)]
    got += [m.msg_id for m in read_messages(config, [origin], timeout_ms=1000)][expected:]
    return sorted(got)


def test_dlq_replay_writes_the_good_letters_and_names_each_bad_one(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    group, origin, good = _dead_letters(client_config, unique)

    dry = bridge_cli(client_config, "dlq", "replay", "--group", group, "--json", "--dry-run")

    assert dry.returncode == EXIT_ERROR, (dry.stdout, dry.stderr)
    line = error_line(dry)
    assert line.startswith(
        f"Error: DeadLetterReplayError: 2 of 4 dead letters of {group} cannot be replayed"
    ), line
    assert all(msg_id in line for msg_id in BAD_ORIGINS), line
    rows = {row["msg_id"]: row for row in map(json.loads, dry.stdout.splitlines())}
    assert set(rows) == {*good, *BAD_ORIGINS}
    assert not any(row["replayed"] for row in rows.values())
    assert {i for i, row in rows.items() if "error" in row} == set(BAD_ORIGINS)
    assert "InvalidTopicNameError" in rows["ID-BAD-SPACE"]["error"]
    assert list(read_messages(client_config, [origin], timeout_ms=1000)) == []

    done = bridge_cli(client_config, "dlq", "replay", "--group", group)

    assert done.returncode == EXIT_ERROR, (done.stdout, done.stderr)
    line = error_line(done)
    assert line.startswith(
        f"Error: DeadLetterReplayError: 2 of 4 dead letters of {group} not replayed "
        "(they stay in the DLQ): "
    ), line
    assert all(msg_id in line for msg_id in BAD_ORIGINS), line
    out = done.stdout.splitlines()
    for msg_id, topic in BAD_ORIGINS.items():
        assert any(o.startswith(f"{msg_id} -> {topic} NOT replayed: ") for o in out), out
    assert f"ID-GOOD-1 -> {origin}" in out, out
    assert out[-1] == "replayed 2, not replayed 2", out
    assert _replayed_ids(client_config, origin, 2) == good
    assert len(read_dead_letters(client_config, group)) == 4  # nothing left the DLQ


def test_replay_dead_letters_goes_on_past_a_bad_letter_into_later_chunks(
    client_config: ClientConfig, unique: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One letter a chunk: a bad letter's chunk no longer aborts every later chunk."""
    monkeypatch.setattr(admin, "REPLAY_CHUNK", 1)
    group, origin, good = _dead_letters(client_config, unique)

    with pytest.raises(DeadLetterReplayError) as caught:
        replay_dead_letters(client_config, group)

    assert sorted(f.letter.msg_id for f in caught.value.failed) == sorted(BAD_ORIGINS)
    assert all("InvalidTopicNameError" in f.reason for f in caught.value.failed)
    assert sorted(m.msg_id for m in caught.value.replayed) == good
    assert _replayed_ids(client_config, origin, 2) == good


def test_dlq_commands_show_unprintable_ids_and_origins_without_forging_lines(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    """A dead letter keeps the id and origin another client gave its record: a newline there
    forged a line of ``dlq replay``'s output, a terminal escape reached the terminal."""
    group, origin = unique("g"), unique("t")
    dlq = dlq_topic(group, client_config.namespace)
    TopicAdmin(client_config).ensure_topics([TopicSpec(dlq, 1), TopicSpec(origin, 1)])
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    forged_id = "ID-1\nforged -> line"
    letters = [(forged_id, origin), ("ID-2", "\x1b[2Jx\nforged")]
    for msg_id, topic in letters:
        letter = Message(f"%DLQ%{group}", b"body")
        letter.put_system_property(MessageConst.RETRY_TOPIC, topic)
        letter.put_system_property(MessageConst.ORIGIN_KAFKA_TOPIC, "t\nforged")
        record = plain_record(letter, dlq, msg_id, 1, b"h")
        raw.produce(dlq, record.value, record.key, headers=list(record.headers))
    assert raw.flush(10) == 0

    outputs = {
        command[0]: bridge_cli(client_config, "dlq", *command, "--group", group).stdout
        for command in (["replay", "--dry-run"], ["list"], ["status"])
    }
    for command, out in outputs.items():
        assert "\x1b" not in out, (command, out)
        assert not any(line.startswith("forged") for line in out.splitlines()), (command, out)
        if command != "status":
            assert repr(forged_id) in out, (command, out)
    assert outputs["replay"].splitlines()[0] == f"{forged_id!r} -> {origin}"
