"""The HTTP endpoint of a process's metrics and health: ``/metrics`` (Prometheus text format),
``/healthz`` (alive: 200 unless a :class:`HealthCheck` says failed) and ``/readyz`` (200 once
ready), and optionally a WSGI application on every other path (the coordinator's operator
console). Served by :mod:`http.server` on a daemon thread, so it never keeps a process alive."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any, Final, cast
from urllib.parse import unquote
from wsgiref.handlers import SimpleHandler

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bridge.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

DEFAULT_METRICS_HOST: Final = "127.0.0.1"
"""Loopback by default: set ``BRIDGE_METRICS_HOST=0.0.0.0`` (a container) to be scraped from
elsewhere; the endpoint has no authentication."""
ENV_METRICS_PORT: Final = "BRIDGE_METRICS_PORT"
"""The port of the metrics and health endpoint (``bridge coordinator --metrics-port``)."""
ENV_METRICS_HOST: Final = "BRIDGE_METRICS_HOST"
"""The address the metrics and health endpoint listens on: ``127.0.0.1`` (loopback) by default;
``0.0.0.0`` (e.g. in a container) to be scraped from elsewhere. The endpoint has no
authentication."""


@dataclass(frozen=True, slots=True)
class HealthReport:
    """One answer of a :class:`HealthCheck`."""

    alive: bool
    """False once the process cannot go on (a service failed): ``/healthz`` answers 503."""
    ready: bool
    """True while it does its work (every service running and a member of its group):
    ``/readyz`` answers 200, else 503."""
    details: dict[str, Any] = field(default_factory=dict)
    """What the answer's JSON body shows (service states, the failure)."""


HealthCheck = Callable[[], HealthReport]
"""Called on each ``/healthz`` and ``/readyz`` request; must return quickly and not raise."""


def always_ready() -> HealthReport:
    """The health of a process with nothing to check (an application's producers)."""
    return HealthReport(alive=True, ready=True)


WsgiApp = Callable[..., Iterable[bytes]]
"""A WSGI application: called with the environ and ``start_response``, returns the body."""

_OWN_PATHS: Final = frozenset({"/metrics", "/healthz", "/readyz"})


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            if self.server.before_scrape is not None:
                try:
                    self.server.before_scrape()
                except Exception:  # the rest is still worth serving
                    logger.exception("updating the metrics before a scrape failed")
            body = generate_latest(self.server.registry)
            self._answer(200, body, CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/readyz"):
            try:
                report = self.server.health()
            except Exception as exc:  # a check that raises is a failed one
                logger.exception("health check raised")
                report = HealthReport(alive=False, ready=False, details={"error": str(exc)})
            ok = report.alive if path == "/healthz" else report.alive and report.ready
            payload = {"alive": report.alive, "ready": report.ready, **report.details}
            body = json.dumps(payload, default=str).encode()
            self._answer(200 if ok else 503, body, "application/json")
        elif self.server.app is not None:
            self._wsgi(self.server.app)
        else:
            self._answer(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

    def do_POST(self) -> None:
        if self.server.app is not None and self.path.split("?", 1)[0] not in _OWN_PATHS:
            self._wsgi(self.server.app)
        else:
            self._answer(405, b"method not allowed\n", "text/plain")

    def _wsgi(self, app: WsgiApp) -> None:
        """Answer this request with ``app`` (the rest of the request is read by it)."""
        path, _, query = self.path.partition("?")
        environ: dict[str, str] = {
            "REQUEST_METHOD": self.command,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote(path, "latin-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": str(self.server.server_address[0]),
            "SERVER_PORT": str(self.server.server_address[1]),
            "SERVER_PROTOCOL": self.request_version,
            "REMOTE_ADDR": self.client_address[0],
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": self.headers.get("Content-Length", ""),
        }
        for name, value in self.headers.items():
            key = "HTTP_" + name.upper().replace("-", "_")
            if key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
                environ[key] = f"{environ[key]},{value}" if key in environ else value
        handler = SimpleHandler(
            self.rfile,
            cast("IO[bytes]", self.wfile),
            sys.stderr,
            environ,
            multithread=True,
            multiprocess=False,
        )
        handler.server_software = self.version_string()
        handler.run(app)
        self.close_connection = True  # no keep-alive: the handler wrote an HTTP/1.0 answer

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("metrics endpoint: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        health: HealthCheck,
        before_scrape: Callable[[], None] | None,
        app: WsgiApp | None = None,
    ) -> None:
        self.registry = registry
        self.health = health
        self.before_scrape = before_scrape
        self.app = app
        super().__init__(address, _Handler)


class MetricsServer:
    """Serves ``registry`` and ``health`` over HTTP on ``host:port`` (port 0 picks a free one:
    read :attr:`port`). :meth:`start` binds and starts the daemon thread; :meth:`stop` closes.
    ``with MetricsServer(...) as server:`` does both. ``before_scrape`` is called before each
    ``/metrics`` answer (to set gauges read from elsewhere; an exception is logged). ``app``,
    when given, answers every other path (GET and POST): a WSGI application such as the
    operator console, which judges its own requests."""

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        *,
        host: str = DEFAULT_METRICS_HOST,
        health: HealthCheck = always_ready,
        before_scrape: Callable[[], None] | None = None,
        app: WsgiApp | None = None,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidArgumentError(f"metrics port must be an integer 0-65535, got {port!r}")
        self._registry = registry
        self._address = (host, port)
        self._health = health
        self._before_scrape = before_scrape
        self._app = app
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port listened on (once started)."""
        return self._server.server_address[1] if self._server is not None else self._address[1]

    @property
    def url(self) -> str:
        """``http://host:port`` of the endpoint (loopback when bound to every interface)."""
        host = self._address[0]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def start(self) -> None:
        """Bind and serve on a daemon thread. Raises :class:`InvalidArgumentError` when the
        address cannot be bound (the port in use, say)."""
        try:
            self._server = _Server(
                self._address, self._registry, self._health, self._before_scrape, self._app
            )
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot serve metrics on {self._address[0]}:{self._address[1]}: {exc}"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"bridge-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.info("metrics and health served on %s", self.url)

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_port(value: str | int | None, what: str = ENV_METRICS_PORT) -> int | None:
    """A metrics port from a setting: None for unset or empty, else an integer 0-65535;
    anything else raises :class:`InvalidArgumentError` naming ``what``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"{what} must be a port number 0-65535, got {value!r}")
    return port
