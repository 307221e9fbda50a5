"""A coordinator service whose consumer stays out of its group is renewed
(``TransactionalService.check_membership``), and renewals are counted per service.

What it promises: once a service's consumer has been a member of its group, a member id
missing for 5 session timeouts (at least 30 s) raises :class:`MembershipLostError`, which the
coordinator answers with a fresh service; a consumer that never joined is left to join; one
service's renewals do not use up another's.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.config import ClientConfig
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.coordinator import RENEWALS_ALLOWED
from bridge.coordinator.delay.service import TimerService
from bridge.kafka.service import MembershipLostError, ServiceConfig


class Member:
    """A consumer's member id as the test sets it (``""``: out of the group)."""

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id

    def memberid(self) -> str:
        return self.member_id


def _service(session_timeout_ms: int) -> tuple[TimerService, Member]:
    client = ClientConfig(bootstrap_servers="localhost:1", namespace="watchdog")
    service = TimerService(
        ServiceConfig(client, client.catalog(), "unit", session_timeout_ms=session_timeout_ms)
    )
    member = Member("m-1")
    consumer: Any = member
    service._consumer = consumer
    return service, member


def test_a_consumer_out_of_its_group_for_five_session_timeouts_is_renewed() -> None:
    service, member = _service(session_timeout_ms=10_000)  # 5 x 10 s = 50 s
    service.check_membership(0.0)  # in the group
    member.member_id = ""  # a session timed out
    service.check_membership(10.0)  # seen out from here
    service.check_membership(59.0)  # 49 s out: still waits
    with pytest.raises(MembershipLostError, match="not rejoined"):
        service.check_membership(60.0)


def test_the_wait_is_at_least_30_s() -> None:
    service, member = _service(session_timeout_ms=2000)  # 5 x 2 s = 10 s, raised to 30 s
    service.check_membership(0.0)
    member.member_id = ""
    service.check_membership(1.0)
    service.check_membership(30.0)
    with pytest.raises(MembershipLostError):
        service.check_membership(31.0)


def test_a_consumer_back_in_its_group_starts_the_count_again() -> None:
    service, member = _service(session_timeout_ms=10_000)
    service.check_membership(0.0)
    member.member_id = ""
    service.check_membership(1.0)
    member.member_id = "m-2"  # rejoined
    service.check_membership(40.0)
    member.member_id = ""
    service.check_membership(50.0)
    service.check_membership(99.0)  # 49 s since it left the second time
    with pytest.raises(MembershipLostError):
        service.check_membership(100.0)


def test_a_consumer_that_never_joined_is_left_to_join() -> None:
    service, member = _service(session_timeout_ms=10_000)
    member.member_id = ""  # a broker down since the start
    for now in (0.0, 100.0, 1000.0, 10_000.0):
        service.check_membership(now)


def test_it_looks_at_most_once_a_second() -> None:
    service, member = _service(session_timeout_ms=2000)
    service.check_membership(0.0)
    member.member_id = ""
    service.check_membership(0.5)  # not looked at: 0.5 s after the last look
    service.check_membership(1.0)  # out from here
    service.check_membership(30.5)  # 29.5 s out
    service.check_membership(31.0)  # 30 s out, but not looked at: 0.5 s after the last look
    with pytest.raises(MembershipLostError):
        service.check_membership(31.5)


def test_renewals_are_counted_per_service() -> None:
    client = ClientConfig(bootstrap_servers="localhost:1", namespace="watchdog")
    coordinator = Coordinator(CoordinatorConfig(client=client, coordinator_id="c"), services=[])
    for _ in range(RENEWALS_ALLOWED):
        assert coordinator._renewal_allowed("bridge-timer-c")
    assert not coordinator._renewal_allowed("bridge-timer-c")
    # A broker restart costs each service its membership: the others still have theirs.
    assert coordinator._renewal_allowed("bridge-schedule-c")
    assert coordinator._renewal_allowed("bridge-transaction-c")
