"""A dump of every thread's stack on a signal, safe while threads start and end.

The fault runner asks each coordinator for one when the load ends and before it stops them, so
that a service stuck in a call shows where (:mod:`chaos.coordinators`). ``faulthandler``'s
dump of all threads walks the other threads' states from the C signal handler, without the
interpreter's lock: a thread starting or ending meanwhile (the coordinator starts one per
transactional call it bounds) crashed the process with SIGSEGV, once in a 6-worker run of the
suite, and in a few dozen to a few hundred signals beside threads that come and go. This
handler runs as a Python signal handler instead, in the main thread between two bytecodes: it
takes a snapshot of the threads' frames with the lock held (``sys._current_frames``) and formats
them afterwards, and a second signal during a dump only adds a dump.

What it gives up: it runs only once the main thread runs Python code again. A coordinator's main
thread waits in :meth:`~bridge.coordinator.Coordinator.run_until`, which wakes every 0.2 s;
one stuck in a call that never returns would write no dump.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from types import FrameType


def format_stacks() -> str:
    """Every thread's stack, most recent call last, each headed by the thread's name."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, '?')} ({ident:#x}):\n{stack}")
    return "\n".join(parts)


def dump_stacks_on(signum: int, fd: int = 2) -> None:
    """From now on, signal ``signum`` writes :func:`format_stacks` to file descriptor ``fd``
    (standard error by default). Call it from the main thread."""

    def dump(_signum: int, _frame: FrameType | None) -> None:
        data = memoryview(format_stacks().encode(errors="replace") + b"\n")
        while data:  # a pipe may take part of it
            data = data[os.write(fd, data) :]

    signal.signal(signum, dump)
