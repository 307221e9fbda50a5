"""Pacing of check-back per producer group: which check of which transaction awaits its answer,
and how many may await one at once. Pure logic, no I/O.

RocketMQ's broker counts a check when it sends it (``TRANSACTION_CHECK_TIMES`` is raised
before the request goes out, whether or not a producer takes it), and its producer holds
``checkRequestHoldMax`` (2000) requests and drops the rest; under a storm of checks,
transactions are discarded whose producer was never asked. Here a check counts once a
producer of the group answered it (UNKNOWN included), or once it found no live producer
(see ``docs/guarantees.md``, G4); so the coordinator sends each group no more checks than
its window of unanswered ones, and the rest wait, due, for room:

* the window starts at :data:`CHECK_WINDOW_MAX` (RocketMQ's ``checkRequestHoldMax``), grows
  by one with each answer up to it, and halves (down to :data:`CHECK_WINDOW_MIN`) each time a
  check of a group with a live producer goes unanswered for a check interval: producers slower
  than the window are sent what they take;
* a check unanswered after a check interval is asked again (not counted) while the group has
  a live producer; with none, it counts. Asked :data:`UNANSWERED_ASKS_MAX` times and
  unanswered each time, it counts too when no check of its group was answered for a check
  interval: a producer can be live and take no checks (every check thread in a call that never
  returns, its check hold full), and RocketMQ counts every check. A group whose producers
  answer, only slower than it is asked, is asked again instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

CHECK_WINDOW_MAX: Final = 2000
"""Unanswered checks a coordinator keeps out per producer group, at most (RocketMQ's
``checkRequestHoldMax`` default: what one producer holds)."""
CHECK_WINDOW_MIN: Final = 10
"""The window never shrinks below this many checks."""
CHECK_WINDOW_START: Final = 100
"""A group's window before any answer came back."""
UNANSWERED_ASKS_MAX: Final = 2
"""A check asked this many times, unanswered each time for a check interval, counts even while
its group has a live producer."""
ANSWER_TARGET_MS: Final = 300
"""Answers that take longer than this from request to coordinator shrink the window, ms."""


@dataclass(frozen=True, slots=True)
class AwaitedCheck:
    """A check sent and not answered yet."""

    partition: int
    """The HALF partition of its transaction."""
    group: str
    check_times: int
    """The check's number (the request's ``check_times``: this check included)."""
    sent_ms: int
    """When it was sent, epoch ms."""
    asks: int = 1
    """How many times this check was sent, unanswered each time before this one."""


class CheckPacing:
    """Awaited checks by transaction id, and each producer group's window."""

    def __init__(
        self,
        check_interval_ms: int,
        *,
        window_max: int = CHECK_WINDOW_MAX,
        window_min: int = CHECK_WINDOW_MIN,
        window_start: int = CHECK_WINDOW_START,
        answer_target_ms: int = ANSWER_TARGET_MS,
    ) -> None:
        if not 1 <= window_min <= window_start <= window_max:
            raise ValueError(
                "need 1 <= window_min <= window_start <= window_max, got "
                f"{window_min}, {window_start}, {window_max}"
            )
        self._interval_ms = check_interval_ms
        self._max = window_max
        self._min = window_min
        self._start = window_start
        self._target_ms = answer_target_ms
        self._awaited: dict[str, AwaitedCheck] = {}
        self._in_flight: Counter[str] = Counter()
        self._window: dict[str, int] = {}
        self._shrunk_ms: dict[str, int] = {}
        """Group -> when its window last shrank for late answers, epoch ms."""
        self._halved_ms: dict[str, int] = {}
        """Group -> when its window last halved for an unanswered check, epoch ms."""
        self._answer_ms: dict[str, int] = {}
        """Group -> when an answer to one of its checks was last read, epoch ms."""

    def __len__(self) -> int:
        return len(self._awaited)

    def window(self, group: str) -> int:
        """How many unanswered checks ``group`` may have at once."""
        return self._window.get(group, self._start)

    def in_flight(self, group: str) -> int:
        """How many checks of ``group`` await an answer."""
        return self._in_flight[group]

    def room(self, group: str) -> int:
        """How many more checks ``group`` may be sent now."""
        return max(self.window(group) - self._in_flight[group], 0)

    def awaited(self, transaction_id: str) -> AwaitedCheck | None:
        """The check of ``transaction_id`` that awaits its answer, if any."""
        return self._awaited.get(transaction_id)

    def sent(
        self,
        transaction_id: str,
        partition: int,
        group: str,
        check_times: int,
        now_ms: int,
        *,
        asks: int = 1,
    ) -> None:
        """Check ``check_times`` of ``transaction_id`` was sent at ``now_ms``, for the
        ``asks``-th time (the earlier ones went unanswered)."""
        self._drop(transaction_id)
        self._awaited[transaction_id] = AwaitedCheck(partition, group, check_times, now_ms, asks)
        self._in_flight[group] += 1

    def answered(self, transaction_id: str, check_times: int, now_ms: int) -> AwaitedCheck | None:
        """An answer to check ``check_times`` of ``transaction_id`` (0: a producer that does
        not say which) was read at ``now_ms``: the awaited check it answers (no longer
        awaited; its group's window follows how long the answer took), or None when it answers
        none awaited."""
        awaited = self._awaited.get(transaction_id)
        if awaited is None or check_times not in (0, awaited.check_times):
            return None
        self._drop(transaction_id)
        group = awaited.group
        self._answer_ms[group] = now_ms
        if now_ms - awaited.sent_ms <= self._target_ms:
            self._window[group] = min(self.window(group) + 1, self._max)
        elif now_ms - self._shrunk_ms.get(group, -self._target_ms) >= self._target_ms:
            self._shrunk_ms[group] = now_ms
            self._window[group] = max(self.window(group) * 3 // 4, self._min)
        return awaited

    def answering(self, group: str, now_ms: int) -> bool:
        """Whether an awaited check of ``group`` was answered within the last check
        interval."""
        last = self._answer_ms.get(group)
        return last is not None and now_ms - last < self._interval_ms

    def unanswered(self, transaction_id: str, now_ms: int, *, live: bool) -> AwaitedCheck | None:
        """The awaited check of ``transaction_id`` went unanswered (a check interval passed):
        no longer awaited. When its group has a live producer (``live``), the group's window
        halves, at most once per check interval: its producers take fewer than they are
        sent."""
        awaited = self._drop(transaction_id)
        if awaited is None or not live:
            return awaited
        group = awaited.group
        if now_ms - self._halved_ms.get(group, -self._interval_ms) >= self._interval_ms:
            self._halved_ms[group] = now_ms
            self._window[group] = max(self.window(group) // 2, self._min)
        return awaited

    def forget(self, transaction_id: str) -> None:
        """``transaction_id`` was decided: no answer is awaited any more."""
        self._drop(transaction_id)

    def forget_partitions(self, partitions: set[int]) -> None:
        """The checks of the transactions of ``partitions`` (revoked) are awaited no more."""
        for tid in [t for t, a in self._awaited.items() if a.partition in partitions]:
            self._drop(tid)

    def forget_older(self, before_ms: int) -> list[str]:
        """Drop checks sent before ``before_ms`` (their transactions left this coordinator's
        view without an answer); returns their transaction ids."""
        old = [t for t, a in self._awaited.items() if a.sent_ms < before_ms]
        for tid in old:
            self._drop(tid)
        return old

    def _drop(self, transaction_id: str) -> AwaitedCheck | None:
        awaited = self._awaited.pop(transaction_id, None)
        if awaited is not None:
            self._in_flight[awaited.group] -= 1
            if not self._in_flight[awaited.group]:
                del self._in_flight[awaited.group]
        return awaited
