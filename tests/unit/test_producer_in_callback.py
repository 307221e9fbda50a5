"""What a ``send_async`` callback may do with its own producer, without a broker (an address
nobody listens on, so every send times out and its callback runs on the producer's delivery
thread, the only thread serving its reports)."""

from __future__ import annotations

import threading
import time

from bridge import ClientConfig, Message, Producer
from bridge.errors import IllegalStateError, SendTimeoutError

NOWHERE = "127.0.0.1:1"


def test_a_send_in_a_callback_finding_the_queue_full_fails_at_once() -> None:
    # The local queue holds one message, the one whose report is being served. Waiting for
    # room there waited send_msg_timeout_ms (every report behind it held) for room only
    # this thread could make.
    config = ClientConfig(
        bootstrap_servers=NOWHERE,
        send_msg_timeout_ms=1000,
        kafka={"queue.buffering.max.messages": "1"},
    )
    outcomes: list[tuple[type[BaseException], float]] = []
    done = threading.Event()
    with Producer("pg", config=config) as producer:

        def on_exception(error: Exception) -> None:
            started = time.monotonic()
            try:
                producer.send_async(Message("t", b"again"))
            except Exception as exc:
                outcomes.append((type(exc), time.monotonic() - started))
            try:
                producer.send_sync(Message("t", b"waits"))
            except Exception as exc:
                outcomes.append((type(exc), 0.0))
            done.set()

        producer.send_async(Message("t", b"first"), on_exception=on_exception)
        assert done.wait(20)
        producer._sender.pump.kafka.purge()
    (full, full_s), (sync, _) = outcomes
    assert full is SendTimeoutError and full_s < 0.5
    assert sync is IllegalStateError
