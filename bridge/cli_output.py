"""Machine-readable output of the ``bridge`` read commands: ``--json`` prints one JSON object
per line on stdout (JSON Lines), nothing else, so scripts can parse each line on its own."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    """``--json``: one JSON object per line instead of the table (parameter ``as_json``)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="One JSON object per line (JSON Lines) instead of text.",
    )(func)


def emit_json(obj: Mapping[str, Any]) -> None:
    """Print ``obj`` as one JSON line; bytes and other non-JSON values become strings."""
    click.echo(json.dumps(obj, default=str, ensure_ascii=False, sort_keys=False))
