"""Metrics and health against a real broker: a coordinator serves /metrics, /healthz and
/readyz while a workload of transactions (commit, rollback, one UNKNOWN then checked), delay
levels, a timer and a push consumer that fails some messages runs in this process; the values
scraped over HTTP match what the workload did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    Producer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.consumer import (
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeStatus,
    MessageListenerConcurrently,
    PushConsumer,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.health import serve_coordinator_metrics
from bridge.lifecycle import FatalServiceError, ServiceThread
from bridge.message import now_ms
from bridge.observability import BridgeMetrics, disable_metrics, enable_metrics
from bridge.runtime.node_config import free_port
from bridge.transaction.model import EndTransaction
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import SystemTopic, TopicCatalog

pytestmark = pytest.mark.broker

LEVELS = "1s 1s 1s 2s 3s 8s"
"""Level 3 (a first retry) waits 1 s; level 6 (the delayed messages here) 8 s."""
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
BRIDGE = ("rocketmq_", "bridge_")
"""The prefixes of the bridge's own metrics."""


def scrape(url: str) -> Samples:
    """Every sample of ``url``/metrics, by (name, labels)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_until(url: str, ready: Callable[[Samples], bool], timeout_s: float = 30.0) -> Samples:
    """Scrape ``url`` until ``ready`` holds for the samples; return them."""
    found: list[Samples] = []

    def attempt() -> bool:
        found.append(scrape(url))
        return ready(found[-1])

    try:
        wait_until(attempt, timeout_s=timeout_s)
    except BaseException:
        shown = {f"{n}{dict(ls)}": v for (n, ls), v in found[-1].items() if n.startswith(BRIDGE)}
        print("last scrape:", "\n".join(f"{k} {v}" for k, v in sorted(shown.items())))
        raise
    return found[-1]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls) in samples if n == name]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.fixture()
def metrics() -> Iterator[BridgeMetrics]:
    """Recording on in this process, in a registry of this test's own."""
    disable_metrics()
    yield enable_metrics(CollectorRegistry())
    disable_metrics()


@pytest.fixture()
def config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level=LEVELS,
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


def coordinator_config(config: ClientConfig) -> CoordinatorConfig:
    return CoordinatorConfig(
        client=config,
        coordinator_id=f"m-{uuid.uuid4().hex[:8]}",
        transaction_partitions=2,
        transaction_timeout_ms=1500,
        check_interval_ms=1000,
        transaction_check_max=15,
        session_timeout_ms=6000,
    )


class Scripted(TransactionListener):
    """Commits ``commit-*``, rolls back ``rollback-*``, answers UNKNOWN for ``unknown`` and,
    once :attr:`decide` is set, COMMIT to its checks."""

    def __init__(self) -> None:
        self.decide = threading.Event()
        self.checks = 0

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        body = msg.body.decode()
        if body.startswith("commit"):
            return TransactionStatus.COMMIT
        if body.startswith("rollback"):
            return TransactionStatus.ROLLBACK
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        self.checks += 1
        return TransactionStatus.COMMIT if self.decide.is_set() else TransactionStatus.UNKNOWN


class FailsBad(MessageListenerConcurrently):
    """Fails every message whose body is ``bad`` (retry after level 3, 1 s here)."""

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        if any(m.body == b"bad" for m in msgs):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS


def test_scraped_metrics_match_the_workload(
    metrics: BridgeMetrics, config: ClientConfig, unique: Any
) -> None:
    ns = config.namespace
    tx_topic, delay_topic, consumed_topic = unique("tx"), unique("delayed"), unique("consumed")
    group, tx_group = unique("mgroup").replace("-", "_"), unique("txg").replace("-", "_")
    coordinator = Coordinator(coordinator_config(config))
    endpoint = serve_coordinator_metrics(coordinator, 0, delay_refresh_s=0.2)
    url = endpoint.url
    try:
        # Not started: alive, not ready.
        assert status(url + "/healthz") == 200
        assert status(url + "/readyz") == 503
        coordinator.start()
        wait_until(lambda: status(url + "/readyz") == 200, timeout_s=60)
        up = scrape(url)
        assert {s["service"] for s in series(up, "bridge_service_up")} == {
            "transaction", "schedule", "timer",
        }  # fmt: skip
        assert total(up, "bridge_service_up", namespace=ns) == 3

        # --- transactions: 2 commits, 1 rollback, 1 UNKNOWN left undecided, then checked.
        listener = Scripted()
        with TransactionMQProducer(tx_group, listener, config=config) as tx:
            for body in ("commit-1", "commit-2", "rollback-1", "unknown"):
                tx.send_message_in_transaction(Message(tx_topic, body), None)

            s = scrape_until(
                url,
                lambda x: (
                    total(x, "rocketmq_commit_messages_total", topic=tx_topic) == 2
                    and listener.checks >= 1
                ),
                timeout_s=60,
            )
            assert total(s, "rocketmq_half_messages", namespace=ns) == 1
            assert total(s, "bridge_transaction_oldest_undecided_age_seconds", namespace=ns) > 1
            assert total(s, "rocketmq_rollback_messages_total", topic=tx_topic) == 1
            assert total(s, "bridge_transaction_checks_total", producer_group=tx_group) >= 1
            listener.decide.set()
            s = scrape_until(
                url,
                # The gauge follows the state, read at each scrape, right after the commit.
                lambda x: (
                    total(x, "rocketmq_commit_messages_total", topic=tx_topic) == 3
                    and total(x, "rocketmq_half_messages", namespace=ns) == 0
                ),
                timeout_s=60,
            )
        assert total(s, "bridge_transaction_oldest_undecided_age_seconds", namespace=ns) == 0
        answers = total(
            s, "bridge_transaction_check_answers_total", producer_group=tx_group, status="COMMIT"
        )
        assert answers == 1
        assert total(s, "bridge_transaction_checks_total", producer_group=tx_group) >= 2
        assert total(s, "rocketmq_finish_message_latency_count", namespace=ns) == 4
        # The producer side, in this process: four half messages (and their END records).
        half = f"{ns}.RMQ_SYS_TRANS_HALF_TOPIC"
        assert total(s, "rocketmq_messages_in_total", topic=half, message_type="transaction") >= 4
        assert sorted(m.body.decode() for m in read_messages(config, [tx_topic], max_messages=3,
                                                              timeout_ms=30_000)) == [
            "commit-1", "commit-2", "unknown",
        ]  # fmt: skip

        # --- delays: three messages at level 6 (8 s), one timer (3 s).
        with Producer(unique("dprod").replace("-", "_"), config=config) as producer:
            for i in range(3):
                producer.send_sync(Message(delay_topic, f"level-{i}", delay_time_level=6))
            timer = Message(delay_topic, "timer")
            timer.set_delay_time_ms(3000)
            producer.send_sync(timer)
        s = scrape_until(
            url,
            lambda x: total(x, "bridge_delay_waiting_messages", kind="level", level="6") == 3,
            timeout_s=10,
        )
        schedule = f"{ns}.SCHEDULE_TOPIC_XXXX"
        assert total(s, "rocketmq_messages_in_total", topic=schedule, message_type="delay") == 3
        assert total(s, "bridge_delay_waiting_messages", kind="tier") >= 1
        s = scrape_until(
            url,
            lambda x: (
                total(x, "bridge_delay_deliveries_total", kind="schedule") == 3
                and total(x, "bridge_delay_deliveries_total", kind="timer") == 1
                and total(x, "bridge_delay_waiting_messages", kind="level", level="6") == 0
            ),
            timeout_s=30,
        )
        assert total(s, "bridge_delay_lateness_seconds_count", kind="schedule") == 3
        assert total(s, "bridge_delay_lateness_seconds_count", kind="timer") == 1
        # Never early; late by less than a few seconds on a loaded machine.
        assert total(s, "bridge_delay_lateness_seconds_sum", kind="schedule") < 3 * 5.0

        # --- a push consumer: 4 good messages and 1 that always fails (max 1 reconsume).
        consumer = PushConsumer(
            group,
            config=config,
            max_reconsume_times=1,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        consumer.subscribe(consumed_topic, FailsBad())
        with Producer(unique("cprod").replace("-", "_"), config=config) as producer:
            # Sent first: the topic exists when the consumer subscribes (from its start).
            for body in ("good-1", "good-2", "bad", "good-3", "good-4"):
                producer.send_sync(Message(consumed_topic, body))
        consumer.start()
        try:
            c = {"namespace": ns, "consumer_group": group}
            s = scrape_until(
                url,
                lambda x: (
                    total(x, "rocketmq_send_to_dlq_messages_total", **c) == 1
                    and total(x, "rocketmq_messages_out_total", **c) == 4
                ),
                timeout_s=60,
            )
            assert total(s, "bridge_consumer_failures_total", **c) == 2
            assert total(s, "bridge_retry_messages_total", **c) == 1
            process = {"consumer_group": group, "topic": consumed_topic}
            assert total(s, "rocketmq_process_time_count", invocation_status="success",
                         **process) == 4  # fmt: skip
            assert total(s, "rocketmq_process_time_count", invocation_status="failure",
                         **process) == 2  # fmt: skip
            stats = consumer.stats()
            assert (stats.consumed, stats.failed, stats.sent_back, stats.dead_lettered) == (
                4, 2, 1, 1,
            )  # fmt: skip
            # librdkafka's statistics (every 5 s): the consumer's lag, a broker round trip.
            s = scrape_until(
                url,
                lambda x: (
                    any(
                        d.get("consumer_group") == group and d.get("topic") == consumed_topic
                        for d in series(x, "rocketmq_consumer_lag_messages")
                    )
                    and total(x, "rocketmq_consumer_cached_messages", **c) == 0
                ),
                timeout_s=30,
            )
            assert series(s, "bridge_kafka_broker_rtt_seconds")
            assert total(s, "bridge_kafka_broker_rtt_seconds") > 0
        finally:
            consumer.shutdown()
        assert total(s, "bridge_kafka_transactions_total", namespace=ns, service="transaction") > 0
        assert total(s, "bridge_kafka_transactions_total", namespace=ns, service="schedule") > 0
        assert total(s, "bridge_quarantined_messages_total", namespace=ns) == 0
        print_scrape(url)
        assert status(url + "/healthz") == 200
        assert status(url + "/readyz") == 200
    finally:
        coordinator.stop()
        endpoint.stop()
    # Stopped without a failure: alive (the process may exit cleanly), not ready.
    assert not coordinator.failure


def print_scrape(url: str) -> None:
    """The bridge's own samples, for the record (``pytest -s`` shows them)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    shown = [
        line
        for line in lines
        if line.startswith(("rocketmq_", "bridge_"))
        and "_bucket{" not in line
        and "_created" not in line
    ]
    print("\n".join(shown))


class Breakable(ServiceThread):
    """A coordinator service that fails (a :class:`FatalServiceError`) once told to."""

    def __init__(self) -> None:
        super().__init__(f"bridge-breakable-{uuid.uuid4().hex[:6]}", interval_ms=50)
        self.fail = threading.Event()

    def run_once(self) -> None:
        if self.fail.is_set():
            raise FatalServiceError("broken on purpose")


class Commits(TransactionListener):
    """Commits every transaction."""

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


def test_a_commit_set_aside_for_its_topic_is_counted_once(
    metrics: BridgeMetrics, config: ClientConfig, unique: Any
) -> None:
    """A commit whose real topic does not exist is set aside, to be committed on its own, in a
    pass that then has nothing to write; its count went with that pass's batch, and
    ``rocketmq_commit_messages`` never counted it (a loaded broker, slow to create a topic on
    first write, showed it in the workload test above)."""
    client = config.replace(kafka={**config.kafka, "allow.auto.create.topics": "false"})
    missing = unique("missing")
    coordinator = Coordinator(coordinator_config(client))
    endpoint = serve_coordinator_metrics(coordinator, 0)
    try:
        coordinator.start()
        with TransactionMQProducer(
            unique("txg").replace("-", "_"), Commits(), config=client
        ) as producer:
            producer.send_message_in_transaction(Message(missing, "set aside"), None)
            # Tried alone three times a second or more apart, then parked.
            s = scrape_until(
                endpoint.url,
                lambda x: total(x, "bridge_transactions_parked_total", reason="undeliverable") == 1,
                timeout_s=60,
            )
        assert total(s, "rocketmq_commit_messages_total", topic=missing) == 1
        assert total(s, "rocketmq_finish_message_latency_count", namespace=client.namespace) == 1
    finally:
        coordinator.stop()
        endpoint.stop()


def test_a_half_writer_cannot_make_series_of_its_own_names(
    metrics: BridgeMetrics, config: ClientConfig, unique: Any
) -> None:
    """A refused real topic is labelled ``(not allowed)``; an UNKNOWN check answer for no
    pending transaction of its group is not counted (writing HALF does not add series)."""
    ns = config.namespace
    allowed, outside = unique("allowed"), unique("outside")
    forged_groups = [f"forged_{i}_{uuid.uuid4().hex[:6]}" for i in range(3)]
    narrow = CoordinatorConfig(
        client=config,
        coordinator_id=f"m-{uuid.uuid4().hex[:8]}",
        transaction_partitions=1,
        transaction_timeout_ms=1500,
        check_interval_ms=1000,
        session_timeout_ms=6000,
        allowed_topics=f"{allowed}",
    )
    half = TopicCatalog(namespace=ns).topic(SystemTopic.HALF)
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    with Coordinator(narrow):
        # UNKNOWN answers naming groups and transactions that are not pending; read before
        # the transactions below (one HALF partition, in order).
        for group in forged_groups:
            tid = uuid.uuid4().hex
            end = EndTransaction(
                tid, tid, group, TransactionStatus.UNKNOWN, True, "forger-1", now_ms()
            )
            raw.produce(half, end.encode(), tid.encode(), partition=0)
        assert raw.flush(10) == 0
        with TransactionMQProducer(unique("txg").replace("-", "_"), Commits(), config=config) as tx:
            tx.send_message_in_transaction(Message(outside, b"outside"), None)
            tx.send_message_in_transaction(Message(allowed, b"inside"), None)

            def counted() -> bool:
                get = metrics.registry.get_sample_value
                commits = "rocketmq_commit_messages_total"
                return (get(commits, {"namespace": ns, "topic": allowed}) or 0) == 1 and (
                    get(commits, {"namespace": ns, "topic": "(not allowed)"}) or 0
                ) == 1

            wait_until(counted, timeout_s=60)
    labels = [
        sample.labels
        for family in metrics.registry.collect()
        if family.name in ("rocketmq_commit_messages", "bridge_transaction_check_answers")
        for sample in family.samples
        if sample.labels.get("namespace") == ns
    ]
    assert not [x for x in labels if x.get("topic") == outside], labels
    assert not [x for x in labels if x.get("producer_group") in forged_groups], labels


def test_health_endpoints_follow_a_service_failure(
    metrics: BridgeMetrics, config: ClientConfig
) -> None:
    service = Breakable()
    coordinator = Coordinator(coordinator_config(config), [service])
    with serve_coordinator_metrics(coordinator, 0) as endpoint:
        url = endpoint.url
        assert status(url + "/readyz") == 503  # before start
        coordinator.start()
        try:
            wait_until(lambda: status(url + "/readyz") == 200, timeout_s=30)
            assert status(url + "/healthz") == 200
            service.fail.set()
            wait_until(lambda: status(url + "/healthz") == 503, timeout_s=30)
            assert status(url + "/readyz") == 503
            with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
                assert answer.status == 200  # metrics are still served
            try:
                urllib.request.urlopen(url + "/healthz", timeout=10)
            except urllib.error.HTTPError as error:
                assert "broken on purpose" in error.read().decode()
        finally:
            coordinator.stop()


def test_the_coordinator_command_serves_metrics_and_readiness(config: ClientConfig) -> None:
    port = free_port()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_COORDINATOR_ID": f"cli-{uuid.uuid4().hex[:6]}",
        "BRIDGE_METRICS_PORT": str(port),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "coordinator"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _quiet_status(url + "/readyz") == 200, timeout_s=90)
        s = scrape(url)
        assert total(s, "bridge_service_up", namespace=config.namespace) == 3
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()[-2000:]
    assert f"{url}/metrics".encode() in output


def _quiet_status(url: str) -> int | None:
    try:
        return status(url)
    except OSError:  # not listening yet
        return None
