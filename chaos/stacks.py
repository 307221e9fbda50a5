"""A dump of every thread's stack on a signal, safe while threads start and end.

The fault runner asks each coordinator for one when the load ends and before it stops them, so
that a service stuck in a call shows where (:mod:`chaos.coordinators`). ``faulthandler``'s
dump of all threads walks the other threads' states from the C signal handler, without the
interpreter's lock: a thread starting or ending meanwhile (the coordinator starts one per
transactional call it bounds) crashed the process with SIGSEGV, once in a 6-worker run of the
suite, and in a few dozen to a few hundred signals beside threads that come and go. This
handler runs as a Python signal handler instead, in the main thread between two bytecodes, with
the lock held, so no thread state changes while it reads them; it writes with one ``write``
call a thread, so a second signal during a dump only adds a dump.
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
        os.write(fd, format_stacks().encode(errors="replace") + b"\n")

    signal.signal(signum, dump)
