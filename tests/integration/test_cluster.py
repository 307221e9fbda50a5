"""The three-node local cluster: replication defaults, kill -9 of a leader under load, pause
and resume, controlled shutdown, clients through the fault proxy, and ``bridge broker --nodes``.

One cluster for the module (a cold start costs several seconds); every test starts from a
healthy cluster with every node running.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.client.producer import SendResult
from bridge.errors import (
    BrokerUnreachableError,
    IllegalStateError,
    InvalidArgumentError,
    SendError,
)
from bridge.kafka.acls import await_acls_shown
from bridge.kafka.admin import TopicAdmin
from bridge.runtime.cluster import (
    BROKER_SESSION_TIMEOUT_MS,
    ClusterUnhealthyError,
    LocalClusterConfig,
    LocalKafkaCluster,
)
from bridge.runtime.local_kafka import LocalKafkaConfig
from chaos.proxy import FaultProxy
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import SystemTopic, TopicSpec
from topics.naming import to_kafka_topic

# Serial: starting and killing three nodes beside the other workers' load is what librdkafka's
# clients in a worker have aborted on (SIGABRT in a probe while the nodes came up).
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.serial]

logger = logging.getLogger(__name__)

HEALTHY_TIMEOUT_S = 90.0
PAUSED_OUT_OF_ISR_MS = 10_000
"""The shared cluster's ``replica.lag.time.max.ms``."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    running = LocalKafkaCluster(
        LocalClusterConfig(
            data_dir=tmp_path_factory.mktemp("cluster"),
            proxied=True,
            # Kafka's default before 2.5, a third of today's: a paused node leaves the ISR
            # (and a transaction coordinator that waited on it answers again) 20 s sooner.
            # The fault suite's cluster keeps Kafka's default.
            properties={"replica.lag.time.max.ms": str(PAUSED_OUT_OF_ISR_MS)},
        )
    )
    started = time.monotonic()
    running.start()
    logger.info("measured: cold start of 3 nodes in %.1f s", time.monotonic() - started)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(autouse=True)
def _every_node_up(request: pytest.FixtureRequest) -> None:
    """Before a test of the shared cluster: every node running and the cluster healthy."""
    if "cluster" not in request.fixturenames:
        return
    cluster: LocalKafkaCluster = request.getfixturevalue("cluster")
    for node_id in cluster.node_ids:
        node = cluster.node(node_id)
        if node.is_paused:
            node.resume()
        if not node.is_running:
            cluster.start_node(node_id)
    cluster.wait_healthy(HEALTHY_TIMEOUT_S)


def _config(servers: str, namespace: str, send_timeout_ms: int = 30_000) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=servers, namespace=namespace, send_msg_timeout_ms=send_timeout_ms
    )


def _create(config: ClientConfig, topic: str, partitions: int) -> str:
    """Create a topic through the bridge's own admin path; return its Kafka name."""
    kafka_topic = to_kafka_topic(topic, config.namespace)
    TopicAdmin(config).ensure_topics([TopicSpec(kafka_topic, partitions)])
    return kafka_topic


def _replicas(servers: str, topic: str) -> dict[int, tuple[int, ...]]:
    metadata = AdminClient({"bootstrap.servers": servers}).list_topics(topic, timeout=10)
    return {p: tuple(m.replicas) for p, m in metadata.topics[topic].partitions.items()}


def _polled(action: Callable[[], Any], timeout_s: float = HEALTHY_TIMEOUT_S) -> float:
    """Seconds until ``action`` returns something truthy (polled)."""
    started = time.monotonic()
    wait_until(action, timeout_s=timeout_s, interval_s=0.05)
    return time.monotonic() - started


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_topics_the_bridge_creates_get_rf3_and_min_isr_2(
    cluster: LocalKafkaCluster, namespace: str, unique: Callable[[str], str]
) -> None:
    config = _config(cluster.bootstrap_servers, namespace)
    admin = TopicAdmin(config)
    user_topic = _create(config, unique("rf"), 3)
    admin.ensure_system_topics(config.catalog())
    system = [config.catalog().topic(t) for t in SystemTopic]
    # The internal topics appear with a consumer group's first commit and a transactional
    # producer's first transaction.
    producer = KafkaProducer(
        {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": unique("tx")}
    )
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": unique("g")})
    try:
        consumer.commit(offsets=[TopicPartition(user_topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    internal = ["__consumer_offsets", "__transaction_state"]
    for topic in [user_topic, *system, *internal]:
        replicas = _replicas(cluster.bootstrap_servers, topic)
        assert replicas, topic
        assert {len(r) for r in replicas.values()} == {3}, (topic, replicas)
    configs = admin.describe_configs([user_topic, *system, *internal])
    assert {t: c["min.insync.replicas"] for t, c in configs.items()} == dict.fromkeys(configs, "2")
    assert cluster.controller_leader() in cluster.node_ids
    assert cluster.registered_node_ids() == cluster.node_ids


def test_system_topics_are_provisioned_while_the_brokers_still_learn_of_them(
    cluster: LocalKafkaCluster,
) -> None:
    """Each node learns of a new topic on its own schedule, and each metadata answer may come
    from another node: provisioning must not take the answer after the one that showed every
    topic as the truth (it once read HALF's partition count from a node that did not know
    HALF yet: KeyError, 3 times in 20). Twenty fresh namespaces, so that a race that loses
    one time in seven shows."""
    for _ in range(20):
        config = _config(cluster.bootstrap_servers, f"ns{uuid.uuid4().hex[:10]}")
        TopicAdmin(config).ensure_system_topics(config.catalog())


class _Sender(threading.Thread):
    """Sends numbered messages at a steady pace with an idempotent acks=all producer and
    records which were acknowledged."""

    def __init__(self, producer: Producer, topic: str) -> None:
        super().__init__(name="cluster-test-sender", daemon=True)
        self.producer = producer
        self.topic = topic
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent: list[str] = []
        self.acked: list[str] = []
        self.failed: list[Exception] = []

    def _ok(self, result: SendResult) -> None:
        with self.lock:
            self.acked.append(result.msg_id)

    def _failed(self, error: Exception) -> None:
        with self.lock:
            self.failed.append(error)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            msg_id = self.producer.send_async(
                Message(self.topic, f"m{i}"), on_success=self._ok, on_exception=self._failed
            )
            self.sent.append(msg_id)
            i += 1
            self.stop.wait(0.005)  # a steady rate, about 200 a second

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)


def test_kill_9_of_the_leader_under_load_loses_no_acknowledged_record(
    cluster: LocalKafkaCluster, namespace: str, unique: Callable[[str], str]
) -> None:
    config = _config(cluster.bootstrap_servers, namespace)
    topic = unique("kill")
    kafka_topic = _create(config, topic, 1)
    with Producer("pg", config=config) as producer:
        sender = _Sender(producer, topic)
        sender.start()
        try:
            wait_until(lambda: sender.acked_count() >= 200, timeout_s=60)
            leader = cluster.leader_of(kafka_topic, 0)
            assert leader is not None
            cluster.kill(leader)
            assert not cluster.node(leader).is_running
            failover_s = _polled(lambda: cluster.leader_of(kafka_topic, 0) not in (None, leader))
            acked_at_failover = sender.acked_count()
            wait_until(lambda: sender.acked_count() >= acked_at_failover + 200, timeout_s=60)
        finally:
            sender.stop.set()
            sender.join()
        assert producer.flush(30_000) == 0
    assert sender.failed == []
    assert len(sender.acked) == len(sender.sent)
    received = Counter(
        m.msg_id for m in read_messages(config, [topic], max_messages=None, timeout_ms=3000)
    )
    assert set(sender.acked) <= received.keys()
    assert [msg_id for msg_id, n in received.items() if n > 1] == []

    restarted = time.monotonic()
    cluster.start_node(leader)
    answering_s = time.monotonic() - restarted
    wait_until(lambda: leader in cluster.isr_of(kafka_topic, 0), timeout_s=HEALTHY_TIMEOUT_S)
    rejoin_s = time.monotonic() - restarted
    cluster.wait_healthy(HEALTHY_TIMEOUT_S)
    logger.info(
        "measured: killed leader %d replaced in %.1f s; restarted node answered in %.1f s and "
        "was back in the ISR %.1f s after start_node",
        leader, failover_s, answering_s, rejoin_s,
    )  # fmt: skip
    assert cluster.isr_of(kafka_topic, 0) == cluster.node_ids


def test_pause_fences_a_node_and_resume_brings_it_back(
    cluster: LocalKafkaCluster, namespace: str, unique: Callable[[str], str]
) -> None:
    config = _config(cluster.bootstrap_servers, namespace)
    topic = unique("pause")
    kafka_topic = _create(config, topic, 1)
    leader = cluster.leader_of(kafka_topic, 0)
    assert leader is not None
    node = cluster.node(leader)
    pid = node.pid
    assert pid is not None
    cluster.pause(leader)
    assert node.is_paused and node.is_running
    assert _process_state(pid) == "T"
    assert leader not in cluster.running_node_ids()
    moved_s = _polled(lambda: cluster.leader_of(kafka_topic, 0) not in (None, leader))
    # A new idempotent producer needs a producer id from a transaction coordinator; one whose
    # state partition had the paused node in its ISR answers "load in progress" until the
    # leader drops it from the ISR (replica.lag.time.max.ms, PAUSED_OUT_OF_ISR_MS here): allow
    # for that.
    with Producer("pg", config=_config(cluster.bootstrap_servers, namespace, 60_000)) as producer:
        producer.send_sync(Message(topic, "while paused"))
    cluster.resume(leader)
    assert not node.is_paused
    assert _process_state(pid) != "T"
    back_s = _polled(lambda: leader in cluster.isr_of(kafka_topic, 0))
    cluster.wait_healthy(HEALTHY_TIMEOUT_S)
    logger.info(
        "measured: paused leader %d replaced in %.1f s, back in the ISR %.1f s after resume",
        leader, moved_s, back_s,
    )  # fmt: skip
    assert [m.body for m in read_messages(config, [topic], max_messages=1)] == [b"while paused"]


def test_a_clean_stop_moves_leadership_before_the_node_exits(
    cluster: LocalKafkaCluster, namespace: str, unique: Callable[[str], str]
) -> None:
    config = _config(cluster.bootstrap_servers, namespace)
    kafka_topic = _create(config, unique("stop"), 1)
    leader = cluster.leader_of(kafka_topic, 0)
    assert leader is not None
    node = cluster.node(leader)
    node.begin_stop()
    # Controlled shutdown: the leadership moves at once, not when the session times out.
    moved_s = _polled(lambda: cluster.leader_of(kafka_topic, 0) not in (None, leader))
    assert moved_s < BROKER_SESSION_TIMEOUT_MS / 1000
    cluster.stop_node(leader)
    assert not node.is_running
    with pytest.raises(ClusterUnhealthyError, match=rf"nodes not registered: \[{leader}\]") as err:
        cluster.wait_healthy(1.0)
    assert err.value.missing_nodes == (leader,)
    port = cluster.node(leader).port
    cluster.start_node(leader)
    assert cluster.node(leader).port == port
    cluster.wait_healthy(HEALTHY_TIMEOUT_S)


def test_clients_through_the_proxy_stall_in_a_partition_and_recover_after_heal(
    cluster: LocalKafkaCluster, namespace: str, unique: Callable[[str], str]
) -> None:
    with FaultProxy(cluster.proxy_routes()) as proxy:
        config = _config(cluster.proxied_bootstrap_servers, namespace)
        # Every broker a proxied client learns of is the proxy's address.
        advertised = AdminClient({"bootstrap.servers": cluster.proxied_bootstrap_servers})
        brokers = advertised.list_topics(timeout=10).brokers
        assert sorted(b.port for b in brokers.values()) == sorted(proxy.listen_ports)
        topic = unique("proxied")
        kafka_topic = _create(config, topic, 3)
        leaders = {cluster.leader_of(kafka_topic, p) for p in range(3)}
        with Producer("pg", config=config) as producer:
            for partition in range(3):
                producer.send_sync(Message(topic, f"p{partition}"), partition=partition)
            by_port = proxy.stats().connections_by_port
            for listen, _target in cluster.proxy_routes():
                node_id = next(
                    n for n in cluster.node_ids if cluster.node(n).proxied_advertised_port == listen
                )
                if node_id in leaders:
                    assert by_port[listen] >= 1, (listen, by_port)

            proxy.set_latency(200)
            started = time.monotonic()
            producer.send_sync(Message(topic, "slow"), partition=0)
            assert time.monotonic() - started >= 0.4
            proxy.set_latency(0)

            reset = proxy.drop_connections()
            assert reset >= 1
            producer.send_sync(Message(topic, "after drop"), partition=0)

            before = proxy.stats().bytes_to_client
            proxy.partition()
            acked = threading.Event()
            failed: list[Exception] = []
            producer.send_async(
                Message(topic, "during partition"),
                on_success=lambda _result: acked.set(),
                on_exception=failed.append,
                partition=0,
            )
            assert not acked.wait(3.0)  # no answer while partitioned
            assert proxy.stats().bytes_to_client == before
            proxy.heal()
            wait_until(acked.is_set, timeout_s=30)
            assert failed == []
        bodies = sorted(
            m.body for m in read_messages(config, [topic], max_messages=6, timeout_ms=5000)
        )
        assert bodies == sorted([b"p0", b"p1", b"p2", b"slow", b"after drop", b"during partition"])


def test_proxied_addresses_need_a_proxied_cluster(tmp_path: Path) -> None:
    plain = LocalKafkaCluster(LocalClusterConfig(data_dir=tmp_path / "plain"))
    with pytest.raises(IllegalStateError, match="proxied=True"):
        plain.proxy_routes()
    with pytest.raises(IllegalStateError, match="proxied=True"):
        _ = plain.proxied_bootstrap_servers
    with pytest.raises(InvalidArgumentError, match="no node 7"):
        plain.node(7)
    with pytest.raises(BrokerUnreachableError, match="no node of the local cluster is running"):
        plain.leader_of("t", 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "nodes must be 1..9"),
        ({"nodes": 2}, r"replication_factor must be 1\.\.nodes \(2\), got 3"),
        ({"min_insync_replicas": 4}, r"min_insync_replicas must be 1\.\.replication_factor"),
        ({"heap_mb": 64}, "heap_mb must be at least 128"),
        ({"base_port": 65534}, "base_port must leave room for 3 ports"),
    ],
)
def test_bad_cluster_configs_are_typed_errors(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        LocalClusterConfig(data_dir=tmp_path, **kwargs)


def test_a_data_dir_keeps_its_node_count(tmp_path: Path) -> None:
    three = LocalKafkaCluster(LocalClusterConfig(data_dir=tmp_path))
    assert len(three.bootstrap_servers.split(",")) == 3  # writes cluster.json
    five = LocalKafkaCluster(LocalClusterConfig(data_dir=tmp_path, nodes=5))
    with pytest.raises(InvalidArgumentError, match="holds a cluster of 3 nodes, not 5"):
        _ = five.bootstrap_servers
    again = LocalKafkaCluster(LocalClusterConfig(data_dir=tmp_path))
    assert again.bootstrap_servers == three.bootstrap_servers
    assert again.cluster_id == three.cluster_id


def test_bridge_broker_nodes_3_runs_a_cluster_until_interrupted(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(REPO_ROOT / ".venv" / "bin" / "bridge"), "broker", "--nodes", "3", "--port", "0",
         "--data-dir", str(tmp_path / "cli-cluster")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops" in line:
                break
        found = re.search(r"Kafka (\S+) \(data in", "".join(lines))
        assert found, "".join(lines)
        servers = found.group(1).split(",")
        assert len(servers) == 3
        metadata = AdminClient({"bootstrap.servers": found.group(1)}).list_topics(timeout=10)
        assert sorted(metadata.brokers) == [1, 2, 3]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(90)
    assert code == 0


def test_each_node_advertises_the_proxy_and_keeps_replication_direct(
    cluster: LocalKafkaCluster,
) -> None:
    voters = ",".join(f"{n}@127.0.0.1:{cluster.node(n).controller_port}" for n in cluster.node_ids)
    for node_id in cluster.node_ids:
        node = cluster.node(node_id)
        lines = (node.data_dir / "server.properties").read_text().splitlines()
        props = dict(line.split("=", 1) for line in lines)
        assert props["node.id"] == str(node_id)
        assert props["controller.quorum.voters"] == voters
        assert props["listeners"] == (
            f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port},"
            f"PROXIED://127.0.0.1:{node.proxied_port}"
        )
        assert props["advertised.listeners"] == (
            f"PLAINTEXT://127.0.0.1:{node.port},PROXIED://127.0.0.1:{node.proxied_advertised_port}"
        )
        assert props["inter.broker.listener.name"] == "PLAINTEXT"
        assert props["default.replication.factor"] == "3"
        assert props["min.insync.replicas"] == "2"
        assert node.cluster_id == cluster.cluster_id
    assert cluster.proxy_routes() == [
        (cluster.node(n).proxied_advertised_port, cluster.node(n).proxied_port)
        for n in cluster.node_ids
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"voters": {2: 9000, 3: 9001}}, r"must include this node's id 1"),
        ({"voters": {1: 9000}, "controller_port": 9001}, "differs from this node's voter port"),
        ({"voters": {1: 0}}, "ports 1..65535"),
        ({"cluster_id": "not-a-uuid"}, "cluster_id must be a Kafka Uuid"),
        ({"proxied_port": 9000}, "need proxied=True"),
        ({"node_id": -1}, "node_id must be"),
    ],
)
def test_bad_node_configs_are_typed_errors(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        LocalKafkaConfig(data_dir=tmp_path, **kwargs)


def _sent_when_authorized(config: ClientConfig, msg: Message) -> bool:
    """Send ``msg`` with a new producer; False if a broker that has not applied the ACLs yet
    refused it: the write (``SendAuthorizationError``), or the producer id the idempotent
    producer asks for first (a ``SendError``: librdkafka takes that refusal as fatal, so the
    next try needs a new producer). Nothing is stored then."""
    try:
        with Producer("secured_pg", config=config) as producer:
            producer.send_sync(msg)
    except SendError:
        return False
    return True


def test_a_secured_cluster_serves_sasl_ssl_and_mtls_clients_with_acls(tmp_path: Path) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from bridge.runtime.local_kafka import BROKER_PRINCIPAL

    password = f"alice-{os.urandom(8).hex()}"
    secured = LocalKafkaCluster(
        LocalClusterConfig(
            data_dir=tmp_path / "secured", secured=True, scram_users={"alice": password},
            tls_clients=("carol",),
        )
    )  # fmt: skip
    assert password not in repr(secured.config)
    secured.start()
    try:
        # Every node registered over the mTLS listener the nodes share with the controllers.
        assert secured.registered_node_ids() == (1, 2, 3)
        admin = AdminClient(
            {
                "bootstrap.servers": str(secured.mtls_bootstrap_servers),
                **secured.client_settings(BROKER_PRINCIPAL),
            }
        )
        bindings = [
            AclBinding(
                kind,
                "*",
                ResourcePatternType.LITERAL,
                f"User:{user}",
                "*",
                AclOperation.ALL,
                AclPermissionType.ALLOW,
            )
            for user in ("alice", "carol")
            for kind in (ResourceType.TOPIC, ResourceType.GROUP)
        ]
        for future in admin.create_acls(bindings, request_timeout=30).values():
            future.result()
        await_acls_shown(admin, bindings, 30_000)
        for servers, settings in (
            (secured.bootstrap_servers, secured.client_settings("alice", password)),
            (str(secured.mtls_bootstrap_servers), secured.client_settings("carol")),
        ):
            config = ClientConfig(bootstrap_servers=servers, kafka=settings)
            topic = f"secured-{settings['security.protocol'].lower()}"
            # The brokers apply the ACLs one by one: those it meets may not have them yet.
            wait_until(partial(_sent_when_authorized, config, Message(topic, b"replicated")))
            assert [m.body for m in read_messages(config, [topic], max_messages=1)] == [
                b"replicated"
            ]
            # Replicated three times over the brokers' own mTLS connections.
            assert secured.isr_of(topic, 0) == (1, 2, 3)
    finally:
        secured.stop()
