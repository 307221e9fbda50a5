"""RocketMQ 5's ``ClientConfiguration`` and ``Credentials``, as its Python client names them,
turned into the project's :class:`~bridge.config.ClientConfig`.

The mapping (``docs/v5-api.md``):

* ``endpoints``, RocketMQ 5's proxy addresses (``host:port`` separated by ``;``, each
  perhaps with ``http://`` or ``https://`` in front), are Kafka's bootstrap servers; ``,``
  separates them too, as Kafka writes them;
* ``credentials`` (an access key and its secret) are a SASL login: ``ak`` the username,
  ``sk`` the password, over ``SASL_SSL`` with ``SCRAM-SHA-512`` unless ``kafka`` names
  another SASL protocol or mechanism (the local secured broker's, ``docs/security.md``);
* ``namespace`` is the bridge's namespace (the system, retry and dead-letter topics and
  the coordinator serving them; empty: ``rmq``), not a prefix of the real topics;
* ``request_timeout`` (seconds) bounds each send: ``send_msg_timeout_ms``.

Other librdkafka properties (TLS, a CA, tuning) go in ``kafka``, as
:attr:`ClientConfig.kafka <bridge.ClientConfig.kafka>` takes them: the properties a
``ClientConfig`` sets from a field of its own (``linger.ms`` is ``linger_ms``, ...) are
refused there, naming the field, so a whole :class:`~bridge.config.ClientConfig` is
accepted wherever a ``ClientConfiguration`` is. RocketMQ 5's ``tls_enable`` client argument
is a Kafka setting here too (:func:`check_tls_enable`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from bridge.config import ClientConfig, is_secret_property
from bridge.errors import InvalidArgumentError
from bridge.settings import require_number
from topics.naming import DEFAULT_NAMESPACE

__all__ = [
    "ClientConfiguration",
    "Credentials",
    "as_client_config",
    "check_tls_enable",
    "kafka_bootstrap_servers",
]

DEFAULT_SECURITY_PROTOCOL: Final = "SASL_SSL"
"""The Kafka security protocol of a configuration with credentials, unless ``kafka`` names
one: the credentials never travel without TLS unless asked to."""
DEFAULT_SASL_MECHANISM: Final = "SCRAM-SHA-512"
"""The SASL mechanism of a configuration with credentials, unless ``kafka`` names one."""
PASSWORD_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms that log in with a username and a password."""

_HOST: Final = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
"""A host name, an IPv4 address, or an IPv6 address in brackets."""
_URL_PREFIXES: Final = ("http://", "https://")
"""What RocketMQ 5's Python client strips from an endpoint."""


def kafka_bootstrap_servers(endpoints: str) -> str:
    """RocketMQ 5's ``endpoints`` (``host:port`` pairs separated by ``;`` or ``,``, each
    perhaps prefixed ``http://`` or ``https://``) as Kafka's ``bootstrap.servers``
    (comma-separated ``host:port``). Raises :class:`InvalidArgumentError` naming the
    endpoint that is not ``host:port`` (a port from 1 to 65535), or when there is none."""
    if not isinstance(endpoints, str):
        raise InvalidArgumentError(
            f"endpoints must be a string of host:port pairs, got {type(endpoints).__name__}"
        )
    servers = []
    for part in re.split(r"[;,]", endpoints):
        given = part.strip()
        if not given:
            continue
        address = given
        for prefix in _URL_PREFIXES:
            if address.lower().startswith(prefix):
                address = address[len(prefix) :]
        host, colon, port = address.rpartition(":")
        if (
            not colon
            or not _HOST.fullmatch(host)
            or not (port.isascii() and port.isdigit())
            or not 0 < int(port) < 65536
        ):
            raise InvalidArgumentError(
                f"endpoint {given!r} of endpoints {endpoints!r} is not host:port (a host name, "
                "an IPv4 address or an [IPv6] address, and a port from 1 to 65535)"
            )
        servers.append(f"{host}:{int(port)}")
    if not servers:
        raise InvalidArgumentError(f"endpoints {endpoints!r} name no host:port")
    return ",".join(servers)


@dataclass(frozen=True, slots=True)
class Credentials:
    """RocketMQ 5's ``Credentials``: an access key (``ak``) and its secret (``sk``), here the
    SASL username and password of the Kafka login. Empty (the default, as there): no login.
    The secret never shows in a repr."""

    ak: str = ""
    """The access key: the SASL username."""
    sk: str = field(default="", repr=False)
    """The secret key: the SASL password."""

    def __post_init__(self) -> None:
        for name in ("ak", "sk"):
            value = getattr(self, name)
            if value is None:  # RocketMQ 5's client takes None for empty
                object.__setattr__(self, name, "")
            elif not isinstance(value, str):
                raise InvalidArgumentError(
                    f"Credentials.{name} must be a string, got {type(value).__name__}"
                )
        if bool(self.ak) != bool(self.sk):
            raise InvalidArgumentError(
                "Credentials need both ak (the SASL username) and sk (its password), or neither"
            )

    @property
    def empty(self) -> bool:
        """True when there is no login (no access key)."""
        return not self.ak


def _sasl_properties(credentials: Credentials, kafka: Mapping[str, Any]) -> dict[str, Any]:
    """``kafka`` with the SASL login of ``credentials`` (see the module docstring); raises
    :class:`InvalidArgumentError` where ``kafka`` says otherwise."""
    props = dict(kafka)
    lowered = {name.lower(): name for name in props}
    for prop, value in (("sasl.username", credentials.ak), ("sasl.password", credentials.sk)):
        given = lowered.get(prop)
        if given is not None and props[given] != value:
            raise InvalidArgumentError(
                f"credentials and kafka[{given!r}] both name the SASL login; give one of them"
            )
        props[given or prop] = value
    protocol_name = lowered.get("security.protocol")
    if protocol_name is None:
        props["security.protocol"] = DEFAULT_SECURITY_PROTOCOL
    elif not str(props[protocol_name]).strip().upper().startswith("SASL_"):
        raise InvalidArgumentError(
            f"credentials are a SASL login, but kafka[{protocol_name!r}] is "
            f"{props[protocol_name]!r}: use SASL_SSL or SASL_PLAINTEXT"
        )
    mechanism_name = lowered.get("sasl.mechanism") or lowered.get("sasl.mechanisms")
    if mechanism_name is None:
        props["sasl.mechanism"] = DEFAULT_SASL_MECHANISM
    elif str(props[mechanism_name]).strip().upper() not in PASSWORD_MECHANISMS:
        raise InvalidArgumentError(
            f"credentials are a username and a password, but kafka[{mechanism_name!r}] is "
            f"{props[mechanism_name]!r}: use one of {', '.join(PASSWORD_MECHANISMS)}"
        )
    return props


@dataclass(frozen=True, slots=True, init=False)
class ClientConfiguration:
    """RocketMQ 5's ``ClientConfiguration(endpoints, credentials, namespace,
    request_timeout)``: where the clients of :mod:`bridge.v5` (and the
    :class:`~bridge.SimpleConsumer`) connect. Validated on construction, each problem a
    :class:`~bridge.errors.InvalidArgumentError` naming it.

    ``endpoints`` are Kafka's bootstrap servers (``"host:9092;host2:9092"``),
    ``credentials`` a SASL login (:class:`Credentials`; None or empty: none), ``namespace``
    the bridge's namespace (empty: ``rmq``) and ``request_timeout`` the bound on a send,
    seconds (3, as there). ``kafka`` (keyword only; None: none) adds librdkafka properties
    (TLS, tuning) except those a :class:`~bridge.config.ClientConfig` sets from a field of
    its own (``linger.ms``, ...), refused naming the field: pass a ``ClientConfig`` instead
    for those. :meth:`to_client_config` is the :class:`~bridge.config.ClientConfig` they make.
    Equal configurations hash equal (usable as dict keys)."""

    endpoints: str
    credentials: Credentials | None
    namespace: str
    request_timeout: float
    """Seconds."""
    kafka: Mapping[str, Any]
    """librdkafka properties, as :attr:`ClientConfig.kafka <bridge.ClientConfig.kafka>`
    (read-only)."""
    _client_config: ClientConfig = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        endpoints: str,
        credentials: Credentials | None = None,
        namespace: str = "",
        request_timeout: float = 3,
        *,
        kafka: Mapping[str, Any] | None = None,
    ) -> None:
        init = object.__setattr__  # frozen
        init(self, "endpoints", endpoints)
        init(self, "credentials", credentials)
        init(self, "namespace", namespace)
        init(self, "request_timeout", request_timeout)
        login = credentials if credentials is not None else Credentials()
        if not isinstance(login, Credentials):
            raise InvalidArgumentError(
                f"credentials must be a Credentials, got {type(login).__name__}"
            )
        if not isinstance(namespace, str):
            raise InvalidArgumentError(
                f"namespace must be a string, got {type(namespace).__name__}"
            )
        require_number("request_timeout", request_timeout)
        if kafka is None:
            kafka = {}
        if not isinstance(kafka, Mapping):
            raise InvalidArgumentError(
                f"kafka must be a mapping of librdkafka properties, got {type(kafka).__name__}"
            )
        init(self, "kafka", MappingProxyType(dict(kafka)))
        properties = dict(kafka)
        if not login.empty:
            properties = _sasl_properties(login, properties)
        init(
            self,
            "_client_config",
            ClientConfig(
                bootstrap_servers=kafka_bootstrap_servers(endpoints),
                namespace=namespace or DEFAULT_NAMESPACE,
                send_msg_timeout_ms=math.ceil(request_timeout * 1000),
                kafka=properties,
            ),
        )

    def __hash__(self) -> int:
        # The generated hash would hash the kafka mapping, which is not hashable.
        return hash(
            (
                self.endpoints,
                self.credentials,
                self.namespace,
                self.request_timeout,
                frozenset(self.kafka.items()),
            )
        )

    def to_client_config(self) -> ClientConfig:
        """The :class:`~bridge.config.ClientConfig` this configuration makes."""
        return self._client_config

    @property
    def bootstrap_servers(self) -> str:
        """Kafka's ``bootstrap.servers``, from ``endpoints``."""
        return self._client_config.bootstrap_servers

    def __repr__(self) -> str:
        # Secret librdkafka properties show as "***" (the credentials' secret never shows).
        kafka = {name: "***" if is_secret_property(name) else v for name, v in self.kafka.items()}
        return (
            f"ClientConfiguration(endpoints={self.endpoints!r}, "
            f"credentials={self.credentials!r}, namespace={self.namespace!r}, "
            f"request_timeout={self.request_timeout!r}, kafka={kafka!r})"
        )


_TLS_PROTOCOLS: Final = ("SSL", "SASL_SSL")


def check_tls_enable(tls_enable: object, config: ClientConfig, client: str) -> None:
    """Check RocketMQ 5's ``tls_enable`` argument of a ``client`` against ``config``: TLS is
    a setting of the Kafka connection here (``security.protocol``), not of a client. None and
    False change nothing; True is accepted when ``config`` connects over TLS already, else
    :class:`InvalidArgumentError` says where TLS is set."""
    if tls_enable is None or tls_enable is False:
        return
    if tls_enable is not True:
        raise InvalidArgumentError(f"tls_enable must be a bool, got {tls_enable!r}")
    protocol = next(
        (str(v) for k, v in config.kafka.items() if k.lower() == "security.protocol"), ""
    )
    if protocol.strip().upper() in _TLS_PROTOCOLS:
        return
    raise InvalidArgumentError(
        f"{client}(tls_enable=True): TLS is a setting of the Kafka connection here, not of a "
        "client, and this configuration connects over "
        f"{protocol or 'PLAINTEXT'}: give ClientConfiguration(..., kafka={{'security.protocol': "
        "'SSL', 'ssl.ca.location': ...}}) (Credentials log in over SASL_SSL already), then "
        "drop tls_enable or keep it True"
    )


def as_client_config(configuration: object, what: str) -> ClientConfig | None:
    """``configuration`` (a :class:`ClientConfiguration`, a
    :class:`~bridge.config.ClientConfig` or None) as a ``ClientConfig`` (None stays None);
    :class:`InvalidArgumentError` naming ``what`` for anything else."""
    if configuration is None or isinstance(configuration, ClientConfig):
        return configuration
    if isinstance(configuration, ClientConfiguration):
        return configuration.to_client_config()
    raise InvalidArgumentError(
        f"{what} must be a ClientConfiguration or a ClientConfig, got "
        f"{type(configuration).__name__}"
    )
