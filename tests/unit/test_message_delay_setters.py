"""The rules of ``Message``'s delay setters: a delay level is an ``int`` and nothing else; a
timer is an ``int``, or a finite float rounded up to a whole unit (never early). Anything else
(a ``bool``, ``nan``, an infinity, text, None) is an ``InvalidDelayError`` naming the setter,
and the message is left as it was."""

from __future__ import annotations

import enum
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.errors import InvalidDelayError, InvalidMessageError
from bridge.message import Message, MessageConst

TIMER_SETTERS = {
    "set_deliver_time_ms": MessageConst.TIMER_DELIVER_MS,
    "set_delay_time_ms": MessageConst.TIMER_DELAY_MS,
    "set_delay_time_sec": MessageConst.TIMER_DELAY_SEC,
}
SETTERS = [*TIMER_SETTERS, "set_delay_time_level"]


@pytest.mark.parametrize("setter", SETTERS)
@pytest.mark.parametrize("value", [True, False, math.nan, math.inf, -math.inf, "5", None])
def test_a_delay_that_is_no_number_is_refused_and_changes_nothing(
    setter: str, value: object
) -> None:
    msg = Message("orders", b"x")
    with pytest.raises(InvalidDelayError, match=rf"^{setter} needs an integer") as raised:
        getattr(msg, setter)(value)
    assert isinstance(raised.value, InvalidMessageError)  # what the level setter raised before
    assert msg.properties == {}
    assert not msg.is_delayed


@pytest.mark.parametrize("value", [1.9, 1.0, 0.5])
def test_a_level_is_an_int_not_a_float(value: float) -> None:
    msg = Message("orders", b"x")
    with pytest.raises(InvalidDelayError, match=r"^set_delay_time_level needs an integer"):
        msg.set_delay_time_level(value)  # type: ignore[arg-type]
    assert msg.properties == {}


not_numbers = st.one_of(
    st.booleans(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.text(max_size=12),
    st.none(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.binary(max_size=4),
)


@given(value=not_numbers, setter=st.sampled_from(SETTERS))
def test_no_value_but_a_number_is_taken_by_any_delay_setter(value: object, setter: str) -> None:
    msg = Message("orders", b"x", delay_time_level=2)
    before = dict(msg.properties)
    with pytest.raises(InvalidDelayError, match=setter):
        getattr(msg, setter)(value)
    assert msg.properties == before


@given(
    value=st.floats(allow_nan=False, allow_infinity=False),
    setter=st.sampled_from(list(TIMER_SETTERS)),
)
def test_a_finite_float_timer_is_rounded_up_never_early(value: float, setter: str) -> None:
    msg = Message("orders", b"x")
    getattr(msg, setter)(value)
    stored = int(msg.properties[TIMER_SETTERS[setter]])
    assert stored - 1 < value <= stored  # exact: Python compares int and float exactly


@given(value=st.integers(), setter=st.sampled_from(list(TIMER_SETTERS)))
def test_every_int_is_taken_by_the_timer_setters_as_it_is(value: int, setter: str) -> None:
    msg = Message("orders", b"x")
    getattr(msg, setter)(value)
    assert msg.properties == {TIMER_SETTERS[setter]: str(value)}


@given(level=st.integers())
def test_every_int_is_a_delay_level_and_zero_or_below_is_none(level: int) -> None:
    msg = Message("orders", b"x")
    msg.set_delay_time_level(level)
    assert msg.delay_time_level == (level if 0 < level < 10**18 else 0)
    assert msg.get_property(MessageConst.DELAY_TIME_LEVEL) == (str(level) if level > 0 else None)


class Level(enum.IntEnum):
    SHORT = 3


@pytest.mark.parametrize("setter", SETTERS)
def test_an_int_subclass_is_taken_as_its_plain_number(setter: str) -> None:
    msg = Message("orders", b"x")
    getattr(msg, setter)(Level.SHORT)
    assert list(msg.properties.values()) == ["3"]


def test_the_constructor_takes_the_level_by_the_same_rule() -> None:
    with pytest.raises(InvalidDelayError, match="set_delay_time_level needs an integer"):
        Message("orders", b"x", delay_time_level=True)
    with pytest.raises(InvalidDelayError, match="set_delay_time_level needs an integer"):
        Message("orders", b"x", delay_time_level=1.5)  # type: ignore[arg-type]
    assert Message("orders", b"x", delay_time_level=3).delay_time_level == 3
