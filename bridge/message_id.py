"""Message ids (RocketMQ's ``UNIQ_KEY``), the sender's address and the wall clock."""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import time
from datetime import UTC, datetime
from typing import Final

_HEX_BYTE: Final = tuple(f"{i:02X}" for i in range(256))
"""Upper-case hex of each byte value: an id's counter is two lookups (formatting it with
``:04X`` costs three times as much)."""


def now_ms() -> int:
    """Wall-clock time, epoch milliseconds."""
    return time.time_ns() // 1_000_000


def local_ipv4() -> str:
    """This host's IPv4 address as RocketMQ puts it in ids and ``BORN_HOST``; ``127.0.0.1``
    when the host name does not resolve to one."""
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = "127.0.0.1"
    parts = addr.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return "127.0.0.1"
    return addr


class MessageIdGenerator:
    """RocketMQ-style unique message ids (``UNIQ_KEY``): 32 upper-case hex characters.

    Layout (16 bytes): IPv4 address (4), process id (2), a random per-generator value (4),
    milliseconds since the start of the current month (4), a counter (2). Ids are unique
    within a process (the counter only repeats after 65,536 ids in one millisecond) and across
    processes (address, pid and the random value).
    """

    def __init__(self) -> None:
        ip = local_ipv4()
        self._prefix = (
            bytes(int(part) for part in ip.split(".")).hex().upper()
            + f"{os.getpid() & 0xFFFF:04X}"
            + secrets.token_hex(4).upper()
        )
        self._counter = itertools.count(secrets.randbelow(0x10000))
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._head: tuple[int, str] = (-1, "")
        """(millisecond, the id's first 28 hex characters for it): ids of one millisecond
        differ only in the counter. One tuple, so a thread never sees half an update."""

    def _roll_month(self, now_ms: int) -> None:
        now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def _head_for(self, now_ms: int) -> str:
        if not self._month_start_ms <= now_ms < self._next_month_ms:
            self._roll_month(now_ms)
        head = f"{self._prefix}{(now_ms - self._month_start_ms) & 0xFFFFFFFF:08X}"
        self._head = (now_ms, head)
        return head

    def next_id(self, now_ms: int | None = None) -> str:
        """A new unique id; ``now_ms`` (epoch milliseconds) defaults to the clock."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        ms, head = self._head
        if ms != now:
            head = self._head_for(now)
        count = next(self._counter) & 0xFFFF
        return f"{head}{_HEX_BYTE[count >> 8]}{_HEX_BYTE[count & 0xFF]}"


class SendIdGenerator:
    """Fresh send ids for the delay services' dedup (``BRIDGE_SEND_ID``): 32 lower-case hex
    characters laid out as a version-4 UUID's ``hex``, as ``uuid.uuid4().hex`` wrote them.

    ``uuid4`` reads 16 bytes from the OS for every id (a system call, 3 us on a quiet machine
    and 6-18 us on a loaded one, and each failed message's retry copy needs one). Here the
    first 20 characters (74 random bits, the version and variant nibbles fixed) are drawn once
    per process, again in a forked child, and the last 12 are a 48-bit counter: ids are unique
    within a process until 2**48 of them, and across processes as random 74-bit values are.
    """

    def __init__(self) -> None:
        self._state: tuple[str, itertools.count[int]] = self._fresh()
        os.register_at_fork(after_in_child=self._redraw)

    @staticmethod
    def _fresh() -> tuple[str, itertools.count[int]]:
        rand = secrets.token_hex(10)  # 20 hex characters
        variant = "89ab"[int(rand[16], 16) & 3]
        prefix = f"{rand[:12]}4{rand[13:16]}{variant}{rand[17:]}"
        return prefix, itertools.count()

    def _redraw(self) -> None:
        self._state = self._fresh()

    def next_id(self) -> bytes:
        """A new send id, ASCII."""
        prefix, counter = self._state
        return f"{prefix}{next(counter) & 0xFFFFFFFFFFFF:012x}".encode("ascii")


_SEND_IDS: Final = SendIdGenerator()


def fresh_send_id() -> bytes:
    """A new unique send id (see :class:`SendIdGenerator`), ASCII."""
    return _SEND_IDS.next_id()
