"""The command line, run as a user runs it (a subprocess), against real brokers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer as RawProducer

from bridge import read_messages
from bridge.cli.admin.delays import delay_status
from bridge.config import ClientConfig
from bridge.runtime.local_kafka import free_port
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def env_without_bootstrap() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}


@pytest.mark.slow
def test_up_starts_a_local_broker_and_shows_a_message_round_trip(tmp_path: Path) -> None:
    out = run_cli(
        "up",
        "--once",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "b"),
        env=env_without_bootstrap(),
    )
    sent = re.search(r"^sent\s+([0-9A-F]{32}) to bridge-self-check", out, re.M)
    assert sent, out
    assert re.search(rf"^received {sent.group(1)}: 'hello from the bridge'", out, re.M), out
    assert "coordinator" in out


@pytest.mark.slow
def test_up_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bridge.cli",
            "up",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "b"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env_without_bootstrap(),
    )
    lines: list[str] = []
    assert proc.stdout is not None

    def ready() -> bool:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        lines.append(line)
        return "press Ctrl-C to stop" in line or proc.poll() is not None

    wait_until(ready, timeout_s=120, interval_s=0)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + out
    assert "stopped" in out
    state = (tmp_path / "b" / "broker.json").read_text()
    pid_match = re.search(r'"pid": (\d+)', state)
    assert pid_match, state
    status = Path(f"/proc/{pid_match.group(1)}/status")
    # The broker process is gone (or a zombie of an exited child).
    assert not status.exists() or "zombie" in status.read_text().lower()


def test_send_consume_and_topics_commands(client_config: ClientConfig, topic: str) -> None:
    common = ["--namespace", client_config.namespace]
    b = ["-b", client_config.bootstrap_servers]
    out = run_cli(
        *common, "send", *b, topic, "hi there", "--tags", "TagA", "-p", "k=v", "--count", "2"
    )
    assert len(re.findall(r"^SEND_OK [0-9A-F]{32} ", out, re.M)) == 2
    out = run_cli(*common, "consume", *b, topic, "--count", "2")
    assert out.count("tags=TagA") == 2 and "props={'k': 'v'}" in out and "b'hi there'" in out
    out = run_cli(*common, "topics", "create", *b, "--system", "--group", "my_group")
    assert f"created {client_config.namespace}.RMQ_SYS_TRANS_HALF_TOPIC" in out
    assert f"created {client_config.namespace}.RETRY.my__group" in out
    out = run_cli(*common, "topics", "list", *b)
    assert "%DLQ%my_group" in out and topic in out


def test_bad_cli_input_is_a_clear_error(client_config: ClientConfig) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge.cli",
            "send",
            "-b",
            client_config.bootstrap_servers,
            "bad topic",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "invalid name 'bad topic'" in proc.stderr


def run_cli_failing(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a command that must fail: a non-zero exit and one ``Error: ...`` line, no
    traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith("Error: "), proc.stderr
    return proc


def test_topics_map_refuses_a_name_without_a_kafka_name() -> None:
    too_long = "%DLQ%" + "." * 100  # each '.' escapes to 3 characters: past Kafka's 249
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "topics", "map", "orders", too_long, "rmq.DLQ.a_2Eb"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "orders -> orders" in proc.stdout
    assert "rmq.DLQ.a_2Eb <- %DLQ%a.b" in proc.stdout  # the other names are still mapped
    assert f"{too_long} ->" not in proc.stdout and f"{too_long} <-" not in proc.stdout
    assert "more than Kafka's 249" in proc.stderr, proc.stderr


def test_an_unknown_kafka_property_is_one_clear_error_line(
    client_config: ClientConfig, topic: str
) -> None:
    env = {**os.environ, "BRIDGE_KAFKA_NO_SUCH_PROPERTY": "1"}
    proc = run_cli_failing("consume", "-b", client_config.bootstrap_servers, topic, env=env)
    assert "'no.such.property' (BRIDGE_KAFKA_NO_SUCH_PROPERTY)" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_consume_from_an_unreachable_broker_fails() -> None:
    env = {**env_without_bootstrap(), "BRIDGE_REQUEST_TIMEOUT_MS": "2000"}
    proc = run_cli_failing(
        "consume", "-b", f"127.0.0.1:{free_port()}", "orders", "--timeout-ms", "2000", env=env
    )
    assert "BrokerUnreachableError" in proc.stderr, proc.stderr
    assert proc.returncode == 3, "the documented status of an unreachable broker"


def test_send_to_an_unreachable_broker_exits_3_as_every_command_does() -> None:
    env = {**env_without_bootstrap(), "BRIDGE_REQUEST_TIMEOUT_MS": "2000"}
    proc = run_cli_failing("send", "-b", f"127.0.0.1:{free_port()}", "orders", "x", env=env)
    assert proc.stderr.startswith("Error: BrokerUnreachableError"), proc.stderr
    assert proc.returncode == 3, "the documented status of an unreachable broker"


def test_send_takes_any_bytes_from_a_file_or_stdin_and_delays_or_times_a_message(
    client_config: ClientConfig, topic: str, tmp_path: Path
) -> None:
    ns = ["--namespace", client_config.namespace]
    b = ["-b", client_config.bootstrap_servers]
    run_cli(*ns, "topics", "create", *b, "--system")
    from_file = bytes(range(256))  # not UTF-8
    (tmp_path / "body.bin").write_bytes(from_file)
    run_cli(*ns, "send", *b, topic, "--file", str(tmp_path / "body.bin"))
    piped = subprocess.run(
        [sys.executable, "-m", "bridge.cli", *ns, "send", *b, topic, "-f", "-"],
        input=b"\xff\xfe from stdin\x00",
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr

    got = [m.body for m in read_messages(client_config, [topic], max_messages=2)]
    assert sorted(got) == sorted([from_file, b"\xff\xfe from stdin\x00"])

    run_cli(*ns, "send", *b, topic, "level 3", "--delay-level", "3")
    run_cli(*ns, "send", *b, topic, "in 10 min", "--delay-ms", "600000")
    at = int(time.time() * 1000) + 3_600_000
    run_cli(*ns, "send", *b, topic, "in an hour", "--deliver-at-ms", str(at))
    waiting = {(q.kind, q.index): q.pending for q in delay_status(client_config) if q.pending}
    assert waiting.pop(("level", 3)) == 1, waiting
    assert {kind for kind, _ in waiting} == {"tier"} and sum(waiting.values()) == 2, waiting
    assert [m.body for m in read_messages(client_config, [topic], timeout_ms=1)] == got


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["x", "--file", "-"], "give the body as BODY or with --file"),
        ([], "give the body as BODY or with --file"),
        (["x", "--delay-level", "1", "--delay-ms", "5"], "choose one way to delay"),
        (["x", "--file", "/no/such/file"], "/no/such/file"),
    ],
)
def test_a_send_without_one_body_or_with_two_delays_is_bad_usage(
    client_config: ClientConfig, topic: str, args: list[str], says: str
) -> None:
    proc = run_cli_usage_error("send", "-b", client_config.bootstrap_servers, topic, *args)
    assert says in proc.stderr, proc.stderr


def test_a_coordinator_with_a_protected_kafka_property_fails_fast(
    client_config: ClientConfig,
) -> None:
    env = {
        **os.environ,
        "BRIDGE_NAMESPACE": client_config.namespace,
        "BRIDGE_KAFKA_AUTO_OFFSET_RESET": "latest",
    }
    proc = run_cli_failing(
        "up", "--once", "--no-self-check", "-b", client_config.bootstrap_servers, env=env
    )
    assert "BRIDGE_KAFKA_AUTO_OFFSET_RESET" in proc.stderr, proc.stderr
    assert "consume_from_where" in proc.stderr, proc.stderr


def run_cli_usage_error(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a command with a bad option value: exit status 2 (bad usage), its last line on
    stderr ``Error: ...``, nothing on stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    assert proc.stdout == "", proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: "), proc.stderr
    return proc


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (["send", "{topic}", "hi"], "--count", "0"),
        (["send", "{topic}", "hi"], "--count", "-1"),
        (["consume", "{topic}"], "--count", "0"),
        (["consume", "{topic}", "--count", "1"], "--timeout-ms", "-5"),
        (["consume", "{topic}", "--count", "1"], "--timeout-ms", "0"),
    ],
)
def test_a_count_or_timeout_below_one_is_bad_usage(
    client_config: ClientConfig, topic: str, command: list[str], option: str, value: str
) -> None:
    """Not a command that does nothing and exits 0 (nothing sent, nothing read)."""
    ns = ["--namespace", client_config.namespace]
    b = ["-b", client_config.bootstrap_servers]
    run_cli(*ns, "send", *b, topic, "already there")
    args = [part.format(topic=topic) for part in command]
    proc = run_cli_usage_error(*ns, *args, *b, option, value)
    assert f"Invalid value for '{option}': {value} is not in the range x>=1" in proc.stderr
    (only,) = read_messages(client_config, [topic], timeout_ms=2000)
    assert only.body == b"already there", "a refused send sent nothing"


def test_consume_shows_what_another_client_wrote_without_markup_or_forged_lines(
    client_config: ClientConfig, topic: str
) -> None:
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    raw.produce(topic, b"before")
    # Rich markup (a closing tag without an opening one), a newline and a terminal escape.
    tags = b"[bold]x\x1b[2J\nforged line"
    raw.produce(topic, b"[/oops]", headers=[("TAGS", tags), ("UNIQ_KEY", b"id\nforged")])
    raw.produce(topic, b"after")
    assert raw.flush(10) == 0
    b = ["-b", client_config.bootstrap_servers]
    out = run_cli("--namespace", client_config.namespace, "consume", *b, topic, "--count", "3")
    lines = out.splitlines()
    assert len(lines) == 3, out
    assert "b'before'" in lines[0] and "b'after'" in lines[2]
    assert "tags='[bold]x\\x1b[2J\\nforged line'" in lines[1], lines[1]
    assert "'id\\nforged'" in lines[1] and "body=b'[/oops]'" in lines[1], lines[1]
    assert "\x1b" not in out
