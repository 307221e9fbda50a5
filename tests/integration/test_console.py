"""The operator console as a person uses it: ``bridge console --write`` runs as its own
process against the shared broker, beside a coordinator, and Debian's Chromium (driven by
Playwright, never a browser it downloads) clicks through its pages.

One console, one coordinator and one browser for the module (its tests run on one worker);
each test has its own topics and groups. Set ``BRIDGE_CONSOLE_SCREENSHOTS`` to a folder to
keep a screenshot of each page (docs/_static/console/ holds the documentation's)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer
from playwright import sync_api as playwright_api

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    Producer,
    TransactionMQProducer,
    read_messages,
)
from bridge.cli.admin.transactions import read_parked
from bridge.client.records import plain_record
from bridge.consumer import (
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeStatus,
    MessageListenerConcurrently,
    PushConsumer,
)
from bridge.consumer.admin import read_dead_letters
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageConst
from tests.conftest import REPO_ROOT, wait_until
from tests.integration.test_cli_json import Unknown
from topics.catalog import TopicSpec
from topics.naming import dlq_topic

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("console-browser")]


TOKEN = "console-test-token-" + uuid.uuid4().hex
CHROMIUM_ENV = "BRIDGE_CHROMIUM"
"""The Chromium executable the tests drive (default: Debian's /usr/bin/chromium)."""
CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _shot(page: Any, name: str) -> None:
    folder = os.environ.get("BRIDGE_CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture(scope="module")
def coordinator(config: ClientConfig) -> Iterator[Coordinator]:
    settings = CoordinatorConfig(
        client=config,
        coordinator_id=f"console-{uuid.uuid4().hex[:6]}",
        transaction_partitions=1,
        transaction_timeout_ms=1000,
        check_interval_ms=1000,
        transaction_check_max=1,
        session_timeout_ms=6000,
    )
    with Coordinator(settings) as running:
        yield running


@dataclass
class Console:
    url: str
    log: list[str]
    """What the console wrote on stderr so far (its log), line by line."""


@pytest.fixture(scope="module")
def console(config: ClientConfig, coordinator: Coordinator) -> Iterator[Console]:
    """``bridge console --write`` on a free loopback port."""
    env = {
        **os.environ,
        "BRIDGE_CONSOLE_TOKEN": TOKEN,
        "PYTHONUNBUFFERED": "1",
        # The transactions page works the next check out with the coordinator's settings.
        "BRIDGE_TRANSACTION_TIMEOUT_MS": "1000",
        "BRIDGE_CHECK_INTERVAL_MS": "1000",
        "BRIDGE_TRANSACTION_CHECK_MAX": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "--namespace", config.namespace, "console",
         "-b", config.bootstrap_servers, "--port", "0", "--write", "--deserializer", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", first)
    if found is None:
        proc.kill()
        pytest.fail(f"the console did not start: {first!r} {proc.stderr.read()}")
    log: list[str] = []
    drain = threading.Thread(target=lambda: log.extend(proc.stderr or ()), daemon=True)
    drain.start()
    try:
        yield Console(found.group(0).rstrip("/"), log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        drain.join(timeout=5)


@pytest.fixture()
def console_url(console: Console) -> str:
    return console.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium in a fresh profile, headless."""
    executable = os.environ.get(CHROMIUM_ENV, "/usr/bin/chromium")
    if shutil.which(executable) is None:
        pytest.fail(
            f"no Chromium at {executable} (apt-get install chromium, or set {CHROMIUM_ENV})"
        )
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    tab = browser.new_page()
    tab.set_default_timeout(60_000)
    try:
        yield tab
    finally:
        tab.close()


def _enter_token(page: Any, token: str = TOKEN) -> None:
    page.fill("#operator-token", token)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class FailsFirst(MessageListenerConcurrently):
    """Raises on a message's first delivery, takes it after."""

    def __init__(self) -> None:
        self.deliveries: list[MessageExt] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        with self.lock:
            self.deliveries.extend(msgs)
            first = len(self.deliveries) == 1
        if first:
            raise ValueError("order 42 has no customer")
        return ConsumeStatus.CONSUME_SUCCESS


def test_a_failed_message_shows_with_its_reason_and_is_replayed_from_the_page_once(
    config: ClientConfig, console_url: str, page: Any
) -> None:
    topic, group = _name("orders"), _name("billing")
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    listener = FailsFirst()
    consumer = PushConsumer(
        group,
        config=config,
        max_reconsume_times=0,  # the first failure dead-letters it
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        persist_consumer_offset_interval_ms=200,
    )
    consumer.subscribe(topic, listener, "*")
    consumer.start()
    try:
        with Producer("console-test", config=config) as producer:
            sent = producer.send_sync(Message(topic, b"order 42", keys="order-42", tags="Paid"))
        wait_until(lambda: consumer.stats().dead_lettered == 1, timeout_s=60)

        page.goto(f"{console_url}/dlq")
        page.click(f"text={group}")
        row = page.locator(f"#letters tr[data-msg-id='{sent.msg_id}']")
        assert "ValueError" in row.inner_text()
        assert "order 42 has no customer" in row.inner_text()
        assert "order-42" in row.inner_text()
        _shot(page, "dlq")
        page.click(f"#letters tr[data-msg-id='{sent.msg_id}'] a")
        assert page.inner_text("#body") == "order 42"
        # Beside the text, the body through the console's deserializer (JSON): not JSON.
        assert "json cannot read this body: JSONDecodeError" in page.inner_text("#decode-error")
        _shot(page, "dlq-letter")
        page.go_back()

        exported = page.request.get(console_url + (page.get_attribute("#export", "href") or ""))
        (line,) = [json.loads(x) for x in exported.text().splitlines()]
        assert line["msg_id"] == sent.msg_id and line["message"]["body"] == "order 42"
        assert line["failure"]["CONSUME_EXCEPTION_CLASS"] == "ValueError"

        _enter_token(page)
        row.locator("input[name=ref]").check()
        page.click("#replay-selected")
        assert "1 would be replayed to origin" in page.inner_text("#summary")
        _shot(page, "dlq-dry-run")
        assert len(listener.deliveries) == 1  # the dry run wrote nothing
        page.click("#confirm-replay")
        assert "1 replayed to origin" in page.inner_text("#summary")

        wait_until(lambda: len(listener.deliveries) == 2, timeout_s=60)
        # Exactly once: the topic holds the original and one replayed copy, both that id.
        on_topic = list(read_messages(config, [topic], timeout_ms=3000))
        assert [m.msg_id for m in on_topic] == [sent.msg_id, sent.msg_id]
        assert on_topic[1].body == b"order 42"
        assert len(listener.deliveries) == 2
    finally:
        consumer.shutdown()


def test_the_next_check_is_the_checker_s_own_schedule(
    config: ClientConfig, console_url: str, page: Any
) -> None:
    """A half message immune from checks for an hour (its own CHECK_IMMUNITY_TIME_IN_SECONDS)
    shows its first check an hour after its birth, as the checker schedules it, though the
    coordinator's timeout and interval are a second (and it puts the message back each one).
    It stays undecided for the module's later tests (the Transactions screenshot shows it)."""
    topic = _name("immune")
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    message = Message(topic, b"wait an hour", keys="immune-1")
    message.put_user_property(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS, "3600")
    with TransactionMQProducer("console-immune", Unknown(), config=config) as producer:
        sent = producer.send_message_in_transaction(message)
        tid = sent.transaction_id or sent.msg_id
        page.goto(f"{console_url}/transactions")
        cell = page.locator(f"#undecided tr[data-transaction-id='{tid}'] td.next-check")
        found = re.fullmatch(r"in (\d+\.\d) s", cell.inner_text().strip())
        assert found is not None, cell.inner_text()
        assert 3500 < float(found.group(1)) <= 3600


def test_a_parked_transaction_is_replayed_from_the_page(
    config: ClientConfig, console_url: str, page: Any
) -> None:
    topic = _name("payments")
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    with TransactionMQProducer("console-tx", Unknown(), config=config) as producer:
        sent = producer.send_message_in_transaction(Message(topic, b"pay 7", keys="pay-7"))

        def parked() -> bool:
            return sent.msg_id in [m.msg_id for m in read_parked(config, timeout_ms=2000)]

        wait_until(parked, timeout_s=90)
    page.goto(f"{console_url}/transactions")
    row = page.locator(f"#parked tr[data-msg-id='{sent.msg_id}']")
    assert "console-tx" in row.inner_text() and topic in row.inner_text()
    _shot(page, "transactions")
    _enter_token(page)
    row.locator("input[name=msg_id]").check()
    page.click("#replay-parked")
    assert "replayed" in page.inner_text("#results tr.ok")

    (delivered,) = read_messages(config, [topic], timeout_ms=3000)
    assert (delivered.msg_id, delivered.body) == (sent.msg_id, b"pay 7")
    assert sent.msg_id not in [m.msg_id for m in read_parked(config)]


def _letter(config: ClientConfig, *bodies: bytes) -> tuple[str, str]:
    """A group with one dead letter from ``origin`` (written as the consumer writes it) for
    each of ``bodies`` (one, ``refused body``, when none are given), at offsets 0, 1, ...;
    the group and the origin topic."""
    group, origin = _name("g"), _name("t")
    dlq = dlq_topic(group, config.namespace)
    TopicAdmin(config).ensure_topics([TopicSpec(dlq, 1), TopicSpec(origin, 1)])
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    for i, body in enumerate(bodies or (b"refused body",)):
        letter = Message(f"%DLQ%{group}", body, keys=f"k-{i + 1}")
        letter.put_system_property(MessageConst.RETRY_TOPIC, origin)
        record = plain_record(letter, dlq, f"ID-REFUSED-{i}", 1, b"h")
        raw.produce(dlq, record.value, record.key, headers=list(record.headers))
    assert raw.flush(10) == 0
    return group, origin


def test_a_body_is_shown_through_the_console_s_deserializer_or_why_it_cannot_be(
    config: ClientConfig, console_url: str, page: Any
) -> None:
    """``--deserializer json``: a JSON body shows decoded beside its text; bytes that are not
    UTF-8 show the reason, in a page that answers 200 (not a server error)."""
    group, _ = _letter(config, b'{"order": 42, "items": ["tea"]}', b"\xff\xfe order")
    response = page.goto(f"{console_url}/dlq/{group}/letter/0/0")
    assert response is not None and response.status == 200
    assert page.inner_text("#decoded-heading").startswith("Body through json")
    assert json.loads(page.inner_text("#decoded")) == {"order": 42, "items": ["tea"]}
    _shot(page, "dlq-letter-decoded")
    response = page.goto(f"{console_url}/dlq/{group}/letter/0/1")
    assert response is not None and response.status == 200
    assert "json cannot read this body: not UTF-8 (byte 0xff at offset 0)" in page.inner_text(
        "#decode-error"
    )
    assert page.locator("#decoded").count() == 0
    page.click("a[href='?view=hex']")
    assert page.inner_text("#body").startswith("00000000  ff fe 20 6f")


def test_writes_without_the_token_or_the_csrf_token_are_refused(
    config: ClientConfig, console: Console, page: Any
) -> None:
    console_url = console.url
    group, origin = _letter(config)
    page.goto(f"{console_url}/dlq/{group}")
    page.locator("#letters input[name=ref]").first.check()
    # No token typed: the form goes without one.
    response_text = _submit(page, "#replay-selected")
    assert "missing or wrong operator token" in response_text
    # A wrong token.
    page.goto(f"{console_url}/dlq/{group}")
    _enter_token(page, "not-the-token")
    page.locator("#letters input[name=ref]").first.check()
    assert "missing or wrong operator token" in _submit(page, "#replay-selected")
    _shot(page, "refused")

    # The token but no CSRF token (as a script elsewhere would send it), same origin, with
    # the browser's session cookie.
    form = {"ref": "0@0", "mode": "write", "scope": "selected", "target": "origin"}
    same = {"Origin": console_url}
    no_csrf = page.request.post(
        f"{console_url}/dlq/{group}/replay",
        form={**form, "token": TOKEN},
        headers=same,
    )
    assert no_csrf.status == 403 and "missing or wrong CSRF token" in no_csrf.text()
    # The right CSRF token of this session, but posted from another origin.
    page.goto(f"{console_url}/dlq/{group}")
    csrf = page.get_attribute("input[name=csrf_token]", "value")
    cross = page.request.post(
        f"{console_url}/dlq/{group}/replay",
        form={**form, "token": TOKEN, "csrf_token": csrf},
        headers={"Origin": "http://evil.example"},
    )
    assert cross.status == 403 and "cross-origin request" in cross.text()
    # Nothing was replayed; the letter is still there.
    assert list(read_messages(config, [origin], timeout_ms=1500)) == []
    assert len(read_dead_letters(config, group)) == 1

    # With both and the token of its dry run, the same request is taken.
    dry_run_token = _dry_run(page, f"{console_url}/dlq/{group}/replay", form, csrf, same)
    done = page.request.post(
        f"{console_url}/dlq/{group}/replay",
        form={**form, "token": TOKEN, "csrf_token": csrf, "dry_run_token": dry_run_token},
        headers=same,
    )
    assert done.status == 200 and "1 replayed" in done.text()
    # The same confirmation again (a double click, a resend): its dry run was spent.
    again = page.request.post(
        f"{console_url}/dlq/{group}/replay",
        form={**form, "token": TOKEN, "csrf_token": csrf, "dry_run_token": dry_run_token},
        headers=same,
    )
    assert again.status == 409 and "written already" in again.text()
    assert len(list(read_messages(config, [origin], timeout_ms=1500))) == 1

    # Each write, refused or done, is in the console's log with who and what, never the token.
    def logged() -> str:
        return "".join(console.log)

    wait_until(lambda: f"replay of dead letters of {group} to origin: letters 0@0 done" in logged())
    audit = logged()
    assert f"refused POST /dlq/{group}/replay from 127.0.0.1: missing or wrong CSRF" in audit
    assert f"refused POST /dlq/{group}/replay from 127.0.0.1: cross-origin" in audit
    assert f"token holder at 127.0.0.1: replay of dead letters of {group}" in audit
    assert TOKEN not in audit


def _dry_run(
    page: Any, url: str, form: dict[str, str], csrf: str | None, headers: dict[str, str]
) -> str:
    """POST the dry run of ``form``'s replay; the dry-run token its confirmation carries."""
    dry = page.request.post(
        url, form={**form, "mode": "dry-run", "token": TOKEN, "csrf_token": csrf}, headers=headers
    )
    assert dry.status == 200, dry.text()
    found = re.search(r'name="dry_run_token" value="([^"]+)"', dry.text())
    assert found is not None, dry.text()
    return found.group(1)


def test_a_replay_without_its_dry_run_is_refused_and_changes_nothing(
    config: ClientConfig, console: Console, page: Any
) -> None:
    """Every other check passes (operator token, CSRF token, origin): a write-replay posted
    straight, or with the token of a dry run of other letters, is refused with 409 and
    audited; the letter stays and its origin topic gets nothing."""
    console_url = console.url
    group, origin = _letter(config)
    url = f"{console_url}/dlq/{group}/replay"
    page.goto(f"{console_url}/dlq/{group}")
    csrf = page.get_attribute("input[name=csrf_token]", "value")
    same = {"Origin": console_url}
    write = {"ref": "0@0", "mode": "write", "scope": "selected", "target": "origin"}
    straight = page.request.post(
        url, form={**write, "token": TOKEN, "csrf_token": csrf}, headers=same
    )
    assert straight.status == 409, straight.text()
    assert "no dry run" in straight.text()
    # A dry run of the whole queue to the retry topic does not let the origin replay through.
    other = _dry_run(page, url, {**write, "scope": "filtered", "target": "retry"}, csrf, same)
    foreign = page.request.post(
        url,
        form={**write, "token": TOKEN, "csrf_token": csrf, "dry_run_token": other},
        headers=same,
    )
    assert foreign.status == 409 and "other letters" in foreign.text()
    assert list(read_messages(config, [origin], timeout_ms=1500)) == []
    assert len(read_dead_letters(config, group)) == 1
    wait_until(lambda: f"refused replay of dead letters of {group}" in "".join(console.log))
    assert f"{group} to origin: letters 0@0: no dry run" in "".join(console.log)

    # The page's own flow: the dry run, then its confirmation, replays the letter once.
    _enter_token(page)
    page.locator("#letters input[name=ref]").first.check()
    page.click("#replay-selected")
    page.click("#confirm-replay")
    assert "1 replayed to origin" in page.inner_text("#summary")
    assert len(list(read_messages(config, [origin], timeout_ms=3000))) == 1


def _submit(page: Any, button: str) -> str:
    """Click ``button``; the text of the page it led to (403 for a refused write)."""
    with page.expect_navigation() as navigation:
        page.click(button)
    response = navigation.value
    assert response is not None and response.status == 403
    return str(page.inner_text("body"))


def test_the_read_pages_show_delays_quarantine_and_health(
    config: ClientConfig, console_url: str, page: Any, coordinator: Coordinator
) -> None:
    later = _name("later")
    TopicAdmin(config).ensure_topics([TopicSpec(later, 1)])
    timer = Message(later, b"in 25 minutes")
    timer.set_delay_time_ms(25 * 60_000)
    with Producer("console-delays", config=config) as producer:
        producer.send_sync(Message(later, b"in two hours", delay_time_level=18))
        producer.send_sync(timer)
    page.goto(f"{console_url}/delays")
    assert "2 waiting" in page.inner_text("#waiting")
    # The histogram of due times: the timer due in 25 minutes, the level-18 one in 2 hours.
    counts = {
        row.get_attribute("data-bucket"): int(row.locator("td.count").inner_text())
        for row in page.locator("#histogram tr[data-bucket]").all()
    }
    assert counts.pop("+0:20-0:30") == 1 and counts.pop("+1:50-2:00") == 1
    assert set(counts.values()) == {0}, counts
    _shot(page, "delays")
    page.goto(f"{console_url}/quarantine")
    assert page.locator("#reasons").is_visible()
    _shot(page, "quarantine")
    page.goto(f"{console_url}/health")
    wait_until(_healthy(page, f"{console_url}/health"), timeout_s=60, interval_s=1)
    assert config.bootstrap_servers in page.inner_text("#settings")
    _shot(page, "health")


def _healthy(page: Any, url: str) -> Callable[[], bool]:
    def check() -> bool:
        page.goto(url)
        return "all running" in page.inner_text("#overall")

    return check


def test_the_coordinator_serves_the_console_read_only_on_its_metrics_port(
    config: ClientConfig, page: Any
) -> None:
    """``bridge coordinator --metrics-port 0 --console`` (a namespace of its own): the pages
    beside /metrics, read-only; a write with the operator token is refused there."""
    namespace = f"ns{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "BRIDGE_CONSOLE_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "--namespace", namespace, "coordinator",
         "-b", config.bootstrap_servers, "--metrics-port", "0", "--console"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        found = re.search(r"console on (http://127\.0\.0\.1:\d+)/ \(read-only\)", "".join(lines))
        assert found is not None, lines
        url = found.group(1)
        page.goto(f"{url}/transactions")
        assert page.inner_text("header .mode") == "read-only"
        assert namespace in page.inner_text("header .ns")
        assert page.locator("#operator-token").count() == 0
        _shot(page, "coordinator-console")
        metrics = page.request.get(f"{url}/metrics")
        assert metrics.status == 200 and "bridge_" in metrics.text()
        refused = page.request.post(
            f"{url}/transactions/resolve",
            form={"action": "replay", "msg_id": "x", "token": TOKEN},
            headers={"Origin": url},
        )
        assert refused.status == 403 and "the console is read-only" in refused.text()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
