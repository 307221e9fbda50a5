"""A small TCP fault proxy between Kafka clients and the brokers: latency, dropped
connections, and a network partition that heals.

Why a proxy of our own: Toxiproxy is a Go server distributed as a release binary or a Docker
image, and neither is reachable from these machines or from CI (only PyPI and Maven Central
are); Linux network namespaces with ``tc netem`` need root and would have to move the clients
into a namespace of their own, while the workload runs in the same process as the test and
the brokers share loopback with it, so shaping loopback would slow inter-broker replication as
well. This proxy needs no privileges, runs inside the test, and sits only where a client fault
belongs: each broker of :class:`bridge.runtime.cluster.LocalKafkaCluster` (``proxied=True``)
advertises a PROXIED listener on a port this proxy binds, so a client that bootstraps through
it (``cluster.proxied_bootstrap_servers``) reaches every broker through it, while replication
and controller traffic stay direct.

One listening socket per route ``(listen_port, target_port)``; an asyncio loop in a background
thread forwards bytes both ways. The faults:

- :meth:`FaultProxy.set_latency`: every chunk read from either side is written to the other
  no earlier than ``ms`` after it was read (order is kept; throughput is not limited).
- :meth:`FaultProxy.drop_connections`: every open connection is reset (RST to both ends);
  new connections go through.
- :meth:`FaultProxy.partition`: nothing is forwarded any more, on open connections or on new
  ones, which are accepted but get no answer: a client sees timeouts, not refusals, as behind
  a real partition. Bytes sent meanwhile are held (as TCP would retransmit them), and
  :meth:`FaultProxy.heal` forwards them and everything after; connections accepted during the
  partition are connected to their broker then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.lifecycle import Startable

logger = logging.getLogger(__name__)

T = TypeVar("T")

_CHUNK_BYTES = 64 * 1024
_CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since :meth:`FaultProxy.start`."""

    connections: int
    """Client connections accepted."""
    open_connections: int
    """Client connections open now (held ones included)."""
    connections_reset: int
    """Connections :meth:`FaultProxy.drop_connections` reset."""
    bytes_to_target: int
    """Bytes forwarded from clients to their targets."""
    bytes_to_client: int
    """Bytes forwarded from targets back to clients."""
    connections_by_port: Mapping[int, int] = field(default_factory=dict)
    """Listening port -> client connections it accepted."""

    @property
    def bytes_forwarded(self) -> int:
        """Bytes forwarded both ways."""
        return self.bytes_to_target + self.bytes_to_client


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close a connection with an RST (SO_LINGER 0) instead of a FIN."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and, once connected, its connection to the target."""

    __slots__ = ("client", "target", "task")

    def __init__(self, client: asyncio.StreamWriter, task: asyncio.Task[Any] | None) -> None:
        self.client = client
        self.target: asyncio.StreamWriter | None = None
        self.task = task

    def reset(self) -> None:
        _reset(self.client)
        _reset(self.target)
        if self.task is not None:
            self.task.cancel()


class FaultProxy(Startable):
    """Forward TCP connections per route and inject faults into them.

    ``with FaultProxy(cluster.proxy_routes()) as proxy: proxy.partition(); ...; proxy.heal()``.
    A route's listen port of 0 picks a free one (:attr:`listen_ports` after :meth:`start`).
    Every method is safe to call from any thread.
    """

    def __init__(
        self,
        routes: Iterable[tuple[int, int]],
        *,
        host: str = "127.0.0.1",
        target_host: str = "127.0.0.1",
        connect_timeout_ms: int = 5_000,
    ) -> None:
        self._routes = [(int(listen), int(target)) for listen, target in routes]
        if not self._routes:
            raise InvalidArgumentError("a fault proxy needs at least one route")
        for listen, target in self._routes:
            if not 0 <= listen <= 65535 or not 1 <= target <= 65535:
                raise InvalidArgumentError(
                    f"a route is (listen port 0..65535, target port 1..65535), "
                    f"got ({listen}, {target})"
                )
        listens = [listen for listen, _ in self._routes if listen]
        if len(set(listens)) != len(listens):
            raise InvalidArgumentError(f"listen ports repeat in {self._routes}")
        if connect_timeout_ms <= 0:
            raise InvalidArgumentError(
                f"connect_timeout_ms must be positive, got {connect_timeout_ms}"
            )
        self._host = host
        self._target_host = target_host
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._latency_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._links: set[_Link] = set()
        self._healed: asyncio.Event | None = None
        self._listen_ports: list[int] = []
        self._accepted = 0
        self._accepted_by_port: dict[int, int] = {}
        self._reset_count = 0
        self._to_target = 0
        self._to_client = 0

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Bind every listening port and start forwarding. Raises :class:`OSError` if a port
        is taken (then nothing stays bound)."""
        if self._loop is not None:
            raise IllegalStateError("the fault proxy is already started")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._run(self._bind())
        except BaseException:
            self.stop()
            raise
        logger.info(
            "fault proxy forwarding %s",
            ", ".join(
                f"{p} -> {t}" for p, (_, t) in zip(self._listen_ports, self._routes, strict=True)
            ),
        )

    async def _bind(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()
        for listen, target in self._routes:
            server = await asyncio.start_server(
                self._handler(target), self._host, listen, reuse_address=True, backlog=256
            )
            self._servers.append(server)
            port = int(server.sockets[0].getsockname()[1])
            self._listen_ports.append(port)
            self._accepted_by_port[port] = 0

    def stop(self) -> None:
        """Close every listening socket and connection and end the loop. Idempotent."""
        loop = self._loop
        if loop is None:
            return
        if loop.is_running():
            with contextlib.suppress(Exception):
                self._run(self._shutdown())
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(_CALL_TIMEOUT_S)
        self._loop = None
        self._thread = None
        self._servers = []
        self._listen_ports = []

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        links = list(self._links)
        for link in links:
            link.reset()
        tasks = [link.task for link in links if link.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- faults ---------------------------------------------------------------------------
    @property
    def listen_ports(self) -> list[int]:
        """The ports listened on, in route order (after :meth:`start`)."""
        return list(self._listen_ports)

    @property
    def latency_ms(self) -> float:
        """The latency added to each forwarded chunk, ms."""
        return self._latency_s * 1000

    def set_latency(self, ms: float) -> None:
        """Delay every chunk forwarded from now on, either way, by ``ms`` milliseconds
        (0: none)."""
        if ms < 0:
            raise InvalidArgumentError(f"latency must be >= 0 ms, got {ms}")
        self._latency_s = ms / 1000

    def drop_connections(self) -> int:
        """Reset every open connection now (RST to client and target); return how many.
        New connections go through."""

        def drop() -> int:
            links = list(self._links)
            for link in links:
                link.reset()
            self._links.clear()
            self._reset_count += len(links)
            return len(links)

        return self._call(drop)

    def partition(self) -> None:
        """Forward nothing until :meth:`heal`: open connections go silent and new ones are
        accepted but get no answer."""
        self._call(lambda: self._events().clear())

    def heal(self) -> None:
        """End a :meth:`partition`: held bytes and connections go through."""
        self._call(lambda: self._events().set())

    @property
    def partitioned(self) -> bool:
        """True between :meth:`partition` and :meth:`heal`."""
        return self._healed is not None and not self._healed.is_set()

    def stats(self) -> ProxyStats:
        """The counters now."""
        return ProxyStats(
            connections=self._accepted,
            open_connections=len(self._links),
            connections_reset=self._reset_count,
            bytes_to_target=self._to_target,
            bytes_to_client=self._to_client,
            connections_by_port=MappingProxyType(dict(self._accepted_by_port)),
        )

    @property
    def connections(self) -> int:
        """Client connections accepted since :meth:`start`."""
        return self._accepted

    @property
    def bytes_forwarded(self) -> int:
        """Bytes forwarded both ways since :meth:`start`."""
        return self._to_target + self._to_client

    # --- internals ------------------------------------------------------------------------
    def _events(self) -> asyncio.Event:
        if self._healed is None:
            raise IllegalStateError("the fault proxy is not started")
        return self._healed

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or not loop.is_running():
            raise IllegalStateError("the fault proxy is not started: call start() first")
        return loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop's thread and wait for its result."""
        try:
            loop = self._require_loop()
        except IllegalStateError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop).result(_CALL_TIMEOUT_S)

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the loop's thread and return its result."""

        async def call() -> T:
            return fn()

        return self._run(call())

    def _handler(
        self, target: int
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(target, reader, writer)

        return handle

    async def _serve(
        self, target: int, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        link = _Link(cwriter, asyncio.current_task())
        self._links.add(link)
        self._accepted += 1
        port = int(cwriter.get_extra_info("sockname")[1])
        self._accepted_by_port[port] = self._accepted_by_port.get(port, 0) + 1
        healed = self._events()
        try:
            # Held without an answer while partitioned, as a SYN nobody answers.
            await healed.wait()
            try:
                treader, twriter = await asyncio.wait_for(
                    asyncio.open_connection(self._target_host, target), self._connect_timeout_s
                )
            except (OSError, TimeoutError):
                _reset(cwriter)  # the target is down: the client sees its connection refused
                return
            link.target = twriter
            pumps = [
                asyncio.create_task(self._pump(creader, twriter, to_target=True)),
                asyncio.create_task(self._pump(treader, cwriter, to_target=False)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._links.discard(link)
            for end in (cwriter, link.target):
                if end is not None and not end.transport.is_closing():
                    end.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_target: bool
    ) -> None:
        """Copy ``reader`` to ``writer``, each chunk delayed by the latency at its reading and
        held while partitioned. Returns at end of stream or on a connection error."""
        loop = asyncio.get_running_loop()
        healed = self._events()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                while True:
                    await healed.wait()
                    data = await reader.read(_CHUNK_BYTES)
                    if not data:
                        break
                    queue.put_nowait((loop.time() + self._latency_s, data))
            except OSError:
                pass
            queue.put_nowait(None)

        reading = asyncio.create_task(read())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                due, data = item
                while True:
                    await healed.wait()
                    delay = due - loop.time()
                    if delay <= 0:
                        break
                    await asyncio.sleep(delay)
                # Counted first: the other end may read it before write() returns.
                if to_target:
                    self._to_target += len(data)
                else:
                    self._to_client += len(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            return
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)


__all__ = ["FaultProxy", "ProxyStats"]
