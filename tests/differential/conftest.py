"""Fixtures of the differential suite: a local Apache RocketMQ (name server + broker, the broker
inside RocketMQ 5's gRPC proxy in local mode, from Maven jars) and the bridge on the session's
Kafka broker with a coordinator, both with the scaled settings of
:mod:`tests.differential.settings`.

RocketMQ starts in the background as soon as the session does, while Kafka starts, since each
takes 10-30 s on two cores. Its start time and memory are printed in the session summary.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
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
    read_messages,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.runtime.rocketmq import LocalRocketMQ, LocalRocketMQConfig
from tests.differential import settings
from tests.differential.bridge_side import BridgeEnv
from tests.differential.lanes import Lanes, Sides, needed
from tests.differential.rocketmq_side import compile_driver

MEASURED: dict[str, Any] = {}
"""RocketMQ's start time (s) and resident memory (bytes), for the session summary."""


class _Starting:
    """RocketMQ starting in a thread; :meth:`ready` waits for it."""

    def __init__(self, data_dir: Path) -> None:
        self.rmq = LocalRocketMQ(
            LocalRocketMQConfig(
                data_dir=data_dir,
                message_delay_level=settings.MESSAGE_DELAY_LEVEL,
                transaction_timeout_ms=settings.TRANSACTION_TIMEOUT_MS,
                transaction_check_interval_ms=settings.CHECK_INTERVAL_MS,
                transaction_check_max=settings.TRANSACTION_CHECK_MAX,
                transaction_op_batch_interval_ms=settings.OP_BATCH_INTERVAL_MS,
                timer_precision_ms=settings.TIMER_PRECISION_MS,
                # SQL92 property filters, and recalling timer messages (both off by default
                # in RocketMQ's broker: RecallMessageProcessor answers NO_PERMISSION).
                broker_properties={"enablePropertyFilter": "true", "recallMessageEnable": "true"},
                # RocketMQ 5's gRPC proxy, in local mode in the broker's JVM, for the rows of
                # RocketMQ 5's client model (SimpleConsumer, FIFO message groups, recall).
                proxy=True,
                proxy_properties=settings.PROXY_PROPERTIES,
            )
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, name="rocketmq-start", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            compile_driver()
            compile_driver(v5=True)
            self.rmq.start()
        except BaseException as exc:  # reported by ready()
            self.error = exc

    def ready(self) -> LocalRocketMQ:
        self.thread.join(300)
        if self.error is not None:
            raise self.error
        if not self.rmq.is_running:
            raise RuntimeError("RocketMQ did not start within 300 s")
        return self.rmq


@pytest.fixture(scope="session", autouse=True)
def _rocketmq_starting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Starting]:
    starting = _Starting(tmp_path_factory.mktemp("rocketmq"))
    try:
        yield starting
    finally:
        starting.thread.join(300)
        rmq = starting.rmq
        if rmq.is_running:
            MEASURED["rss_end"] = rmq.rss_bytes()
        # Killed, not stopped: its data dies with the session, and its broker's clean shutdown
        # took 11-19 s of the suite.
        rmq.kill()


@pytest.fixture(scope="session")
def rocketmq(_rocketmq_starting: _Starting) -> LocalRocketMQ:
    """The running RocketMQ name server and broker."""
    rmq = _rocketmq_starting.ready()
    MEASURED.setdefault("start_s", rmq.start_seconds)
    MEASURED.setdefault("rss_start", rmq.rss_bytes())
    return rmq


@pytest.fixture(scope="session")
def driver_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``user.home`` of the driver JVMs (client logs, broadcasting offsets)."""
    return tmp_path_factory.mktemp("driver-home")


@pytest.fixture(scope="session")
def bridge_env(kafka_bootstrap: str) -> Iterator[BridgeEnv]:
    """The bridge with the scaled settings and a coordinator running for the session."""
    client = ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"diff{uuid.uuid4().hex[:8]}",
        message_delay_level=settings.MESSAGE_DELAY_LEVEL,
        timer_precision_ms=settings.TIMER_PRECISION_MS,
    )
    config = CoordinatorConfig(
        client=client,
        coordinator_id=f"diff-{uuid.uuid4().hex[:6]}",
        transaction_partitions=1,
        transaction_timeout_ms=settings.TRANSACTION_TIMEOUT_MS,
        check_interval_ms=settings.CHECK_INTERVAL_MS,
        transaction_check_max=settings.TRANSACTION_CHECK_MAX,
        session_timeout_ms=6000,
    )
    with Coordinator(config):
        _warm_up(client)
        yield BridgeEnv(client)


@pytest.fixture(scope="session")
def workload_lanes(
    request: pytest.FixtureRequest,
    rocketmq: LocalRocketMQ,
    bridge_env: BridgeEnv,
    driver_home: Path,
) -> Iterator[Lanes]:
    """Every workload the session's tests read, started at once (:mod:`.lanes`)."""
    lanes = Lanes(Sides(rocketmq, bridge_env, driver_home), needed(request.session.items))
    try:
        yield lanes
    finally:
        lanes.close()


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg: Message, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


def _warm_up(client: ClientConfig) -> None:
    """Wait until the coordinator's services own their partitions: a delay level, a timer and a
    committed transaction each reach a warm-up topic."""
    topic = f"diff-warmup-{uuid.uuid4().hex[:8]}"
    with Producer("diff_warmup", config=client) as producer:
        producer.send_sync(Message(topic, b"level", delay_time_level=1))
        timer = Message(topic, b"timer")
        timer.set_delay_time_ms(300)
        producer.send_sync(timer)
    with TransactionMQProducer("diff_warmup_tx", _Commit(), config=client) as tx:
        tx.send_message_in_transaction(Message(topic, b"transaction"))
    got = list(read_messages(client, [topic], max_messages=3, timeout_ms=120_000))
    if len(got) != 3:
        raise RuntimeError(f"the coordinator delivered {len(got)}/3 warm-up messages")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not MEASURED:
        return
    mib = 2**20

    def rss(which: str) -> str:
        values = MEASURED.get(which) or {}
        return ", ".join(f"{name} {value / mib:.0f} MiB" for name, value in values.items())

    terminalreporter.write_sep("-", "Apache RocketMQ (local, from Maven jars)")
    terminalreporter.write_line(f"start (name server + broker): {MEASURED.get('start_s', 0):.1f} s")
    terminalreporter.write_line(f"resident memory after start: {rss('rss_start')}")
    terminalreporter.write_line(f"resident memory at the end: {rss('rss_end')}")
    for name, label in (
        ("tx", "transaction checks"),
        ("level_late", "delay levels 1, 2, 3, clamped: late by (ms)"),
        ("timer_late", "timers 1.5 s, 2 s, 2.7 s: late by (ms)"),
        ("retry_gaps", "retry gaps at levels 3, 4 (ms)"),
        ("suspend_gaps", "orderly retries in place (ms)"),
    ):
        for side, value in (MEASURED.get(name) or {}).items():
            terminalreporter.write_line(f"{label}, {side}: {value}")
    for workload, seconds in (MEASURED.get("row_s") or {}).items():
        terminalreporter.write_line(f"{workload}: both sides ran in {seconds:.0f} s")
    for workload, figure, rocketmq, bridge in MEASURED.get("rows", []):
        terminalreporter.write_line(f"{workload}: {figure}: RocketMQ {rocketmq}, bridge {bridge}")
