"""Property values: text or bytes, their checks, and counts kept as text.

A property value is :data:`PropertyValue`, ``str | bytes`` (binary-safe properties): text is
written as UTF-8 and bytes as they are; a header read back is ``str`` when its bytes are valid
UTF-8 and ``bytes`` otherwise. The checks raise :class:`~bridge.errors.InvalidPropertyError`
naming the property.
"""

from __future__ import annotations

from typing import Final

from bridge.errors import InvalidPropertyError
from topics.properties import RESERVED_PROPERTIES, USER_SETTABLE_PROPERTIES

PropertyValue = str | bytes
"""A property's value: text (UTF-8 on the wire) or bytes (written as they are)."""

_MAX_COUNT_DIGITS: Final = 18
"""Longer counts are refused: 18 digits always fit a signed 64-bit integer."""


def parse_count(raw: PropertyValue | None) -> int | None:
    """A count property (``RECONSUME_TIME``, ``TRANSACTION_CHECK_TIMES``, ...) as an int, or
    None unless ``raw`` is 1 to 18 ASCII digits: missing, empty, signed, spaced, or non-ASCII
    digits such as ``"²"`` (which ``str.isdigit()`` accepts and ``int()`` refuses) give None.
    Pure and cheap."""
    if not raw or len(raw) > _MAX_COUNT_DIGITS or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def property_text(value: PropertyValue) -> str:
    """A property value as text: bytes decode as UTF-8, U+FFFD replacing what is not."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def is_unicode(text: str) -> bool:
    """True if ``text`` can be written as UTF-8, i.e. holds no lone surrogate (such as
    ``"\\ud800"``, which Python strings allow and UTF-8 does not)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate(text: str) -> str:
    """Where the first lone surrogate of ``text`` is, for error messages."""
    for index, char in enumerate(text):
        if 0xD800 <= ord(char) <= 0xDFFF:
            return f"a lone surrogate U+{ord(char):04X} at index {index}"
    return "no lone surrogate"  # pragma: no cover - called for text that has one


def nul_in_name(name: str) -> InvalidPropertyError:
    """The error for a property name holding NUL. librdkafka takes header names as C strings
    and cuts them at the first NUL, so ``"UNIQ_KEY\\x00"`` would travel as a second
    ``UNIQ_KEY`` (past the reserved-name check) and ``"a\\x00b"`` as ``"a"``."""
    return InvalidPropertyError(
        f"the property name {name!r} contains NUL (\\x00): a Kafka header name ends at the "
        "first NUL, so it would travel as another name"
    )


def check_property_name(name: object) -> str:
    """``name`` if it is a non-empty string that is valid Unicode without NUL, else
    :class:`InvalidPropertyError`."""
    if not isinstance(name, str) or not name:
        raise InvalidPropertyError(f"a property name must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise nul_in_name(name)
    if not is_unicode(name):
        raise InvalidPropertyError(
            f"the property name {name!r} is not valid Unicode text ({lone_surrogate(name)})"
        )
    return name


def check_property_value(name: str, value: object) -> PropertyValue:
    """``value`` as a property value: text that is valid Unicode, or bytes (a bytearray or
    memoryview is copied to bytes)."""
    if isinstance(value, str):
        if not is_unicode(value):
            raise InvalidPropertyError(
                f"property {name!r} is not valid Unicode text ({lone_surrogate(value)}); "
                "pass bytes for a binary value"
            )
        return value
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidPropertyError(
        f"property {name!r} must have a string value or bytes, got {type(value).__name__}"
    )


def check_user_property(name: object, value: object) -> PropertyValue:
    """``value`` checked as the value of user property ``name``: a name that is not reserved,
    text for the system names users may set, else :func:`check_property_value`."""
    checked = check_property_name(name)
    if checked in RESERVED_PROPERTIES:
        raise InvalidPropertyError(
            f"the property {checked!r} is used by the system; choose another name"
        )
    if checked in USER_SETTABLE_PROPERTIES and not isinstance(value, str):
        raise InvalidPropertyError(
            f"property {checked!r} must have a string value, got {type(value).__name__}"
        )
    return check_property_value(checked, value)
