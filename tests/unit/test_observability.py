"""The pure parts of bridge.observability: metric names and labels, librdkafka statistics, the
HTTP endpoint, and the consumer and producer hooks (no Kafka)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bridge.client.send_results import SyncWaiter, log_oneway_failure
from bridge.consumer.context import Subscription, timed_subscription
from bridge.consumer.counters import Count, Counters
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageQueue,
    TagFilter,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.health import coordinator_report
from bridge.errors import InvalidArgumentError
from bridge.lifecycle import ServiceThread
from bridge.message import MessageExt
from bridge.observability import (
    BridgeMetrics,
    HealthReport,
    MetricsServer,
    active_metrics,
    disable_metrics,
    enable_metrics,
    serve_metrics,
)
from bridge.observability.metrics import message_type
from bridge.observability.rdkafka_stats import (
    STATISTICS_INTERVAL_MS,
    client_label,
    record_stats,
    statistics_overrides,
    summarize_stats,
)
from bridge.observability.server import parse_port

STATS = {
    "name": "orders-producer#producer-1",
    "type": "producer",
    "msg_cnt": 7,
    "msg_size": 2048,
    "brokers": {
        "127.0.0.1:9092/bootstrap": {"nodeid": -1, "state": "UP", "rtt": {"avg": 0}},
        "127.0.0.1:9092/1": {
            "nodeid": 1,
            "nodename": "127.0.0.1:9092",
            "state": "UP",
            "rtt": {"avg": 2500},
            "txerrs": 1,
            "rxerrs": 2,
            "req_timeouts": 3,
        },
    },
    "topics": {
        "orders": {
            "partitions": {
                "0": {"consumer_lag_stored": 5, "consumer_lag": 9},
                "1": {"consumer_lag_stored": -1, "consumer_lag": 4},
                "2": {"consumer_lag_stored": -1, "consumer_lag": -1},
                "-1": {"consumer_lag_stored": 100, "consumer_lag": 100},
            }
        }
    },
}


def value(metrics: BridgeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def metrics() -> Iterator[BridgeMetrics]:
    disable_metrics()
    active = enable_metrics(CollectorRegistry(), namespace="ns1")
    yield active
    disable_metrics()


def test_message_type_follows_rocketmqs_labels() -> None:
    assert message_type("rmq.RMQ_SYS_TRANS_HALF_TOPIC") == "transaction"
    assert message_type("rmq.SCHEDULE_TOPIC_XXXX") == "delay"
    assert message_type("prod.rmq_sys_wheel_timer") == "delay"
    assert message_type("orders") == "normal"


def test_names_follow_rocketmq_and_prometheus() -> None:
    names = BridgeMetrics(CollectorRegistry()).exported_names()
    for rocketmq in (
        "rocketmq_messages_in_total",
        "rocketmq_messages_out_total",
        "rocketmq_send_cost_time",
        "rocketmq_process_time",
        "rocketmq_consumer_lag_messages",
        "rocketmq_send_to_dlq_messages_total",
        "rocketmq_half_messages",
        "rocketmq_commit_messages_total",
        "rocketmq_rollback_messages_total",
    ):
        assert rocketmq in names
    for name in names - {n for n in names if n.startswith("rocketmq_")}:
        assert name.startswith("bridge_"), name
    assert "bridge_transaction_oldest_undecided_age_seconds" in names


def test_a_registry_of_its_own_has_the_process_figures() -> None:
    own = BridgeMetrics()
    assert "process_cpu_seconds_total" in own.exported_names()


def test_librdkafka_statistics_are_summarized() -> None:
    summary = summarize_stats(json.dumps(STATS))
    assert summary.client == "orders-producer#producer-1"
    assert (summary.queue_messages, summary.queue_bytes) == (7, 2048)
    assert summary.broker_rtt_s == {"127.0.0.1:9092": 0.0025}
    assert summary.request_errors == 6
    # The stored lag where there is one, else the lag; unknown and the -1 partition left out.
    assert summary.consumer_lag == {"orders": 9}
    with pytest.raises(ValueError):
        summarize_stats("[1, 2]")


def test_statistics_become_gauges(metrics: BridgeMetrics) -> None:
    record_stats(metrics, summarize_stats(json.dumps(STATS)), group="g1")
    client = "orders-producer"  # the client.id, without librdkafka's instance number
    assert value(metrics, "bridge_kafka_producer_queue_messages", client=client) == 7
    assert value(metrics, "bridge_kafka_producer_queue_bytes", client=client) == 2048
    rtt = value(metrics, "bridge_kafka_broker_rtt_seconds", client=client, broker="127.0.0.1:9092")
    assert rtt == 0.0025
    lag = value(
        metrics, "rocketmq_consumer_lag_messages", namespace="ns1", topic="orders",
        consumer_group="g1",
    )  # fmt: skip
    assert lag == 9


def test_statistics_are_only_asked_for_while_metrics_are_on(metrics: BridgeMetrics) -> None:
    assert statistics_overrides(None) == {}
    overrides = statistics_overrides(metrics, "g1")
    assert overrides["statistics.interval.ms"] == STATISTICS_INTERVAL_MS
    overrides["stats_cb"]("not json")  # never raises
    overrides["stats_cb"](json.dumps(STATS))
    assert value(metrics, "bridge_kafka_client_request_errors", client="orders-producer") == 6


def test_a_client_made_again_sets_the_same_series(metrics: BridgeMetrics) -> None:
    # Each client a process makes gets the next instance number; a coordinator's producers
    # are made again after fencing, so labelling by the number would add series forever.
    for instance, queued in ((1, 7), (2, 3), (3, 1)):
        report = {**STATS, "name": f"orders-producer#producer-{instance}", "msg_cnt": queued}
        record_stats(metrics, summarize_stats(json.dumps(report)))
    queue = [
        sample.labels
        for family in metrics.registry.collect()
        if family.name == "bridge_kafka_producer_queue_messages"
        for sample in family.samples
    ]
    assert queue == [{"client": "orders-producer"}]
    assert value(metrics, "bridge_kafka_producer_queue_messages", client="orders-producer") == 1
    assert client_label("a#b#consumer-12") == "a#b"
    assert client_label("#producer-1") == "#producer-1"


def test_enable_returns_one_instance_until_disabled() -> None:
    disable_metrics()
    assert active_metrics() is None
    first = enable_metrics(CollectorRegistry())
    assert enable_metrics() is first and active_metrics() is first
    disable_metrics()
    assert active_metrics() is None


def test_enabling_again_in_a_registry_reuses_its_metrics() -> None:
    # As with prometheus_client.REGISTRY: the bridge's metrics are registered in it once.
    registry = CollectorRegistry()
    disable_metrics()
    try:
        first = enable_metrics(registry)
        disable_metrics()
        again = enable_metrics(registry)
        assert again is first and active_metrics() is first
        # Another registry makes its own metrics the active ones.
        other = enable_metrics(CollectorRegistry())
        assert other is not first and active_metrics() is other
        # A namespace named later is honoured, not silently dropped.
        assert enable_metrics(registry, namespace="ns2") is first
        assert first.namespace == "ns2"
        assert enable_metrics(namespace="ns3").namespace == "ns3"
    finally:
        disable_metrics()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_endpoint_serves_metrics_and_health() -> None:
    registry = CollectorRegistry()
    metrics = BridgeMetrics(registry)
    metrics.kafka_aborts.labels("ns1", "timer").inc(3)
    state = {"report": HealthReport(alive=True, ready=False, details={"why": "joining"})}
    scrapes: list[int] = []
    with MetricsServer(
        registry,
        0,
        health=lambda: state["report"],
        before_scrape=lambda: scrapes.append(1),
    ) as server:
        status, text = get(server.url + "/metrics")
        assert status == 200 and scrapes == [1]
        families = {f.name: f for f in text_string_to_metric_families(text)}
        sample = families["bridge_kafka_transaction_aborts"].samples[0]
        assert sample.labels == {"namespace": "ns1", "service": "timer"} and sample.value == 3
        assert get(server.url + "/healthz")[0] == 200
        status, body = get(server.url + "/readyz")
        assert status == 503 and json.loads(body)["why"] == "joining"
        state["report"] = HealthReport(alive=True, ready=True)
        assert get(server.url + "/readyz")[0] == 200
        state["report"] = HealthReport(alive=False, ready=True, details={"failure": "fenced"})
        assert get(server.url + "/healthz")[0] == 503
        assert get(server.url + "/readyz")[0] == 503
        assert get(server.url + "/nothing")[0] == 404


def test_a_health_check_that_raises_is_a_failure() -> None:
    def broken() -> HealthReport:
        raise RuntimeError("boom")

    with MetricsServer(CollectorRegistry(), 0, health=broken) as server:
        status, body = get(server.url + "/healthz")
    assert status == 503 and "boom" in body


def test_a_port_in_use_is_a_typed_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidArgumentError, match=f"127.0.0.1:{port}"):
            MetricsServer(CollectorRegistry(), port).start()
    with pytest.raises(InvalidArgumentError, match="0-65535"):
        MetricsServer(CollectorRegistry(), 70000)


def test_serve_metrics_turns_recording_on() -> None:
    disable_metrics()
    server = serve_metrics(0, namespace="app")
    try:
        metrics = active_metrics()
        assert metrics is not None and metrics.namespace == "app"
        Counters("g", "app").add(Count.CONSUMED, 2)
        status, text = get(server.url + "/metrics")
        assert status == 200
        assert 'rocketmq_messages_out_total{consumer_group="g",namespace="app"} 2.0' in text
    finally:
        server.stop()
        disable_metrics()


@pytest.mark.parametrize(
    ("value_", "expected"), [(None, None), ("", None), (" ", None), ("9464", 9464), (0, 0)]
)
def test_ports_parse(value_: str | int | None, expected: int | None) -> None:
    assert parse_port(value_) == expected


@pytest.mark.parametrize("bad", ["http", "-1", "65536", "9.5"])
def test_bad_ports_are_refused_by_name(bad: str) -> None:
    with pytest.raises(InvalidArgumentError, match="BRIDGE_METRICS_PORT"):
        parse_port(bad)


def test_consumer_counters_mirror_into_the_metrics(metrics: BridgeMetrics) -> None:
    counters = Counters("orders_group", "ns1")
    counters.add(Count.CONSUMED, 3)
    counters.add(Count.SENT_BACK)
    counters.add(Count.DEAD_LETTERED, 2)
    counters.add(Count.QUARANTINED)
    labels = {"namespace": "ns1", "consumer_group": "orders_group"}
    assert value(metrics, "rocketmq_messages_out_total", **labels) == 3
    assert value(metrics, "bridge_retry_messages_total", **labels) == 1
    assert value(metrics, "rocketmq_send_to_dlq_messages_total", **labels) == 2
    assert (
        value(metrics, "bridge_quarantined_messages_total", namespace="ns1", source="consumer") == 1
    )
    assert counters.snapshot().consumed == 3


def test_consumer_counters_record_nothing_while_metrics_are_off() -> None:
    disable_metrics()
    registry = CollectorRegistry()
    BridgeMetrics(registry)
    Counters("g", "ns").add(Count.CONSUMED)
    assert registry.get_sample_value("rocketmq_messages_out_total", {}) is None


def _msg(topic: str = "orders") -> MessageExt:
    return MessageExt(topic=topic, body=b"x")


class _Batch(MessageListenerConcurrently):
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS


def test_timed_listeners_keep_their_kind_and_record_process_time(
    metrics: BridgeMetrics,
) -> None:
    def callback(msg: MessageExt) -> ConsumeStatus:
        if msg.body == b"raise":
            raise RuntimeError("listener failed")
        return (
            ConsumeStatus.RECONSUME_LATER if msg.body == b"fail" else ConsumeStatus.CONSUME_SUCCESS
        )

    sub = timed_subscription(
        Subscription("orders", "orders", TagFilter("*"), callback), metrics, "ns1", "g1"
    )
    assert callable(sub.listener) and not isinstance(sub.listener, MessageListenerConcurrently)
    assert sub.listener(MessageExt(topic="orders", body=b"ok")) is ConsumeStatus.CONSUME_SUCCESS
    assert sub.listener(MessageExt(topic="orders", body=b"fail")) is ConsumeStatus.RECONSUME_LATER
    with pytest.raises(RuntimeError):
        sub.listener(MessageExt(topic="orders", body=b"raise"))
    labels = {"namespace": "ns1", "topic": "orders", "consumer_group": "g1"}
    ok = value(metrics, "rocketmq_process_time_count", invocation_status="success", **labels)
    failed = value(metrics, "rocketmq_process_time_count", invocation_status="failure", **labels)
    assert (ok, failed) == (1, 2)

    batch = timed_subscription(
        Subscription("orders", "orders", TagFilter("*"), _Batch()), metrics, "ns1", "g1"
    )
    assert isinstance(batch.listener, MessageListenerConcurrently)
    context = ConsumeConcurrentlyContext(MessageQueue("orders", 0))
    assert batch.listener.consume_message([_msg()], context) is ConsumeStatus.CONSUME_SUCCESS
    ok = value(metrics, "rocketmq_process_time_count", invocation_status="success", **labels)
    assert ok == 2


class _Report:
    def __init__(self, topic: str, size: int) -> None:
        self._topic, self._size = topic, size

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 41

    def __len__(self) -> int:
        return self._size


def test_delivery_reports_are_recorded(metrics: BridgeMetrics) -> None:
    waiter = SyncWaiter()
    waiter(None, _Report("rmq.RMQ_SYS_TRANS_HALF_TOPIC", 10))
    assert waiter.offset == 41
    log_oneway_failure(None, _Report("orders", 5))
    half = {"namespace": "ns1", "topic": "rmq.RMQ_SYS_TRANS_HALF_TOPIC"}
    assert value(metrics, "rocketmq_messages_in_total", message_type="transaction", **half) == 1
    assert value(metrics, "rocketmq_throughput_in_total", message_type="transaction", **half) == 10
    assert value(metrics, "rocketmq_send_cost_time_count", invocation_status="success", **half) == 1
    orders = {"namespace": "ns1", "topic": "orders", "message_type": "normal"}
    assert value(metrics, "rocketmq_messages_in_total", **orders) == 1


def test_a_broken_report_never_fails_the_send(metrics: BridgeMetrics) -> None:
    class Broken:
        def topic(self) -> Any:
            raise RuntimeError("no topic")

        def partition(self) -> int:
            return 1

        def offset(self) -> int:
            return 2

    waiter = SyncWaiter()
    waiter(None, Broken())
    assert (waiter.partition, waiter.offset) == (1, 2)


class _Idle(ServiceThread):
    def __init__(self) -> None:
        super().__init__("bridge-idle", interval_ms=1000)

    def run_once(self) -> None:
        pass


def test_a_coordinator_not_started_is_alive_and_not_ready() -> None:
    service = _Idle()
    coordinator = Coordinator(CoordinatorConfig(coordinator_id="unit"), [service])
    report = coordinator_report(coordinator)
    assert (report.alive, report.ready) == (True, False)
    assert report.details["services"] == {"bridge-idle": {"state": "CREATE_JUST", "ready": False}}
    assert "failure" not in report.details
