"""What every settings dataclass shares: one validator for numbers and one reader of the
environment.

Settings are frozen dataclasses validated in ``__post_init__`` with :func:`require_int` and
:func:`require_number`, and read from the environment with :func:`env_values`, which converts
each value to its field's type as ``typing.get_type_hints`` resolves it. Each field, and each
constant naming an environment variable, has a docstring (the string right after it), which
:func:`attribute_docs` reads: the configuration reference of the documentation is built from
them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import textwrap
import typing
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import Any, Final

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


OTHER_ENVIRONMENT: Final = (
    "topics.client_security:ENV_KAFKA_PREFIX",
    "bridge.observability.server:ENV_METRICS_HOST",
    "bridge.runtime.jars:ENV_CACHE_DIR",
    "bridge.cli.broker:ENV_SCRAM_USERS",
    "spark_jobs.common:ENV_SPARK_JARS",
    "spark_jobs.common:ENV_SPARK_PARTITIONS",
)
"""The environment variables read neither by a settings dataclass's ``from_env`` nor as a
command line option's ``envvar``, as ``module:CONSTANT``: the constant holds the variable's
name (or prefix) and its docstring says what it does."""


def attribute_docs(owner: type | ModuleType) -> dict[str, str]:
    """The docstrings of the attributes of class or module ``owner``: for each name assigned
    in its body and followed by a string literal, that string, dedented and stripped."""
    source = textwrap.dedent(inspect.getsource(owner))
    body = ast.parse(source).body
    if isinstance(owner, type):
        body = next(node for node in body if isinstance(node, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if not (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Name):
                docs[target.id] = inspect.cleandoc(after.value.value)
    return docs
