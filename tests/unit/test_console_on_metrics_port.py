"""The operator console served on the coordinator's metrics port (``bridge coordinator
--console``): the metrics endpoint answers its own three paths and hands every other one, GET
or POST, to a WSGI application; the console there keeps its own rules (read-only unless
allowed, its host names). None of this needs Kafka."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, Counter

from bridge.cli import cli
from bridge.cli.console.app import ConsoleSettings, create_app
from bridge.config import ClientConfig
from bridge.observability import MetricsServer

UNREACHABLE = ClientConfig(bootstrap_servers="127.0.0.1:1", namespace="unit")


def _echo(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """A WSGI app that answers with what it was asked."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    text = (
        f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}?{environ['QUERY_STRING']} "
        f"host={environ.get('HTTP_HOST')} body={body.decode()}"
    )
    start_response("201 Created", [("Content-Type", "text/plain"), ("X-App", "echo")])
    return [text.encode()]


def _get(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        return urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as exc:
        return exc


@pytest.fixture()
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("console_test_total", "a counter", registry=registry).inc()
    return registry


@pytest.fixture()
def echo_server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    with MetricsServer(registry, 0, app=_echo) as server:
        yield server


def test_every_other_path_goes_to_the_application(echo_server: MetricsServer) -> None:
    metrics = _get(f"{echo_server.url}/metrics")
    assert metrics.status == 200 and b"console_test_total 1.0" in metrics.read()
    assert _get(f"{echo_server.url}/healthz").status == 200
    page = _get(f"{echo_server.url}/dlq/a%20b?x=1")
    assert page.status == 201 and page.headers["X-App"] == "echo"
    assert page.read().decode() == (f"GET /dlq/a b?x=1 host=127.0.0.1:{echo_server.port} body=")
    posted = _get(f"{echo_server.url}/replay", data=b"ref=0%400")
    assert posted.status == 201 and posted.read().decode().endswith("body=ref=0%400")


def test_without_an_application_only_the_three_paths_answer(registry: CollectorRegistry) -> None:
    with MetricsServer(registry, 0) as server:
        assert _get(f"{server.url}/dlq").status == 404
        assert _get(f"{server.url}/dlq", data=b"x=1").status == 405
        assert _get(f"{server.url}/metrics").status == 200


def test_the_console_there_keeps_its_rules(registry: CollectorRegistry) -> None:
    app = create_app(ConsoleSettings(UNREACHABLE, "the-operator-token-xyz"))
    with MetricsServer(registry, 0, app=app) as server:
        style = _get(f"{server.url}/static/console.css")
        assert style.status == 200 and b".bar" in style.read()
        refused = _get(
            f"{server.url}/transactions/resolve",
            data=b"action=replay&msg_id=x",
            headers={"X-Console-Token": "the-operator-token-xyz", "Origin": server.url},
        )
        assert refused.status == 403 and b"read-only" in refused.read()
        rebound = _get(f"{server.url}/static/console.css", headers={"Host": "evil.example"})
        assert rebound.status == 400
        assert _get(f"{server.url}/metrics").status == 200


@pytest.mark.parametrize(
    ("args", "env", "why"),
    [
        (["--console"], {}, "--console is served on --metrics-port: give one"),
        (
            ["--metrics-port", "0", "--console-write"],
            {"BRIDGE_CONSOLE_TOKEN": "short"},
            "--console-write needs the operator token in BRIDGE_CONSOLE_TOKEN",
        ),
    ],
)
def test_the_coordinator_refuses_a_console_it_cannot_serve_safely(
    args: list[str], env: dict[str, str], why: str
) -> None:
    result = CliRunner().invoke(cli, ["coordinator", "-b", "127.0.0.1:1", *args], env=env)
    assert result.exit_code == 2, result.output
    assert why in result.output
