"""Lifecycle state machine and the base class of every background service thread.

The states are RocketMQ's ``ServiceState``; the allowed transitions are an explicit table and an
illegal one raises :class:`~bridge.errors.IllegalStateError`.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable
from enum import Enum
from types import TracebackType
from typing import Self

from bridge.errors import FatalServiceError, IllegalStateError, InvalidArgumentError

__all__ = [
    "TRANSITIONS",
    "FatalServiceError",
    "Lifecycle",
    "ServiceState",
    "ServiceThread",
    "Startable",
]
"""``FatalServiceError`` is defined in :mod:`bridge.errors` and importable from here."""

logger = logging.getLogger(__name__)


class ServiceState(Enum):
    """RocketMQ's ``ServiceState``."""

    CREATE_JUST = "CREATE_JUST"
    RUNNING = "RUNNING"
    SHUTDOWN_ALREADY = "SHUTDOWN_ALREADY"


TRANSITIONS: dict[ServiceState, frozenset[ServiceState]] = {
    ServiceState.CREATE_JUST: frozenset({ServiceState.RUNNING, ServiceState.SHUTDOWN_ALREADY}),
    ServiceState.RUNNING: frozenset({ServiceState.SHUTDOWN_ALREADY}),
    ServiceState.SHUTDOWN_ALREADY: frozenset(),
}


class Lifecycle:
    """A thread-safe :class:`ServiceState` holder that only follows :data:`TRANSITIONS`."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._state = ServiceState.CREATE_JUST
        self._lock = threading.Lock()

    @property
    def state(self) -> ServiceState:
        """The current state."""
        return self._state

    def transition(self, target: ServiceState) -> ServiceState:
        """Move to ``target``; return the previous state or raise if the move is illegal."""
        with self._lock:
            current = self._state
            if target not in TRANSITIONS[current]:
                raise IllegalStateError(
                    f"{self._owner}: cannot go from {current.value} to {target.value}"
                    + (" (start() may be called once)" if target is ServiceState.RUNNING else "")
                )
            self._state = target
            return current

    def start_with(self, start: Callable[[], None], undo: Callable[[], None]) -> None:
        """Go to RUNNING and call ``start``; if it raises, call ``undo`` (what ``start``
        may have acquired is released), go to SHUTDOWN_ALREADY and raise again."""
        self.transition(ServiceState.RUNNING)
        try:
            start()
        except Exception:
            undo()
            self.transition(ServiceState.SHUTDOWN_ALREADY)
            raise

    def require_running(self) -> None:
        """Raise unless the state is RUNNING."""
        if self._state is not ServiceState.RUNNING:
            raise IllegalStateError(
                f"{self._owner} is {self._state.value}, not RUNNING: call start() first"
            )


class Startable(abc.ABC):
    """Something with a ``start()``/``stop()`` lifecycle, usable as a context manager."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start (acquire resources, start threads or processes)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop and release everything ``start`` acquired. Idempotent."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServiceThread(Startable):
    """A named background thread that calls :meth:`run_once` until stopped.

    Like RocketMQ's ``ServiceThread``: ``wakeup()`` cuts the wait short. An exception in
    ``run_once`` is logged and the loop goes on, so one bad input never stalls the service;
    a :class:`FatalServiceError` ends the service instead (see :attr:`failure`).
    """

    def __init__(self, name: str, interval_ms: int) -> None:
        if interval_ms <= 0:
            raise InvalidArgumentError(f"interval_ms must be positive, got {interval_ms}")
        self.name = name
        self.interval_ms = interval_ms
        self._lifecycle = Lifecycle(name)
        self._stopped = threading.Event()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: FatalServiceError | None = None
        self._failure_listeners: list[Callable[[ServiceThread, FatalServiceError], None]] = []

    @property
    def state(self) -> ServiceState:
        """The service's lifecycle state."""
        return self._lifecycle.state

    @property
    def failure(self) -> FatalServiceError | None:
        """Why the service ended by itself, or None while it runs or after a plain stop."""
        return self._failure

    def add_failure_listener(
        self, listener: Callable[[ServiceThread, FatalServiceError], None]
    ) -> None:
        """Call ``listener(service, error)`` (on the service's thread) if the service ends
        with a :class:`FatalServiceError`. Register before :meth:`start`."""
        self._failure_listeners.append(listener)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopped.is_set()

    def start(self) -> None:
        """Start the thread (once)."""
        self._lifecycle.transition(ServiceState.RUNNING)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        logger.info("service %s started", self.name)

    def stop(self, timeout_ms: int = 10_000) -> None:
        """Ask the loop to end, wait up to ``timeout_ms`` for it, then release resources."""
        if self._lifecycle.state is ServiceState.SHUTDOWN_ALREADY:
            return
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        self._stopped.set()
        self._wakeup.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_ms / 1000)
            if self._thread.is_alive():
                logger.warning("service %s did not stop within %d ms", self.name, timeout_ms)
        logger.info("service %s stopped", self.name)

    def wakeup(self) -> None:
        """Run the next iteration now instead of after the interval."""
        self._wakeup.set()

    def _start_until_stopped(self) -> bool:
        """Call :meth:`on_start` until it succeeds (a broker still starting, a coordinator still
        loading) or the service is stopped; back off from 0.5 s to 30 s between tries."""
        backoff_s = 0.5
        while not self._stopped.is_set():
            try:
                self.on_start()
                return True
            except FatalServiceError:
                raise
            except Exception:
                logger.exception(
                    "service %s: start failed; retrying in %.1f s", self.name, backoff_s
                )
                try:
                    self.on_stop()
                except Exception:
                    logger.exception("service %s: cleaning up after a failed start", self.name)
                self._stopped.wait(backoff_s)
                backoff_s = min(backoff_s * 2, 30.0)
        return False

    def _run(self) -> None:
        try:
            if not self._start_until_stopped():
                return
            while not self._stopped.is_set():
                try:
                    self.run_once()
                except FatalServiceError:
                    raise
                except Exception:
                    logger.exception("service %s: iteration failed; continuing", self.name)
                self._wakeup.wait(self.interval_ms / 1000)
                self._wakeup.clear()
        except FatalServiceError as exc:
            logger.error("service %s: stopping: %s", self.name, exc)
            self._failure = exc
            self._stopped.set()
            for listener in self._failure_listeners:
                try:
                    listener(self, exc)
                except Exception:
                    logger.exception("service %s: failure listener failed", self.name)
        finally:
            try:
                self.on_stop()
            except Exception:
                logger.exception("service %s: on_stop failed", self.name)

    def on_start(self) -> None:
        """Called on the service thread before the first iteration."""

    def on_stop(self) -> None:
        """Called on the service thread after the last iteration."""

    @abc.abstractmethod
    def run_once(self) -> None:
        """One iteration of the service's work."""
