"""What a delay service counts as a record's own fault: only what the codec raises for bytes
or headers it cannot decode (and a target or delay it cannot honour) quarantines the record.
A fault of the code (a ``TypeError``, say) fails the pass loudly instead: the service rewinds
and reads the records again, so no good record is quarantined for it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bridge import ClientConfig, Message
from bridge.coordinator.delay import records as records_module
from bridge.coordinator.delay.fetch import Held
from bridge.coordinator.delay.service import TimerService, timer_exit_ms
from bridge.delay.routing import delayed_record
from bridge.kafka.service import ServiceConfig
from topics.catalog import SystemTopic

BORN = int(time.time() * 1000)
DELIVER = BORN + 3_600_000
NOW = DELIVER + 10_000
"""When the timers below are handled, epoch ms: after their delivery time."""
CONFIG = ClientConfig(bootstrap_servers="localhost:1", namespace="bad-data")


class _Record:
    """A consumed record of the timer topic, as the service reads it."""

    def __init__(self, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> None:
        self._value, self._headers = value, headers

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return None

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers

    def topic(self) -> str:
        return CONFIG.catalog().topic(SystemTopic.TIMER)

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def timestamp(self) -> tuple[int, int]:
        return (2, BORN)


def _service() -> TimerService:
    return TimerService(ServiceConfig(CONFIG, CONFIG.catalog(), "unit"))


def _due_timer() -> Held:
    msg = Message("orders", b"body")
    msg.set_deliver_time_ms(DELIVER)
    record = delayed_record(msg, "ID-1", BORN, "10.0.0.1", partition=0, config=CONFIG)
    assert record is not None
    return Held(_Record(record.value, list(record.headers)), 0, 7, list(record.headers), None)


def test_a_record_the_codec_cannot_decode_is_quarantined() -> None:
    service = _service()
    held = Held(_Record(b"\x00not an envelope", []), 0, 7, [], None)
    unit = service.isolation.unit(held, NOW)
    assert unit.record is not None
    assert unit.record.kafka_topic == CONFIG.catalog().topic(SystemTopic.QUARANTINE)


def test_a_due_timer_becomes_its_delivery() -> None:
    record, real = _service().process(_due_timer(), NOW)
    assert (record.kafka_topic, real) == ("orders", True)


@pytest.mark.parametrize("fault", [TypeError, SystemError, ZeroDivisionError, ValueError])
def test_a_fault_of_the_code_fails_loudly_and_quarantines_nothing(
    fault: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise fault("a fault of the code")

    monkeypatch.setattr(records_module, "header_delivery_record", broken)
    with pytest.raises(fault, match="a fault of the code"):
        _service().isolation.unit(_due_timer(), NOW)


def test_a_fault_of_the_code_reading_a_timers_time_is_not_taken_for_a_malformed_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a fault of the code")

    monkeypatch.setattr(records_module, "last_message_header", broken)
    with pytest.raises(TypeError, match="a fault of the code"):
        timer_exit_ms(CONFIG.delay_policy, _due_timer())
