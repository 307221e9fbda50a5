"""The fault proxy against a loopback echo server: forwarding, latency, dropped connections,
a partition and its healing."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from bridge.errors import IllegalStateError, InvalidArgumentError
from chaos.proxy import FaultProxy
from tests.conftest import wait_until


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, EchoServer)
        with server.lock:
            server.accepted += 1
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass
        finally:
            with server.lock:
                server.closed += 1


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self.lock = threading.Lock()
        self.accepted = 0
        self.closed = 0

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture()
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture()
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy([(0, echo.port)]) as running:
        yield running


def _connect(proxy: FaultProxy, timeout_s: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.listen_ports[0]), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    out = b""
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - started


def test_forwards_both_ways_and_counts(proxy: FaultProxy, echo: EchoServer) -> None:
    with _connect(proxy) as sock:
        payload = bytes(range(256)) * 1000
        sock.sendall(payload)
        assert _recv_exactly(sock, len(payload)) == payload
        stats = proxy.stats()
    assert stats.connections == 1
    assert stats.connections_by_port == {proxy.listen_ports[0]: 1}
    assert stats.bytes_to_target == len(payload)
    assert stats.bytes_to_client == len(payload)
    assert proxy.bytes_forwarded == 2 * len(payload)
    assert echo.accepted == 1
    # The client closing its end closes the target's.
    wait_until(lambda: echo.closed == 1, timeout_s=5)
    wait_until(lambda: proxy.stats().open_connections == 0, timeout_s=5)


def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        _round_trip_s(sock)
        proxy.set_latency(300)
        assert proxy.latency_ms == 300
        delayed = _round_trip_s(sock)
        proxy.set_latency(0)
        # The first chunk read after the change goes at once.
        undelayed = _round_trip_s(sock)
    # 300 ms to the echo server and 300 ms back.
    assert delayed >= 0.6, delayed
    assert undelayed < 0.6, undelayed


def test_latency_keeps_order_of_many_chunks(proxy: FaultProxy) -> None:
    proxy.set_latency(50)
    with _connect(proxy) as sock:
        sent = b"".join(f"{i:06d}".encode() for i in range(2000))
        for i in range(0, len(sent), 600):
            sock.sendall(sent[i : i + 600])
        assert _recv_exactly(sock, len(sent)) == sent


def test_drop_resets_open_connections_and_new_ones_go_through(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    first, second = _connect(proxy), _connect(proxy)
    try:
        _round_trip_s(first)
        _round_trip_s(second)
        assert proxy.drop_connections() == 2
        for sock in (first, second):
            with pytest.raises(ConnectionResetError):
                sock.sendall(b"x")
                sock.recv(1)
        wait_until(lambda: echo.closed == 2, timeout_s=5)
        assert proxy.stats().connections_reset == 2
        with _connect(proxy) as third:
            assert _round_trip_s(third) < 5
    finally:
        first.close()
        second.close()


def test_partition_blackholes_open_and_new_connections_until_healed(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    with _connect(proxy) as old:
        _round_trip_s(old)
        proxy.partition()
        assert proxy.partitioned
        old.settimeout(0.5)
        old.sendall(b"held")
        with pytest.raises(TimeoutError):
            old.recv(4)
        # A new connection is accepted (no refusal) but reaches nothing.
        with _connect(proxy) as new:
            new.settimeout(0.5)
            new.sendall(b"late")
            with pytest.raises(TimeoutError):
                new.recv(4)
            assert echo.accepted == 1
            assert proxy.stats().connections == 2
            proxy.heal()
            assert not proxy.partitioned
            new.settimeout(5)
            old.settimeout(5)
            # What was sent during the partition arrives, in order, on both connections.
            assert _recv_exactly(new, 4) == b"late"
            assert _recv_exactly(old, 4) == b"held"
            assert _round_trip_s(old) < 5
        assert echo.accepted == 2


def test_drop_during_a_partition_resets_held_connections(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    proxy.partition()
    with _connect(proxy) as held:
        wait_until(lambda: proxy.stats().open_connections == 1, timeout_s=5)
        assert proxy.drop_connections() == 1
        with pytest.raises(ConnectionResetError):
            held.recv(1)
    proxy.heal()
    assert echo.accepted == 0


def test_a_target_that_is_down_resets_the_client(echo: EchoServer) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with FaultProxy([(0, dead_port)]) as proxy:
        port = proxy.listen_ports[0]
        # The reset may come before connect() returns or at the first read.
        with (
            pytest.raises(ConnectionResetError),
            socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        ):
            sock.recv(1)
        assert proxy.stats().connections == 1


def test_several_routes_each_reach_their_target(echo: EchoServer) -> None:
    other = EchoServer()
    thread = threading.Thread(target=other.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        with FaultProxy([(0, echo.port), (0, other.port)]) as proxy:
            for port in proxy.listen_ports:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    assert _round_trip_s(sock) < 5
            assert echo.accepted == 1
            assert other.accepted == 1
            assert dict(proxy.stats().connections_by_port) == dict.fromkeys(proxy.listen_ports, 1)
    finally:
        other.shutdown()
        other.server_close()


def test_stop_closes_the_listening_ports(echo: EchoServer) -> None:
    proxy = FaultProxy([(0, echo.port)])
    proxy.start()
    port = proxy.listen_ports[0]
    proxy.stop()
    proxy.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_taken_listen_port_fails_start(echo: EchoServer, proxy: FaultProxy) -> None:
    with pytest.raises(OSError):
        FaultProxy([(proxy.listen_ports[0], echo.port)]).start()


def test_bad_input_is_a_typed_error(echo: EchoServer) -> None:
    with pytest.raises(InvalidArgumentError, match="at least one route"):
        FaultProxy([])
    with pytest.raises(InvalidArgumentError, match=r"target port 1\.\.65535"):
        FaultProxy([(0, 0)])
    with pytest.raises(InvalidArgumentError, match="listen ports repeat"):
        FaultProxy([(5000, echo.port), (5000, echo.port)])
    unstarted = FaultProxy([(0, echo.port)])
    with pytest.raises(InvalidArgumentError, match="latency must be >= 0"):
        unstarted.set_latency(-1)
    with pytest.raises(IllegalStateError, match="not started"):
        unstarted.partition()
    with pytest.raises(IllegalStateError, match="not started"):
        unstarted.drop_connections()
