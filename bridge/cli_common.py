"""What the ``bridge`` commands share: the console, the client settings a command runs with,
the ``--bootstrap-servers`` option and stopping on signals."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import click
from rich.console import Console

from bridge.config import ClientConfig

console = Console(highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def client_config(ctx: click.Context, bootstrap_servers: str | None = None) -> ClientConfig:
    """``ClientConfig.from_env()`` with the command line's bootstrap servers and namespace."""
    base = ClientConfig.from_env()
    return base.replace(
        bootstrap_servers=bootstrap_servers, namespace=ctx.obj.get("namespace") or None
    )


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def bootstrap_option(help_text: str) -> Callable[[F], F]:
    """``-b/--bootstrap-servers``, read from ``KAFKA_BOOTSTRAP_SERVERS`` when not given."""
    return click.option(
        "-b",
        "--bootstrap-servers",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        default=None,
        help=help_text + " [env KAFKA_BOOTSTRAP_SERVERS]",
    )
