"""What the ``bridge`` commands share: the console, the client settings a command runs with,
the ``--bootstrap-servers`` and ``--command-config`` options and stopping on signals.

``--command-config FILE`` (env ``BRIDGE_COMMAND_CONFIG``) is a Kafka client properties file, as
Kafka's own tools take: librdkafka names or the Java client's (``sasl.jaas.config`` with a SCRAM
or PLAIN login, ``ssl.truststore.*`` of type PEM, ``ssl.keystore.*`` of type PKCS12 or PEM);
see :func:`topics.client_security.to_librdkafka`. Its settings win over ``BRIDGE_KAFKA_*``.
"""

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
from topics.client_security import ENV_COMMAND_CONFIG, read_properties_file, to_librdkafka

console = Console(highlight=False, soft_wrap=True, markup=False)

F = TypeVar("F", bound=Callable[..., Any])


DEFAULT_LOCAL_PORT = 9092
"""The local broker's port for ``bridge up`` and ``bridge broker``."""

COMMAND_CONFIG_KEY = "command_config"
"""Where ``--command-config`` keeps its file in ``ctx.obj``."""


def client_config(ctx: click.Context, bootstrap_servers: str | None = None) -> ClientConfig:
    """``ClientConfig.from_env()`` with the command line's bootstrap servers and namespace, and
    the settings of the ``--command-config`` file (they win over ``BRIDGE_KAFKA_*``). A property
    the file may not hold is a :class:`~topics.client_security.ClientPropertyError` naming it,
    never its value."""
    obj = ctx.obj or {}
    base = ClientConfig.from_env()
    path = obj.get(COMMAND_CONFIG_KEY)
    kafka = None
    if path:
        kafka = {**base.kafka, **to_librdkafka(read_properties_file(path), source=str(path))}
    return base.replace(
        bootstrap_servers=bootstrap_servers, namespace=obj.get("namespace") or None, kafka=kafka
    )


def _keep_command_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # A group and its subcommand may both take the option: a value given to either is kept.
    if value:
        ctx.ensure_object(dict)[COMMAND_CONFIG_KEY] = value


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


def command_config_option(func: F) -> F:
    """``--command-config FILE`` (env ``BRIDGE_COMMAND_CONFIG``): kept in ``ctx.obj`` for
    :func:`client_config`, not passed to the command."""
    return click.option(
        "--command-config",
        envvar=ENV_COMMAND_CONFIG,
        default=None,
        metavar="FILE",
        expose_value=False,
        is_eager=True,
        callback=_keep_command_config,
        type=click.Path(exists=True, dir_okay=False),
        help="Kafka client properties file (security settings), as Kafka's tools take: "
        f"librdkafka or Java client names [env {ENV_COMMAND_CONFIG}].",
    )(func)


def bootstrap_option(help_text: str) -> Callable[[F], F]:
    """``-b/--bootstrap-servers``, read from ``KAFKA_BOOTSTRAP_SERVERS`` when not given, and
    ``--command-config`` (:func:`command_config_option`): every command that talks to Kafka
    takes both."""
    servers = click.option(
        "-b",
        "--bootstrap-servers",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        default=None,
        help=help_text + " [env KAFKA_BOOTSTRAP_SERVERS]",
    )

    def decorate(func: F) -> F:
        return servers(command_config_option(func))

    return decorate
