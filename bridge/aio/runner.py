"""Listener calls from the threaded machinery onto an event loop.

The consumer's listener threads and the transaction producer's threads call listeners exactly
as they do in the threaded API. A listener of the asyncio API may be ``async def``: called on
such a thread, it only makes its coroutine, which :meth:`LoopRunner.resolve` runs as a task on
the event loop while the calling thread waits for its outcome. The loop itself never waits:
the threads do, one per listener in flight, so the threaded pool's size is the bound on
listeners in flight. A plain (not ``async``) listener runs on the calling thread as in the
threaded API, never on the loop.

A listener task that is cancelled (by :meth:`LoopRunner.cancel_all` at shutdown, by a
:class:`CancelScope`, or by itself) gives the caller's ``on_cancel`` value: RECONSUME_LATER
for a consumer, UNKNOWN for a local transaction.

An event loop that ended without the client's ``shutdown()`` (``asyncio.run`` returned or
raised, a loop closed by hand) can run no listener again: the first call that finds it closed
logs an error and shuts the client down on a thread of its own (its ``on_closed``), so that
its group's other members take its partitions or checks over, and every such call raises
:class:`~bridge.errors.EventLoopClosedError`, which its caller counts as not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, Self, TypeVar, cast

from bridge.errors import EventLoopClosedError, IllegalStateError

logger = logging.getLogger(__name__)

T = TypeVar("T")

WAIT_SLICE_S: Final = 0.5
"""A thread waiting for a listener task looks whether the loop was closed this often, s."""


_LISTENER_OF: contextvars.ContextVar[tuple[LoopRunner, _Call] | None] = contextvars.ContextVar(
    "bridge_aio_listener_of", default=None
)
"""The runner and listener call the current task runs (or was started from)."""


class CancelScope:
    """Cancels one listener call, whether it has started or not (loop thread only).

    :meth:`cancel` cancels the task running the call, or makes a call that has not started
    yet give its ``on_cancel`` value without running the listener.
    """

    __slots__ = ("cancelled", "task")

    def __init__(self) -> None:
        self.cancelled = False
        self.task: asyncio.Task[Any] | None = None

    def cancel(self) -> None:
        """Cancel the call (loop thread only)."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


class _Call:
    """One awaitable run on the loop for a waiting thread: its outcome, and a lock released
    when it is known (the cheapest thing a thread can wait on with a timeout)."""

    __slots__ = ("awaitable", "cancelled", "done", "error", "finished", "scope", "value")

    def __init__(self, awaitable: Awaitable[Any], scope: CancelScope | None) -> None:
        self.awaitable = awaitable
        self.scope = scope
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.finished = False
        """Its task has ended (loop thread only)."""


class LoopRunner:
    """Runs listener awaitables on one event loop for threads that wait for them."""

    def __init__(self, owner: str, on_closed: Callable[[], None] | None = None) -> None:
        self._owner = owner
        self._on_closed = on_closed
        """Shuts the client down once the loop is found closed (on a thread of its own)."""
        self._closed_lock = threading.Lock()
        self._closed_found = False
        self.closed_handled = threading.Event()
        """Set once ``on_closed`` returned, after the loop was found closed."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        """Listener tasks running (loop thread only)."""
        self._arriving: deque[_Call] = deque()
        """Calls handed over by threads, for the loop to start."""
        self._scheduled = False
        """A start of the arriving calls is scheduled on the loop."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop listeners run on, once bound."""
        if self._loop is None:
            raise IllegalStateError(f"{self._owner} is not started")
        return self._loop

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run listeners on ``loop`` (the loop that starts the client)."""
        self._loop = loop

    @property
    def running(self) -> int:
        """Listener tasks on the loop now (loop thread only)."""
        return len(self._tasks)

    def resolve(
        self,
        value: object,
        on_cancel: T,
        scope: CancelScope | None = None,
        cancel_after_s: float | None = None,
    ) -> object:
        """What a listener returned, with an awaitable run to its end on the loop (waiting
        on this thread, which must not be the loop's). A cancelled task gives ``on_cancel``;
        an exception is raised here, as a plain listener's would be. ``cancel_after_s``: the
        task is cancelled once it ran this long (seconds), freeing this thread."""
        if not inspect.isawaitable(value):
            return value
        if cancel_after_s is not None and scope is None:
            scope = CancelScope()
        loop = self.loop
        if loop.is_closed():
            # Before queueing: a wake-up scheduled just before the loop closed never ran, so
            # _scheduled may stay set; this call must not wait on it.
            _discard(value)
            raise self._loop_closed("the event loop is closed; the listener did not run")
        call = _Call(value, scope)
        self._arriving.append(call)
        if not self._scheduled:  # one wake-up of the loop for the calls arriving together
            self._scheduled = True
            try:
                loop.call_soon_threadsafe(self._begin_arrived)
            except RuntimeError:  # the loop closed meanwhile
                self._scheduled = False
                self._forget(call)
                raise self._loop_closed(
                    "the event loop is closed; the listener did not run"
                ) from None
        deadline = None if cancel_after_s is None else time.monotonic() + cancel_after_s
        while not call.done.acquire(timeout=WAIT_SLICE_S):
            if loop.is_closed():
                self._forget(call)
                raise self._loop_closed("the event loop closed while a listener ran on it")
            if deadline is not None and scope is not None and time.monotonic() > deadline:
                deadline = None  # once: a task that ignores its cancellation is waited for
                logger.warning(
                    "%s: cancelling a listener task still running after %.1f s",
                    self._owner,
                    cancel_after_s,
                )
                with contextlib.suppress(RuntimeError):  # closed: seen on the next turn
                    loop.call_soon_threadsafe(scope.cancel)
        if call.cancelled:
            return on_cancel
        error = call.error
        if error is not None:
            if isinstance(error, EventLoopClosedError):
                # Another client's, raised through the listener: a failure of the listener.
                # Only this runner's closed loop means "not run" to the caller.
                raise IllegalStateError(str(error)) from error
            raise error
        return call.value

    def _forget(self, call: _Call) -> None:
        """Drop ``call``, which will never run on the closed loop."""
        with contextlib.suppress(ValueError):
            self._arriving.remove(call)
        _discard(call.awaitable)

    def _loop_closed(self, what: str) -> EventLoopClosedError:
        """The error for a call that found the loop closed; the first one also logs it and
        starts shutting the client down (``on_closed``, on a thread of its own: the caller
        is one of the client's threads, which that shutdown may wait for)."""
        with self._closed_lock:
            first = not self._closed_found
            self._closed_found = True
        if first:
            logger.error(
                "%s: its event loop has ended without shutdown() (%s); shutting it down so "
                "that its group's other members take over",
                self._owner,
                what,
            )
            # Not a daemon: the shutdown (bounded) commits and leaves the group even if the
            # process is ending.
            threading.Thread(
                target=self._shut_down, name=f"bridge-aio-closed-{self._owner}"
            ).start()
        return EventLoopClosedError(f"{self._owner}: {what}")

    def _shut_down(self) -> None:
        try:
            if self._on_closed is not None:
                self._on_closed()
        except Exception:
            logger.exception("%s: shutting down after its event loop ended", self._owner)
        finally:
            self.closed_handled.set()

    def _begin_arrived(self) -> None:
        self._scheduled = False  # first: a call arriving from now on schedules another
        arriving = self._arriving
        while arriving:
            self._begin(arriving.popleft())

    def _begin(self, call: _Call) -> None:
        task = self.loop.create_task(self._run(call, self))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finish(call, done))
        if call.scope is not None:
            call.scope.task = task

    @staticmethod
    async def _run(call: _Call, runner: LoopRunner) -> Any:
        # In the task's own context: the tasks the listener starts (wait_for, gather) see it.
        _LISTENER_OF.set((runner, call))
        if call.scope is not None and call.scope.cancelled:
            raise asyncio.CancelledError
        return await call.awaitable

    def _finish(self, call: _Call, task: asyncio.Task[Any]) -> None:
        """Hand the task's outcome to the waiting thread (a task cancelled even before it
        started included)."""
        self._tasks.discard(task)
        call.finished = True
        if task.cancelled():
            _discard(call.awaitable)
            call.cancelled = True
        else:
            call.error = task.exception()
            if call.error is None:
                call.value = task.result()
        call.done.release()

    def runs_current_task(self) -> bool:
        """True when called, while one of this runner's listener calls runs, from it or from
        a task it started (``asyncio.wait_for``, ``gather``, ``create_task``; loop thread
        only). A task the listener left running after it returned is not it any more."""
        entry = _LISTENER_OF.get()
        return entry is not None and entry[0] is self and not entry[1].finished

    def cancel_all(self) -> int:
        """Cancel every listener task still running (loop thread only); return how many."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return len(tasks)


def _discard(awaitable: object) -> None:
    """Close a coroutine that never started and never will (no "never awaited" warning).
    One that started belongs to its task: closing it from here would run its clean-up off
    the loop, and what that raises would be taken for the listener's outcome."""
    if (
        inspect.iscoroutine(awaitable)
        and inspect.getcoroutinestate(awaitable) == inspect.CORO_CREATED
    ):
        awaitable.close()


def call_listener(
    runner: LoopRunner,
    call: Callable[[], object],
    on_cancel: T,
    scope: CancelScope | None = None,
    cancel_after_s: float | None = None,
) -> Any:
    """Call a listener method on this thread and resolve what it returned (see
    :meth:`LoopRunner.resolve`); a scope cancelled before the call gives ``on_cancel``
    without calling it."""
    if scope is not None and scope.cancelled:
        return on_cancel
    return cast(Any, runner.resolve(call(), on_cancel, scope, cancel_after_s))


class AsyncClient:
    """``async with`` for the asyncio clients: :meth:`start` on entry, :meth:`shutdown` on
    exit (an exception in the block included)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def shutdown(self, timeout_ms: int | None = None) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()
