"""The operator console on a large dead-letter queue: ``python -m bench console``.

A group's DLQ gets :data:`LETTERS` letters (200-byte bodies), :data:`CHOSEN` of them tagged
``Replay``. ``bridge console --write`` runs as its own process; the run pages through the
whole queue in its largest pages (following each page's "Next page" link, as a person would)
and then replays the tagged letters from a filtered dry run and its confirmation.

* Peak memory (``VmHWM``) of the console process after paging through every letter, beside
  the peak of ``bridge dlq list --json`` on the same queue (the command reads the whole queue
  into one list), and beside the console's own peak after its first page.
* The filtered replay: every one of the :data:`CHOSEN` letters lands on its origin topic
  exactly once (checked by message id; the run fails otherwise), timed beside
  ``bridge dlq replay --tag Replay --dry-run`` (the command's read of the same letters).
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from http.cookiejar import CookieJar

from confluent_kafka import Producer as RawProducer

from bench.harness import Row, print_rows
from bridge import ClientConfig, Message, read_messages
from bridge.client.records import plain_record
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageConst
from topics.catalog import TopicSpec
from topics.naming import dlq_topic

LETTERS = int(os.environ.get("BENCH_CONSOLE_LETTERS", "100000"))
CHOSEN = int(os.environ.get("BENCH_CONSOLE_CHOSEN", "1000"))
TOKEN = "bench-console-token-" + uuid.uuid4().hex
PAGE = 500


def _fill(config: ClientConfig, group: str, origin: str) -> None:
    dlq = dlq_topic(group, config.namespace)
    TopicAdmin(config).ensure_topics([TopicSpec(dlq, 1), TopicSpec(origin, 1)])
    raw = RawProducer(
        {"bootstrap.servers": config.bootstrap_servers, "linger.ms": 20, "compression.type": "lz4"}
    )
    every = LETTERS // CHOSEN
    for i in range(LETTERS):
        tagged = i % every == 0 and i // every < CHOSEN
        letter = Message(
            f"%DLQ%{group}",
            os.urandom(100).hex().encode(),
            keys=f"order-{i}",
            tags="Replay" if tagged else "Keep",
        )
        letter.put_system_property(MessageConst.RETRY_TOPIC, origin)
        letter.put_system_property(MessageConst.CONSUME_EXCEPTION_CLASS, "ValueError")
        letter.put_system_property(MessageConst.CONSUME_EXCEPTION_MESSAGE, f"order {i} refused")
        record = plain_record(letter, dlq, f"ID-{i:07d}", 1, b"h")
        while True:
            try:
                raw.produce(dlq, record.value, record.key, headers=list(record.headers))
                break
            except BufferError:
                raw.poll(0.1)
        raw.poll(0)
    assert raw.flush(60) == 0


def _hidden(page: str, name: str) -> str | None:
    """The value of the hidden form field ``name`` of ``page`` (None when it has none)."""
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    return None if found is None else html.unescape(found.group(1))


def _peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def _command_peak_kib(config: ClientConfig, *args: str) -> tuple[int, float]:
    """Peak memory (KiB) and time (s) of a ``bridge`` command run to its end."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", *args], env=env, stdout=subprocess.DEVNULL
    )
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(OSError, RuntimeError):
            peak = max(peak, _peak_kib(proc.pid))
        time.sleep(0.05)
    return peak, time.monotonic() - started


def run(bootstrap: str) -> None:
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bc{uuid.uuid4().hex[:8]}")
    group, origin = f"g-{uuid.uuid4().hex[:6]}", f"origin-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    _fill(config, group, origin)
    print(f"{LETTERS:,} dead letters written in {time.monotonic() - started:.1f} s")

    env = {**os.environ, "BRIDGE_CONSOLE_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "--namespace", config.namespace, "console",
         "-b", bootstrap, "--port", "0", "--write"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        found = re.search(r"http://[^/ ]+", proc.stdout.readline())
        assert found is not None, "the console did not start"
        base = found.group(0)
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

        def get(url: str) -> str:
            with opener.open(base + url, timeout=600) as response:
                return str(response.read().decode())

        first = get(f"/dlq/{group}?size={PAGE}")
        first_peak = _peak_kib(proc.pid)
        pages, letters, page_started = 1, first.count('name="ref"'), time.monotonic()
        text = first
        peaks = [f"1: {first_peak / 1024:.0f}"]
        while (link := re.search(r'href="([^"]+)" id="next-page"', text)) is not None:
            text = get(html.unescape(link.group(1)))
            pages += 1
            letters += text.count('name="ref"')
            if pages % 25 == 0:
                peaks.append(f"{pages}: {_peak_kib(proc.pid) / 1024:.0f}")
        paging_s = time.monotonic() - page_started
        assert letters == LETTERS, f"paged through {letters} of {LETTERS} letters"
        paged_peak = _peak_kib(proc.pid)
        print(f"paged {letters:,} letters in {pages} pages of {PAGE} in {paging_s:.1f} s")
        print(f"console peak RSS (MiB) after page N: {', '.join(peaks)}")

        csrf = re.search(r'name="csrf_token" value="([^"]+)"', first)
        assert csrf is not None
        form = {"csrf_token": csrf.group(1), "token": TOKEN, "scope": "filtered",
                "target": "origin", "tags": "Replay"}  # fmt: skip

        def post(fields: dict[str, str]) -> str:
            request = urllib.request.Request(
                f"{base}/dlq/{group}/replay",
                data=urllib.parse.urlencode(fields).encode(),
                headers={"Origin": base},
            )
            with opener.open(request, timeout=600) as response:
                return str(response.read().decode())

        dry = post({**form, "mode": "dry-run"})
        assert f"{CHOSEN} would be replayed" in dry, dry[-2000:]
        replay_started = time.monotonic()
        # The replay carries what its dry run issued: the token, and where it read up to.
        confirm = {
            name: value
            for name in ("dry_run_token", "ends")
            if (value := _hidden(dry, name)) is not None
        }
        done = post({**form, **confirm, "mode": "write"})
        replay_s = time.monotonic() - replay_started
        assert f"{CHOSEN} replayed to origin" in done, done[-2000:]
        replay_peak = _peak_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    # Everything the origin topic holds, read to its end and then until 5 s pass without more.
    landed = Counter(m.msg_id for m in read_messages(config, [origin], timeout_ms=5000))
    once = sum(1 for n in landed.values() if n == 1)
    assert len(landed) == CHOSEN and once == CHOSEN, (
        f"{len(landed)} distinct letters landed, {once} of them exactly once"
    )
    print(f"filtered replay: {CHOSEN:,} letters, each landed exactly once")

    list_peak, _ = _command_peak_kib(config, "dlq", "list", "--group", group, "--json")
    dry_peak, dry_s = _command_peak_kib(
        config, "dlq", "replay", "--group", group, "--tag", "Replay", "--dry-run"
    )
    print_rows(
        f"console on a DLQ of {LETTERS:,} letters (ratio = console / baseline)",
        [
            Row("console peak RSS, paged all", "MiB", paged_peak / 1024, list_peak / 1024,
                "bridge dlq list --json peak", higher_is_better=False),
            Row("console peak RSS, paged all", "MiB", paged_peak / 1024, first_peak / 1024,
                "console peak after page 1", higher_is_better=False),
            Row("console peak RSS, after replay", "MiB", replay_peak / 1024, dry_peak / 1024,
                "dlq replay --dry-run peak", higher_is_better=False),
            Row(f"filtered replay of {CHOSEN:,}", "ms", replay_s * 1000, dry_s * 1000,
                "dlq replay --dry-run (read only)", higher_is_better=False),
        ],
    )  # fmt: skip
