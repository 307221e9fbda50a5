"""Java's values in RocketMQ's SQL92 filter: the types an expression's values carry (an
``int`` is an ``Integer``, :class:`Long` a ``Long``, ``float`` a ``Double``), the conversions
``Integer.valueOf``, ``Long.valueOf``, ``Double.valueOf`` and ``Boolean.valueOf`` as Java
makes them, and ``ComparisonExpression``'s promotions and comparison. Pure functions; what
Java would throw is :class:`EvaluationError` (the message does not match)."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any, Final, TypeAlias

PropertyLookup: TypeAlias = Callable[[str], "str | bytes | None"]
"""A message's property by name: text, bytes (not UTF-8: read as RocketMQ's broker would
decode them, with U+FFFD for what is not UTF-8) or None when missing."""


class Long(int):
    """A Java ``Long`` (a plain ``int`` is an ``Integer``)."""

    __slots__ = ()


Value: TypeAlias = "int | float | str | bool | None"
Eval: TypeAlias = Callable[[PropertyLookup], Value]


class EvaluationError(Exception):
    """What RocketMQ's evaluation throws (a NumberFormatException, a ClassCastException): the
    message does not match."""


INT32: Final = 1 << 31
INT64: Final = 1 << 63
_JAVA_INTEGER: Final = re.compile(r"[+-]?(\d+)")
"""``Integer.valueOf``/``Long.valueOf``: a sign, then decimal digits of any script
(``Character.digit``; ``\\d`` on text is Unicode's decimal digits too), nothing else."""
_JAVA_DOUBLE: Final = re.compile(
    r"[+-]?(?:NaN|Infinity"
    r"|(?P<dec>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+)[fFdD]?)",
    re.ASCII,
)
"""``Double.valueOf`` (after trimming): ASCII digits only, an optional type suffix, ``NaN``,
``Infinity`` and hexadecimal floats. Python's ``float`` accepts more (``inf``, ``1_0``,
other scripts' digits), so it only ever sees text this accepted. No two parts may match the
same digits (``\\d+\\.?\\d*`` could split a run of digits anywhere): property values come from
producers, and a long run of digits that does not match must fail in linear time."""
_JAVA_TRIM: Final = "".join(map(chr, range(0x21)))
"""``String.trim`` removes every character up to U+0020 at both ends."""


def _java_integer(text: str, bits: int) -> int:
    """``Integer.valueOf`` (``bits`` 32) or ``Long.valueOf`` (64) of ``text``."""
    match = _JAVA_INTEGER.fullmatch(text)
    if match is None:
        raise EvaluationError(f"not an integer: {text!r}")
    digits = match.group(1)
    if len(digits) > 20:  # int() refuses very long text; leading zeros are no value
        first = next((i for i, c in enumerate(digits) if unicodedata.digit(c) != 0), None)
        if first is None:
            return 0
        if len(digits) - first > 20:
            raise EvaluationError(f"out of range: {text!r}")
        text = text[: match.start(1)] + digits[first:]
    value = int(text)
    limit = INT32 if bits == 32 else INT64
    if not -limit <= value < limit:
        raise EvaluationError(f"out of range: {text!r}")
    return value if bits == 32 else Long(value)


def java_double(text: str) -> float:
    """``Double.valueOf(text)``."""
    trimmed = text.strip(_JAVA_TRIM)
    match = _JAVA_DOUBLE.fullmatch(trimmed)
    if match is None:
        raise EvaluationError(f"not a number: {text!r}")
    negative = trimmed.startswith("-")
    if match.group("dec") is not None:
        value = float(match.group("dec"))
    elif match.group("hex") is not None:
        try:
            value = float.fromhex(match.group("hex"))
        except OverflowError:
            value = math.inf
    else:
        value = math.nan if "N" in trimmed else math.inf
    return -value if negative else value


def _java_boolean(text: str) -> bool:
    """``Boolean.valueOf(text)``: true for "true" in any case, false for anything else."""
    return len(text) == 4 and text.isascii() and text.lower() == "true"


def compare_doubles(a: float, b: float) -> int:
    """``Double.compare``: NaN above everything and equal to itself, -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b  # noqa: PLR0124 - NaN is the one value unequal to itself
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    a_sign, b_sign = math.copysign(1.0, a), math.copysign(1.0, b)
    return (a_sign > b_sign) - (a_sign < b_sign)


def _raise_boolean_string(left: Value, right: Value) -> tuple[Value, Value]:
    raise EvaluationError("a boolean compared with a string")  # Java's ClassCastException


_PROMOTIONS: Final[dict[tuple[type, type], Callable[[Any, Any], tuple[Value, Value]]]] = {
    (int, Long): lambda left, right: (Long(left), right),
    (int, float): lambda left, right: (float(left), right),
    (int, str): lambda left, right: (left, _java_integer(right, 32)),
    (Long, int): lambda left, right: (left, Long(right)),
    (Long, float): lambda left, right: (float(left), right),
    (Long, str): lambda left, right: (left, _java_integer(right, 64)),
    (float, int): lambda left, right: (left, float(right)),
    (float, Long): lambda left, right: (left, float(right)),
    (float, str): lambda left, right: (left, java_double(right)),
    (str, bool): lambda left, right: (_java_boolean(left), right),
    (str, int): lambda left, right: (_java_integer(left, 32), right),
    (str, Long): lambda left, right: (_java_integer(left, 64), right),
    (str, float): lambda left, right: (java_double(left), right),
    # RocketMQ casts the Boolean on the left to a String.
    (bool, str): _raise_boolean_string,
}
"""``ComparisonExpression.__compare``'s promotions (string conversion on, as RocketMQ's parser
sets it), by (left type, right type): to the right's type, a number to the wider one, text
parsed as the number's type. Pairs not listed cannot be compared: -1."""


def compare(left: Value, right: Value) -> int:
    """``ComparisonExpression.__compare``: the operands promoted to one type, then compared
    as Java's ``compareTo`` does; -1 when they cannot be promoted."""
    if type(left) is not type(right):
        promote = _PROMOTIONS.get((type(left), type(right)))
        if promote is None:
            return -1
        left, right = promote(left, right)
    if type(left) is float:
        return compare_doubles(left, right)  # type: ignore[arg-type]
    if type(left) is str:
        # Only '=' compares text (an ordering reads both as numbers first), so equality is all
        # of String.compareTo that shows.
        return 0 if left == right else 1
    return (left > right) - (left < right)  # type: ignore[operator]


def negate(value: Value) -> Value:
    """``-value``: null unless a number; Integer and Long wrap around as in Java."""
    kind = type(value)
    if kind is int:
        return (-value + INT32) % (2 * INT32) - INT32  # type: ignore[operator]
    if kind is Long:
        return Long((-value + INT64) % (2 * INT64) - INT64)  # type: ignore[operator]
    if kind is float:
        return -value  # type: ignore[operator]
    return None
