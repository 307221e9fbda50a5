"""Bounded waits of the transactional producer: a hung ``check_local_transaction`` never makes
``shutdown()`` wait for ever, whether it runs or waits for room in the check hold."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from bridge.codec import encode_envelope
from bridge.config import ClientConfig
from bridge.kafka.clients import new_producer
from bridge.message import MessageConst, MessageExt
from bridge.transaction import TransactionListener, TransactionMQProducer, TransactionStatus
from bridge.transaction.model import CheckRequest
from tests.conftest import wait_until
from topics.catalog import TopicCatalog

pytestmark = pytest.mark.broker


class _HungCheck(TransactionListener):
    """Answers checks only once ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.checking: list[str] = []

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        self.checking.append(msg.transaction_id or msg.msg_id)
        self.release.wait(120)
        return TransactionStatus.COMMIT


def _write_checks(config: ClientConfig, group: str, transaction_ids: list[str]) -> None:
    """Check requests as the coordinator writes them, all to partition 0 (one order)."""
    topic = TopicCatalog(namespace=config.namespace).check_topic(group)
    producer = new_producer(config, "test-checks")
    for tid in transaction_ids:
        props = {
            MessageConst.TRANSACTION_ID: tid,
            MessageConst.PRODUCER_GROUP: group,
            MessageConst.REAL_TOPIC: "orders",
        }
        envelope = encode_envelope(tid, b"body", props, int(time.time() * 1000), "127.0.0.1")
        request = CheckRequest(tid, tid, 0, 0, 1, envelope)
        producer.produce(topic, request.encode(), key=tid.encode(), partition=0)
    assert producer.flush(10) == 0


def _hold_is_full(producer: TransactionMQProducer) -> bool:
    """Whether every place of the producer's check hold is taken: its check loop then leaves
    further requests in Kafka (its partitions paused) until a place is free."""
    return producer._responder._check_hold._value == 0


def test_shutdown_is_bounded_while_a_check_hangs_and_the_hold_is_full(
    client_config: ClientConfig, unique: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.transaction.producer")
    group = unique("tx").replace("-", "_")
    listener = _HungCheck()
    producer = TransactionMQProducer(
        group, listener, config=client_config, check_request_hold_max=1
    )
    producer.start()
    try:
        _write_checks(client_config, group, ["tid-hung", "tid-waiting"])
        wait_until(lambda: listener.checking == ["tid-hung"], 60)
        check_thread = producer._responder._check_thread
        assert check_thread is not None
        # The hung check holds the only place: the check loop waits for room, its partitions
        # paused, the second request left in Kafka.
        wait_until(lambda: _hold_is_full(producer), 30)

        failures: list[BaseException] = []

        def shut() -> None:
            try:
                producer.shutdown()
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        started = time.monotonic()
        shutting = threading.Thread(target=shut, name="test-shutdown")
        shutting.start()
        shutting.join(20)
        still_waiting = shutting.is_alive()
        elapsed = time.monotonic() - started
    finally:
        listener.release.set()
    assert not still_waiting, "shutdown() still waiting 20 s later, on a hung check"
    assert not failures, failures
    # send_msg_timeout_ms (3 s) for the checks, then as long for pending sends, plus slack.
    assert elapsed < 15, elapsed
    assert check_thread is not None and not check_thread.is_alive()
    abandoned = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert abandoned and "tid-hung" in abandoned[0], caplog.text
    # The hung check finishes later: its answer is dropped (asked again), nothing raises.
    wait_until(lambda: "answered COMMIT after shutdown" in caplog.text, 30)
    assert listener.checking == ["tid-hung"]


def test_shutdown_timeout_is_the_callers_choice(
    client_config: ClientConfig, unique: Any, caplog: pytest.LogCaptureFixture
) -> None:
    group = unique("tx").replace("-", "_")
    listener = _HungCheck()
    producer = TransactionMQProducer(group, listener, config=client_config)
    producer.start()
    try:
        _write_checks(client_config, group, ["tid-1"])
        wait_until(lambda: listener.checking == ["tid-1"], 60)
        started = time.monotonic()
        producer.shutdown(timeout_ms=500)
        elapsed = time.monotonic() - started
    finally:
        listener.release.set()
    assert elapsed < 5, elapsed
    assert "abandoned" in caplog.text and "tid-1" in caplog.text
