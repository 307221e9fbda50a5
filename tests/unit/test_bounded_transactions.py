"""BoundedTransactions: transaction calls run on one thread kept per producer, return by their
timeout, and a producer whose call never returns is given up.

The producer is a real confluent-kafka ``Producer`` (pointed at no broker) whose transaction
methods are replaced by the test, as librdkafka behaves when its coordinator is lost."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from bridge.kafka import transactional
from bridge.kafka.transactional import BoundedTransactions
from tests.conftest import wait_until


class _Scripted(Producer):
    """Transaction calls that note their thread, hang while ``hang`` is set, or raise."""

    def __init__(self) -> None:
        super().__init__({"bootstrap.servers": "127.0.0.1:9", "client.id": "bounded-test"})
        self.threads: list[threading.Thread] = []
        self.hang: threading.Event | None = None
        self.raises: KafkaException | None = None

    def _call(self) -> None:
        self.threads.append(threading.current_thread())
        if self.hang is not None:
            self.hang.wait()
        if self.raises is not None:
            raise self.raises

    def init_transactions(self, *args: Any) -> None:
        self._call()

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._call()

    def commit_transaction(self, *args: Any) -> None:
        self._call()

    def abort_transaction(self, *args: Any) -> None:
        self._call()


@pytest.fixture()
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


def _workers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"{name}-txn"]


def test_every_transaction_call_runs_on_one_thread_kept_for_the_producer() -> None:
    producer = _Scripted()
    bounded = BoundedTransactions(producer, "one-thread")
    bounded.init_transactions(1)
    for _ in range(20):
        bounded.send_offsets_to_transaction([], None, 1)
        bounded.commit_transaction(1)
    bounded.abort_transaction(1)
    assert len(producer.threads) == 42
    assert len(set(producer.threads)) == 1, "a thread per call"
    assert producer.threads[0] is not threading.current_thread()
    assert len(_workers("one-thread")) == 1


def test_a_call_that_raises_raises_in_the_caller() -> None:
    producer = _Scripted()
    bounded = BoundedTransactions(producer, "raises")
    producer.raises = KafkaException(KafkaError(KafkaError._STATE, "not in a transaction"))
    with pytest.raises(KafkaException) as raised:
        bounded.commit_transaction(1)
    assert raised.value.args[0].code() == KafkaError._STATE
    producer.raises = None
    bounded.commit_transaction(1)  # the thread survives a failed call
    assert bounded.wedged is None


def test_a_call_that_never_returns_gives_the_producer_up(
    monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    monkeypatch.setattr(transactional, "WATCHDOG_GRACE_S", 0.2)
    producer = _Scripted()
    bounded = BoundedTransactions(producer, "wedges")
    producer.hang = release
    with pytest.raises(KafkaException) as raised:
        bounded.send_offsets_to_transaction([], None, 0.1)
    error = raised.value.args[0]
    assert error.code() == KafkaError._TIMED_OUT and error.fatal()
    assert bounded.wedged == "send_offsets_to_transaction"
    stuck = transactional._stuck_calls
    assert stuck >= 1
    # Every later call fails at once, without reaching the producer.
    with pytest.raises(KafkaException):
        bounded.commit_transaction(5)
    with pytest.raises(KafkaException):
        bounded.begin_transaction()
    assert len(producer.threads) == 1
    release.set()
    wait_until(lambda: transactional._stuck_calls == stuck - 1, 5)


def test_the_thread_ends_once_its_producer_is_dropped() -> None:
    bounded = BoundedTransactions(_Scripted(), "dropped")
    bounded.commit_transaction(1)
    (worker,) = _workers("dropped")
    del bounded
    gc.collect()
    wait_until(lambda: not worker.is_alive(), 5)


def test_a_given_up_call_keeps_its_producer_until_it_returns(
    monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    monkeypatch.setattr(transactional, "WATCHDOG_GRACE_S", 0.1)
    producer = _Scripted()
    producer.hang = release
    bounded = BoundedTransactions(producer, "kept")
    with pytest.raises(KafkaException):
        bounded.commit_transaction(0.1)
    (worker,) = _workers("kept")
    del bounded, producer
    gc.collect()
    assert worker.is_alive()  # still in the call: the producer is not destroyed under it
    release.set()
    wait_until(lambda: not worker.is_alive(), 5)
