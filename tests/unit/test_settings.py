"""The settings helpers: one validator for numbers, one reader of the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from bridge.errors import InvalidArgumentError
from bridge.settings import env_values, require_int, require_number


@pytest.mark.parametrize(
    ("value", "minimum", "maximum", "message"),
    [
        (True, 1, None, "n must be an integer, got True"),
        (1.0, 1, None, "n must be an integer, got 1.0"),
        ("3", 1, None, "n must be an integer, got '3'"),
        (0, 1, None, "n must be positive, got 0"),
        (-1, 0, None, "n must be non-negative, got -1"),
        (-2, -1, None, "n must be at least -1, got -2"),
        (11, 1, 10, "n must be at most 10, got 11"),
    ],
)
def test_require_int_names_the_setting_and_the_bound(
    value: object, minimum: int, maximum: int | None, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        require_int("n", value, minimum=minimum, maximum=maximum)
    assert str(raised.value) == message


def test_require_int_accepts_the_bounds() -> None:
    require_int("n", 1)
    require_int("n", 0, minimum=0)
    require_int("n", 10, maximum=10)


@pytest.mark.parametrize("value", [0, -1.5, float("nan"), float("inf"), True, "1"])
def test_require_number_refuses_what_is_not_a_positive_finite_number(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^t must be a"):
        require_number("t", value)


def test_require_number_accepts_fractions() -> None:
    require_number("t", 0.05)
    require_number("t", 15)


@dataclass(frozen=True)
class _Sample:
    name: str = "a"
    count: int = 1
    ratio: float = 0.5
    extra: Mapping[str, str] = field(default_factory=dict)


def _env_name(name: str) -> str:
    return "X_" + name.upper()


def test_env_values_converts_to_each_fields_resolved_type() -> None:
    env = {"X_NAME": "b", "X_COUNT": "7", "X_RATIO": "0.25", "X_EXTRA": "ignored", "X_OTHER": "1"}
    values = env_values(_Sample, env, _env_name, skip=("extra",))
    assert values == {"name": "b", "count": 7, "ratio": 0.25}
    assert type(values["count"]) is int


def test_env_values_leaves_out_unset_and_empty_variables() -> None:
    assert env_values(_Sample, {"X_COUNT": ""}, _env_name, skip=("extra",)) == {}


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("X_COUNT", "seven", "X_COUNT must be an integer, got 'seven'"),
        ("X_RATIO", "half", "X_RATIO must be a number, got 'half'"),
    ],
)
def test_env_values_names_the_variable_that_does_not_convert(
    variable: str, raw: str, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        env_values(_Sample, {variable: raw}, _env_name, skip=("extra",))
    assert str(raised.value) == message


def test_env_values_refuses_a_field_with_no_environment_form() -> None:
    with pytest.raises(TypeError, match=r"_Sample\.extra"):
        env_values(_Sample, {"X_EXTRA": "a=b"}, _env_name)
