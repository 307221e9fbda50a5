"""A property name holding NUL is refused wherever a name is taken.

librdkafka takes a header name as a C string and cuts it at the first NUL: accepted, the name
``"UNIQ_KEY\\x00"`` would travel as a second ``UNIQ_KEY`` (past the reserved-name check, so a
consumer reads the spoofed message id), ``"TAGS\\x00x"`` as a second ``TAGS``, and ``"a\\x00b"``
as ``"a"``. A NUL in a value is fine: header values are length-delimited.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge import Message
from bridge.errors import InvalidPropertyError
from bridge.property_values import check_property_name, check_user_property
from topics.properties import RESERVED_PROPERTIES, USER_SETTABLE_PROPERTIES

PROBED_NAMES = ["UNIQ_KEY\x00", "TAGS\x00x", "a\x00b", "\x00", "REAL_TOPIC\x00", "k\x00\x00"]

_texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
names_with_nul = st.builds(
    lambda before, after: f"{before}\x00{after}",
    st.one_of(_texts, st.sampled_from(sorted(RESERVED_PROPERTIES))),
    _texts,
)
values = st.one_of(_texts, st.binary(max_size=20))


@pytest.mark.parametrize("name", PROBED_NAMES)
def test_put_user_property_refuses_a_name_with_nul(name: str) -> None:
    msg = Message("t", b"x", tags="real-tag")

    with pytest.raises(InvalidPropertyError, match=r"contains NUL"):
        msg.put_user_property(name, "spoofed")

    assert msg.properties == {}
    assert msg.tags == "real-tag"


@pytest.mark.parametrize("name", PROBED_NAMES)
def test_every_way_to_name_a_property_refuses_nul(name: str) -> None:
    with pytest.raises(InvalidPropertyError, match=r"contains NUL"):
        Message("t", b"x", properties={name: "spoofed"})
    with pytest.raises(InvalidPropertyError, match=r"contains NUL"):
        Message("t", b"x").set_property(name, "spoofed")
    with pytest.raises(InvalidPropertyError, match=r"contains NUL"):
        check_property_name(name)


@given(name=names_with_nul, value=values)
def test_no_name_with_nul_is_taken(name: str, value: str | bytes) -> None:
    """Whatever surrounds the NUL (a reserved name before it, say) and whatever the value."""
    msg = Message("t", b"x")
    with pytest.raises(InvalidPropertyError, match=r"contains NUL"):
        msg.put_user_property(name, value)
    with pytest.raises(InvalidPropertyError, match=r"contains NUL"):
        check_user_property(name, value)
    assert msg.properties == {}


@given(
    name=_texts.filter(
        lambda n: (
            bool(n)
            and n not in RESERVED_PROPERTIES
            and n not in USER_SETTABLE_PROPERTIES
            and "\x00" not in n
        )
    ),
    value=st.one_of(
        _texts.map(lambda v: f"{v}\x00"), st.binary(max_size=20).map(lambda v: v + b"\x00")
    ),
)
def test_a_value_with_nul_is_kept(name: str, value: str | bytes) -> None:
    msg = Message("t", b"x")
    msg.put_user_property(name, value)
    assert msg.get_property(name) == value
