"""The command line for scripts, run as a script runs it (a subprocess) against a real broker:
``--json`` output of every read command parsed line by line, exit statuses for an unreachable
broker and for what does not exist, ``--version`` and JSON logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    Producer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
)
from bridge.consumer import ConsumeFromWhere, ConsumeStatus, PushConsumer
from bridge.kafka.admin import TopicAdmin
from bridge.runtime.local_kafka import free_port
from tests.conftest import wait_until
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker

EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def json_lines(*args: str) -> list[dict[str, Any]]:
    """Run a command with ``--json``: exit 0, and every stdout line one JSON object."""
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert all(isinstance(r, dict) for r in rows), proc.stdout
    return rows


class Unknown(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.UNKNOWN


def test_every_read_command_prints_json_lines(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    ns = ["--namespace", client_config.namespace]
    b = ["-b", client_config.bootstrap_servers]
    topic = unique("t")
    group = unique("g")
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 1)])
    with Producer(unique("pg"), config=client_config) as producer:
        sent = producer.send_sync(
            Message(topic, "hello", keys="k1", tags="TagA", properties={"bin": b"\xff\x00"})
        )
        producer.send_sync(Message(topic, "later", delay_time_level=18))  # waits 2 h
    with TransactionMQProducer(unique("tx"), Unknown(), config=client_config) as tx:
        undecided = tx.send_message_in_transaction(Message(topic, "in doubt"), None)
    consumer = PushConsumer(
        group,
        config=client_config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        max_reconsume_times=0,  # the first failure is a dead letter
    )
    consumer.subscribe(topic, lambda m: ConsumeStatus.RECONSUME_LATER)
    consumer.start()
    try:
        wait_until(lambda: consumer.stats().dead_lettered >= 1, timeout_s=60)
    finally:
        consumer.shutdown()

    topics = {r["kafka_topic"]: r for r in json_lines(*ns, "topics", "list", *b)}
    assert topics[topic]["partitions"] == 1 and topics[topic]["kind"] == "real"
    assert any(r["rocketmq_name"] == f"%DLQ%{group}" for r in topics.values())
    [mapped] = json_lines(*ns, "topics", "map", f"%DLQ%{group}")
    assert mapped["rocketmq_name"] == f"%DLQ%{group}"

    [msg] = json_lines(*ns, "consume", *b, topic, "--count", "1", "--timeout-ms", "10000")
    assert (msg["msg_id"], msg["body"], msg["keys"], msg["tags"]) == (
        sent.msg_id,
        "hello",
        ["k1"],
        "TagA",
    )
    assert msg["binary_properties"] == {"bin": "/wA="}

    rows = json_lines(*ns, "transactions", "list", *b)
    assert [r["transaction_id"] for r in rows] == [undecided.transaction_id]
    # Its next check as the checker schedules it (no coordinator runs here: never asked).
    assert rows[0]["next_check_ms"] > 0 and rows[0]["last_check_request_ms"] is None
    [shown] = json_lines(*ns, "transactions", "show", *b, undecided.transaction_id)
    assert shown["state"] == "undecided" and shown["real_topic"] == topic
    assert shown["next_check_ms"] == rows[0]["next_check_ms"]
    assert json_lines(*ns, "transactions", "parked", *b) == []

    levels = json_lines(*ns, "delays", "status", *b)
    [waiting] = [q for q in levels if q["pending"]]
    assert (waiting["kind"], waiting["index"], waiting["pending"]) == ("level", 18, 1)

    [status] = json_lines(*ns, "dlq", "status", *b, "--group", group)
    assert status["count"] >= 1 and status["origin_topics"] == {topic: status["count"]}
    letters = json_lines(*ns, "dlq", "list", *b, "--group", group)
    assert {r["message"]["body"] for r in letters} <= {"hello", "later", "in doubt"}
    assert letters[0]["failure"]["CONSUME_FAILURE"] == "RECONSUME_LATER"
    assert letters[0]["failure"]["CONSUMER_GROUP"] == group
    text = run(*ns, "dlq", "list", *b, "--group", group)
    assert text.returncode == 0, text.stderr
    assert f"first-read={topic}[0]@0 " in text.stdout, text.stdout
    assert "failed-with='RECONSUME_LATER'" in text.stdout, text.stdout
    replay = json_lines(*ns, "dlq", "replay", *b, "--group", group, "--dry-run")
    assert [r["msg_id"] for r in replay] == [r["msg_id"] for r in letters]
    assert json_lines(*ns, "quarantine", *b) == []

    # What does not exist: exit status 4 and one error line.
    for args in (
        ["transactions", "show", *b, "0" * 32],
        ["dlq", "list", *b, "--group", unique("nobody")],
        ["dlq", "status", *b, "--group", unique("nobody")],
    ):
        proc = run(*ns, *args, "--json")
        assert proc.returncode == EXIT_NOT_FOUND, (args, proc.stdout, proc.stderr)
        assert proc.stdout == "" and proc.stderr.startswith("Error: "), proc.stderr


def test_consume_of_a_topic_that_does_not_exist_exits_4_naming_it(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    ns = ["--namespace", client_config.namespace]
    b = ["-b", client_config.bootstrap_servers]
    there, absent = unique("there"), unique("absent")
    TopicAdmin(client_config).ensure_topics([TopicSpec(there, 1)])
    for args in (["consume", *b, absent], ["consume", *b, there, absent, "%DLQ%nobody"]):
        proc = run(*ns, *args, "--timeout-ms", "1000")
        assert proc.returncode == EXIT_NOT_FOUND, (args, proc.stdout, proc.stderr)
        assert proc.stdout == "" and proc.stderr.startswith("Error: "), proc.stderr
        assert absent in proc.stderr and there not in proc.stderr, proc.stderr
    assert "%DLQ%nobody (Kafka topic " in proc.stderr, proc.stderr
    assert json_lines(*ns, "consume", *b, there, "--timeout-ms", "500") == []


def test_delays_status_before_anything_was_delayed_shows_none_waiting(
    client_config: ClientConfig,
) -> None:
    ns = ["--namespace", client_config.namespace]  # its own: no SCHEDULE nor timer topic yet
    queues = json_lines(*ns, "delays", "status", "-b", client_config.bootstrap_servers)
    policy = client_config.delay_policy
    assert [(q["kind"], q["index"]) for q in queues] == [
        ("level", level) for level in range(1, policy.level_count + 1)
    ] + [("tier", tier) for tier in range(policy.tier_count)]
    assert {(q["pending"], q["next_due_ms"]) for q in queues} == {(0, None)}
    text = run(*ns, "delays", "status", "-b", client_config.bootstrap_servers)
    assert text.returncode == 0 and text.stdout.rstrip().endswith("0 waiting"), text


def test_delays_status_with_only_the_schedule_topic_shows_the_timer_tiers_empty(
    client_config: ClientConfig,
) -> None:
    """A namespace where delay levels were used but never a timer: the SCHEDULE topic exists,
    the timer topic does not."""
    catalog = TopicCatalog(namespace=client_config.namespace)
    TopicAdmin(client_config).ensure_topics([catalog.spec(SystemTopic.SCHEDULE)])
    ns = ["--namespace", client_config.namespace]
    queues = json_lines(*ns, "delays", "status", "-b", client_config.bootstrap_servers)
    tiers = [q for q in queues if q["kind"] == "tier"]
    assert len(tiers) == client_config.delay_policy.tier_count
    assert {(q["pending"], q["next_due_ms"]) for q in queues} == {(0, None)}


READ_COMMANDS = [
    ["topics", "list"],
    ["consume", "orders"],
    ["transactions", "list"],
    ["transactions", "show", "X"],
    ["transactions", "parked"],
    ["delays", "status"],
    ["dlq", "status"],
    ["dlq", "list", "--group", "g"],
    ["dlq", "replay", "--group", "g", "--dry-run"],
    ["quarantine"],
]


def test_an_unreachable_broker_fails_every_read_command_within_the_request_timeout() -> None:
    timeout_ms = 1500
    env = {
        **{k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"},
        "BRIDGE_REQUEST_TIMEOUT_MS": str(timeout_ms),
    }

    def startup() -> float:
        """The interpreter and imports, two at once as below, on this machine now (s)."""

        def once(_: int) -> float:
            began = time.monotonic()
            assert run("--version", env=env).returncode == 0
            return time.monotonic() - began

        with ThreadPoolExecutor(max_workers=2) as pool:
            return max(pool.map(once, range(2)))

    before = startup()
    address = f"127.0.0.1:{free_port()}"

    def attempt(args: list[str]) -> tuple[list[str], subprocess.CompletedProcess[str], float]:
        began = time.monotonic()
        proc = run(*args, "-b", address, "--json", env=env, timeout=60)
        return args, proc, time.monotonic() - began

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(attempt, READ_COMMANDS))
    # Start-up measured before and after the commands: a loaded machine slows it meanwhile.
    startup_s = max(before, startup())
    for args, proc, elapsed in results:
        assert proc.returncode == EXIT_UNREACHABLE, (args, proc.stdout, proc.stderr)
        assert proc.stdout == "", (args, proc.stdout)
        assert proc.stderr.startswith("Error: BrokerUnreachableError"), (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        # The request timeout, plus start-up (two at once on a shared machine: some slack).
        assert elapsed < timeout_ms / 1000 + 2 * startup_s + 3.0, (args, elapsed, startup_s)


def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("bridge, version "), proc.stdout


def test_json_logs(client_config: ClientConfig, topic: str) -> None:
    env = {**os.environ, "BRIDGE_LOG_FORMAT": "json"}
    b = ["-b", client_config.bootstrap_servers]
    for args in (
        ["-v", "send", *b, topic, "x"],
        ["--log-format", "json", "-v", "send", *b, topic, "y"],
    ):
        proc = run(
            "--namespace", client_config.namespace, *args, env=env if args[0] == "-v" else None
        )
        assert proc.returncode == 0, proc.stderr
        logs = proc.stderr.splitlines()
        assert any("producer" in json.loads(line)["message"] for line in logs), proc.stderr
        for line in logs:
            record = json.loads(line)
            assert {"ts", "level", "logger", "message", "thread"} <= set(record), record
