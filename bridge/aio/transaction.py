"""The asyncio ``TransactionMQProducer``: a listener that may be ``async def``.

A front over the threaded :class:`bridge.transaction.TransactionMQProducer`, which keeps every
rule of a transaction: the half message and its properties, the END record after it, an
exception or a result that is not a :class:`TransactionStatus` counting as UNKNOWN, the check
consumer, the check hold and threads, and a bounded shutdown. The front only changes where the
waiting happens:

* ``await send_message_in_transaction(msg, arg)`` runs the threaded call on one of
  ``max_concurrent_sends`` threads of its own: the half message's acknowledgement is waited
  for there, and ``execute_local_transaction``, if it is ``async def``, runs on the event loop
  meanwhile (:mod:`bridge.aio.runner`); a plain one runs on that thread;
* check requests are answered on the threaded producer's check threads
  (``check_thread_pool_size``), an ``async def`` ``check_local_transaction`` on the loop.

Cancelling the task awaiting ``send_message_in_transaction`` before its thread took it up
sends nothing. Once the half message is on its way, it cancels the local transaction: a
listener task running is cancelled, one not started yet never runs. Its state is then UNKNOWN
(the END record says so) and the coordinator checks the transaction back, so
``check_local_transaction`` decides, as after any other UNKNOWN.

Once the event loop has ended without :meth:`TransactionMQProducer.shutdown`, the producer
shuts itself down (logged as an error), leaving its check group to the group's live
producers; a check that found the loop closed is not answered.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from bridge.aio.runner import AsyncClient, CancelScope, LoopRunner, call_listener
from bridge.config import ClientConfig
from bridge.errors import EventLoopClosedError, IllegalStateError, InvalidArgumentError
from bridge.lifecycle import ServiceState
from bridge.message import Message, MessageExt
from bridge.serialization import Serializer
from bridge.transaction.model import TransactionListener, TransactionStatus
from bridge.transaction.producer import TransactionMQProducer as ThreadedTransactionProducer
from bridge.transaction.producer import TransactionSendResult

__all__ = ["TransactionMQProducer"]

_CLOSED_SHUTDOWN_WAIT_S: Final = 60.0
"""How long a check that found the event loop closed waits, at most, for the producer's
shutdown to close check answers, seconds (the shutdown is bounded by ``send_msg_timeout_ms``
twice)."""

DEFAULT_MAX_CONCURRENT_SENDS: Final = 16
"""Transactional sends in progress at once, at most (one thread each); more wait their turn."""


class _Execution:
    """The ``arg`` of one send, with the scope that cancels its local transaction."""

    __slots__ = ("arg", "scope")

    def __init__(self, arg: Any, scope: CancelScope) -> None:
        self.arg = arg
        self.scope = scope


class _OnLoop(TransactionListener):
    """The threaded producer's listener: calls the user's, running what it returns for an
    ``async def`` method on the loop."""

    def __init__(self, listener: object, runner: LoopRunner) -> None:
        self.listener = listener
        self._runner = runner

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        # The asyncio front passes its argument with a cancel scope; a direct call of the
        # threaded producer (``threaded``) passes the argument alone.
        given, scope = (arg.arg, arg.scope) if isinstance(arg, _Execution) else (arg, None)
        execute = self.listener.execute_local_transaction  # type: ignore[attr-defined]
        result: TransactionStatus = call_listener(
            self._runner, lambda: execute(msg, given), TransactionStatus.UNKNOWN, scope
        )
        return result

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        check = self.listener.check_local_transaction  # type: ignore[attr-defined]
        try:
            result: TransactionStatus = call_listener(
                self._runner, lambda: check(msg), TransactionStatus.UNKNOWN
            )
        except EventLoopClosedError:
            # Not run: no answer. The producer is shutting down (the runner started it);
            # once it has, a check answer is no longer sent (this UNKNOWN included), and the
            # coordinator asks the group's live members instead. The wait is bounded by that
            # shutdown's own bound.
            self._runner.closed_handled.wait(_CLOSED_SHUTDOWN_WAIT_S)
            return TransactionStatus.UNKNOWN
        return result


def _complete(listener: object) -> bool:
    """True if ``listener`` has both methods a transaction listener needs."""
    return callable(getattr(listener, "execute_local_transaction", None)) and callable(
        getattr(listener, "check_local_transaction", None)
    )


class TransactionMQProducer(AsyncClient):
    """RocketMQ's transactional producer for asyncio code.

    ``async with TransactionMQProducer("group", listener, bootstrap_servers=...) as p:``
    then ``await p.send_message_in_transaction(msg, arg)``. The listener's
    ``execute_local_transaction`` and ``check_local_transaction`` may each be ``async def``
    (run on the event loop) or plain (run on a worker thread, never on the loop). Arguments
    as for :class:`bridge.TransactionMQProducer`, plus ``max_concurrent_sends``.
    """

    def __init__(
        self,
        group: str,
        listener: object | None,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        config: ClientConfig | None = None,
        check_thread_pool_size: int = 1,
        check_request_hold_max: int = 2000,
        check_timeout_ms: int = 30_000,
        check_topic_partitions: int = 4,
        session_timeout_ms: int = 10_000,
        max_concurrent_sends: int = DEFAULT_MAX_CONCURRENT_SENDS,
        kafka_config: Mapping[str, Any] | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
    ) -> None:
        if isinstance(max_concurrent_sends, bool) or not isinstance(max_concurrent_sends, int):
            raise InvalidArgumentError(
                f"max_concurrent_sends must be an int, got {max_concurrent_sends!r}"
            )
        if max_concurrent_sends < 1:
            raise InvalidArgumentError(
                f"max_concurrent_sends must be positive, got {max_concurrent_sends}"
            )
        self._runner = LoopRunner(f"transaction producer {group}", on_closed=self._stop_closed)
        self._producer = ThreadedTransactionProducer(
            group,
            None,
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            config=config,
            check_thread_pool_size=check_thread_pool_size,
            check_request_hold_max=check_request_hold_max,
            check_timeout_ms=check_timeout_ms,
            check_topic_partitions=check_topic_partitions,
            session_timeout_ms=session_timeout_ms,
            kafka_config=kafka_config,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
        )
        self.set_transaction_listener(listener)
        self.group = group
        self.config = self._producer.config
        self._max_sends = max_concurrent_sends
        self._senders: ThreadPoolExecutor | None = None

    def _stop_closed(self) -> None:
        """Shut down after the event loop ended (see :mod:`bridge.aio.runner`): leave the
        check group so that the coordinator asks the group's live members."""
        self._producer.shutdown()
        senders, self._senders = self._senders, None
        if senders is not None:
            senders.shutdown(wait=False)

    @property
    def listener(self) -> object | None:
        """The listener given."""
        inner = self._producer.listener
        return inner.listener if isinstance(inner, _OnLoop) else inner

    def set_transaction_listener(self, listener: object | None) -> None:
        """RocketMQ's ``setTransactionListener``; before :meth:`start`."""
        # Anything but a complete listener goes to the threaded producer as it is, which
        # refuses it with its own error.
        self._producer.listener = (
            _OnLoop(listener, self._runner) if _complete(listener) else listener  # type: ignore[assignment]
        )

    @property
    def threaded(self) -> ThreadedTransactionProducer:
        """The threaded producer underneath."""
        return self._producer

    @property
    def producer_id(self) -> str:
        """This producer's id in END records."""
        return self._producer.producer_id

    @property
    def state(self) -> ServiceState:
        """The producer's lifecycle state."""
        return self._producer.state

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start sending and answering checks (the topic set-up on a worker thread); listener
        coroutines run on the running loop. Raises without a listener."""
        self._runner.bind(asyncio.get_running_loop())
        await asyncio.to_thread(self._producer.start)
        self._senders = ThreadPoolExecutor(
            self._max_sends, thread_name_prefix=f"bridge-aio-txn-{self.group}"
        )

    async def shutdown(self, timeout_ms: int | None = None) -> None:
        """:meth:`bridge.TransactionMQProducer.shutdown` on a worker thread, with check
        coroutines still running on the loop meanwhile; those still running at its deadline
        are cancelled (their answers would not be sent anyway). Idempotent."""
        await asyncio.to_thread(self._producer.shutdown, timeout_ms)
        self._runner.cancel_all()
        senders, self._senders = self._senders, None
        if senders is not None:
            senders.shutdown(wait=False)

    # --- sending ---------------------------------------------------------------------------
    async def send_message_in_transaction(
        self, msg: Message, arg: Any = None, *, partition: int = -1
    ) -> TransactionSendResult:
        """Store ``msg`` as a half message, run the local transaction, send the decision:
        :meth:`bridge.TransactionMQProducer.send_message_in_transaction`, with the same
        result and typed errors. Cancelling the awaiting task makes the transaction UNKNOWN
        (see the module's docstring)."""
        senders = self._senders
        if senders is None:
            raise IllegalStateError(
                f"transaction producer {self.group} is not running: call start() first"
            )
        scope = CancelScope()
        call = functools.partial(
            self._producer.send_message_in_transaction,
            msg,
            _Execution(arg, scope),
            partition=partition,
        )
        # The threaded call checks the listener, the state and the message, and raises.
        future = asyncio.get_running_loop().run_in_executor(senders, call)
        try:
            return await future
        except asyncio.CancelledError:
            scope.cancel()
            raise
