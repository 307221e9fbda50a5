"""A Kafka transaction call that never returns holds no coordinator service for ever.

librdkafka's ``send_offsets_to_transaction`` can block past its timeout once its coordinator
is lost (confluentinc/librdkafka#5456, #5511); the fault suite's dropped-connection nemesis
left all three services of a coordinator stuck there, and every delayed and committed message
with them. Here the first such call of each service's producer blocks until the test ends (one
method of the real client wrapped, as the bug behaves), and the first replacements cannot
start either; everything must still arrive, once, through the real broker.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest

from bridge import (
    Message,
    MessageExt,
    Producer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.coordinator import Coordinator
from bridge.kafka import clients
from tests.integration.test_delay_isolation import isolation_config, warm_up
from tests.integration.test_delays import coordinator_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


class _Hangs:
    """Which producers hang their next ``send_offsets_to_transaction``, and the release."""

    def __init__(self) -> None:
        self.made: list[Any] = []
        self.armed: set[int] = set()
        self.hung: list[int] = []
        self.failed_inits = 0
        self.inits_to_fail = 0
        self.release = threading.Event()
        self.lock = threading.Lock()

    def arm(self) -> None:
        """Every producer made so far hangs in its next call (once)."""
        with self.lock:
            self.armed = {id(p) for p in self.made}
            self.inits_to_fail = 3  # the first replacements cannot start either


@pytest.fixture()
def hangs(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hangs]:
    state = _Hangs()

    class HangingProducer(confluent_kafka.Producer):
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            with state.lock:
                state.made.append(self)

        def init_transactions(self, *args: Any) -> Any:
            with state.lock:
                fail = state.inits_to_fail > 0
                if fail:
                    state.inits_to_fail -= 1
                    state.failed_inits += 1
            if fail:  # the coordinator is still unreachable
                raise confluent_kafka.KafkaException(
                    confluent_kafka.KafkaError(confluent_kafka.KafkaError._TIMED_OUT, "timed out")
                )
            return super().init_transactions(*args)

        def send_offsets_to_transaction(self, *args: Any) -> Any:
            with state.lock:
                hang = id(self) in state.armed
                state.armed.discard(id(self))
                if hang:
                    state.hung.append(id(self))
            if hang:
                state.release.wait()  # as librdkafka#5456: no return, whatever the timeout
            return super().send_offsets_to_transaction(*args)

    monkeypatch.setattr(clients, "Producer", HangingProducer)
    try:
        yield state
    finally:
        state.release.set()


class Commit(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


@pytest.mark.check("G11")
def test_a_transaction_call_that_never_returns_stalls_no_service(
    hangs: _Hangs, kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    base = isolation_config(kafka_bootstrap, namespace)
    # Each Kafka call is bounded by 2 s: a hung one is given up after that plus the grace.
    config = dataclasses.replace(base, request_timeout_ms=2000)
    with Coordinator(coordinator_config(config, "wedged")):
        warm_up(config, f"{topic}-warm")
        with TransactionMQProducer("wedged-tx", Commit(), config=config) as tx:
            tx.send_message_in_transaction(Message(f"{topic}-warm", b"tx-warm"), None)
            warm = read_messages(config, [f"{topic}-warm"], max_messages=3, timeout_ms=20_000)
            assert len(list(warm)) == 3
            hangs.arm()
            expected = []
            with Producer("wedged-pg", config=config) as producer:
                for i in range(3):
                    producer.send_sync(Message(topic, f"level-{i}", delay_time_level=1))
                    timer = Message(topic, f"timer-{i}")
                    timer.set_delay_time_ms(300)
                    producer.send_sync(timer)
                    tx.send_message_in_transaction(Message(topic, f"tx-{i}"), None)
                    expected += [f"level-{i}", f"timer-{i}", f"tx-{i}"]
            got = [
                m.body.decode()
                for m in read_messages(
                    config, [topic], max_messages=len(expected), timeout_ms=45_000
                )
            ]
            assert sorted(got) == sorted(expected), f"delivered: {sorted(got)}"
            # Nothing more comes later: each was delivered once.
            assert len(list(read_messages(config, [topic], timeout_ms=3000))) == len(expected)
    # The schedule, timer and transaction services each hung once and got over it, through
    # replacements that failed at first.
    assert len(hangs.hung) >= 3, hangs.hung
    assert hangs.failed_inits == 3
