"""What every settings dataclass shares: one validator for numbers and one reader of the
environment.

Settings are frozen dataclasses validated in ``__post_init__`` with :func:`require_int` and
:func:`require_number`, and read from the environment with :func:`env_values`, which converts
each value to its field's type as ``typing.get_type_hints`` resolves it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

from bridge.errors import InvalidArgumentError


def require_int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> None:
    """Raise :class:`InvalidArgumentError` naming ``name`` unless ``value`` is an ``int`` (not a
    ``bool``) between ``minimum`` and ``maximum`` (inclusive; no upper bound when None)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        bound = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise InvalidArgumentError(f"{name} must be {bound}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum}, got {value}")


def require_number(name: str, value: object) -> None:
    """Raise :class:`InvalidArgumentError` naming ``name`` unless ``value`` is a positive
    finite ``int`` or ``float`` (not a ``bool``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive finite number, got {value}")


_PARSERS: Mapping[object, Callable[[str], object]] = {int: int, float: float, str: str}


def env_values(
    cls: type[Any],
    environ: Mapping[str, str],
    env_name: Callable[[str], str],
    *,
    skip: Collection[str] = (),
) -> dict[str, object]:
    """The fields of dataclass ``cls`` set in ``environ``: field ``f`` is read from
    ``env_name(f)``, converted to the field's type (``int``, ``float`` or ``str``, resolved
    with ``typing.get_type_hints``). Unset or empty variables and the fields in ``skip`` are
    left out; a value that does not convert raises :class:`InvalidArgumentError` naming the
    variable."""
    hints = typing.get_type_hints(cls)
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        key = env_name(f.name)
        raw = environ.get(key)
        if not raw:
            continue
        parse = _PARSERS.get(hints[f.name])
        if parse is None:
            raise TypeError(f"{cls.__name__}.{f.name}: no environment form for {hints[f.name]}")
        try:
            values[f.name] = parse(raw)
        except ValueError:
            kind = "an integer" if parse is int else "a number"
            raise InvalidArgumentError(f"{key} must be {kind}, got {raw!r}") from None
    return values
