"""What a consumer holds of one partition (RocketMQ's ``ProcessQueue``). Pure logic.

Every message received stays here until it is done: consumed, safely sent back for retry, or
moved to quarantine. The offset to commit is the smallest one still held, or one past the
highest received when nothing is held, so a committed offset never passes a message that is not
done, however the listener threads finish out of order.

Held messages are counted in number and in bytes (:attr:`ProcessQueue.held`,
:attr:`ProcessQueue.held_bytes`), so the consumer stops fetching a partition that holds too much
(RocketMQ's ``pullThresholdForQueue`` and ``pullThresholdSizeForQueue``).

A listener call registers the messages it runs (:meth:`ProcessQueue.start`) and, when it
returns, learns which of its results still count (:meth:`ProcessQueue.settle`): none once the
partition is released (its next owner consumes them again), and not those of a message taken
from it because it ran past the consume timeout (:meth:`ProcessQueue.overdue`, which the
consumer sends back for retry, as RocketMQ's ``cleanExpireMsg`` does). The messages of the
task running that call which it has not started yet are taken from it too, to run elsewhere:
a listener call that never returns holds only its own messages.

Guarantees kept here (see ``docs/guarantees.md``): G6, G11 (bounds in count and bytes).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence

from bridge.message import MessageExt


class _Held:
    """A held message, its size in bytes, the record it was read from (opaque here), the
    listener call running it since ``since`` (monotonic seconds), if any, and how many of its
    copies (retry, DLQ) were refused for good so far."""

    __slots__ = ("call", "msg", "record", "refusals", "since", "size")

    def __init__(self, msg: MessageExt, size: int, record: object) -> None:
        self.msg = msg
        self.size = size
        self.record = record
        self.call: object = None
        self.since = 0.0
        self.refusals = 0


class Run:
    """One listener task running messages of a partition one after another (a per-message
    listener, see :meth:`ProcessQueue.open_run`), with its bookkeeping kept by the task itself
    instead of a locked step per message.

    The task appends each message its listener consumed to ``consumed`` and, before each call,
    sets ``current``: the message, since when (monotonic seconds) and how many messages
    ``consumed`` held then (one assignment, atomic). :meth:`ProcessQueue.finish` marks what was
    consumed done; :meth:`ProcessQueue.overdue`, taking a message from the run, first marks
    done what the run had consumed before it, so a listener that never returns pins nothing
    it finished.

    The task takes its messages from ``messages`` (or its consume requests from
    ``requests``), an iterator it shares with :meth:`ProcessQueue.overdue`: taking a message
    from the run, that empties the iterator and hands what it held to another task. Each item
    of a shared iterator goes to one side only (its ``next`` is one C call under the GIL), so
    no message is run by both and the task pays nothing per message for it. A task running
    consume requests (no ``current``) is a run too, reached through its :class:`Call`."""

    __slots__ = (
        "consumed",
        "counted",
        "current",
        "done",
        "failed",
        "handed",
        "ignored",
        "levels",
        "messages",
        "requests",
        "settled",
        "taken",
    )

    def __init__(self) -> None:
        self.current: tuple[MessageExt, float, int] | None = None
        self.consumed: list[MessageExt] = []
        self.settled = 0
        """``consumed[:settled]`` were marked done (those still held and not taken)."""
        self.done = 0
        """How many messages the run marked done."""
        self.ignored = 0
        """How many results of the run did not count (taken, or the queue released)."""
        self.counted = 0
        """How much of ``done`` the task counted (kept by the task)."""
        self.taken: set[int] = set()
        """Offsets :meth:`ProcessQueue.overdue` took from the run: their results do not
        count."""
        self.messages: Iterator[MessageExt] | None = None
        """The messages the task has not started, shared with :meth:`ProcessQueue.overdue`."""
        self.requests: Iterator[list[MessageExt]] | None = None
        """The consume requests the task has not started, shared the same way."""
        self.handed: set[int] = set()
        """Offsets :meth:`ProcessQueue.overdue` handed to another task (not started here)."""
        self.failed: list[MessageExt] | None = None
        """The messages the task ran and failed, not sent back yet (shared the same way:
        :meth:`ProcessQueue.overdue` takes them to send back)."""
        self.levels: list[int] | None = None
        """Their delay levels (None: the default level for each)."""


class Call:
    """Identifies one listener call (see :meth:`ProcessQueue.start`) of a task's ``run``: when
    :meth:`ProcessQueue.overdue` takes the call's messages, the run's unstarted messages go
    to another task."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        self.run = run


def message_size(msg: MessageExt) -> int:
    """The bytes ``msg`` counts for while held: its body, and its property names and values (a
    text value counts one byte per character)."""
    return len(msg.body) + sum(len(k) + len(v) for k, v in msg.properties.items())


class ProcessQueue:
    """The messages of one partition between receipt and completion. Thread-safe."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        """The Kafka topic."""
        self.partition = partition
        self._held: OrderedDict[int, _Held] = OrderedDict()
        """By offset, in offset order (see :meth:`put`)."""
        self._bytes = 0
        self._highest = -1
        self._mutex = threading.RLock()
        """Guards the state; taken directly (a C call) on the paths every message takes."""
        self._lock = threading.Condition(self._mutex)
        """The same lock, to wait on (:meth:`wait_idle`) and for :attr:`lock`."""
        self._running = 0
        self._in_call: dict[int, _Held] = {}
        """Held messages a listener call is running, by offset."""
        self._runs: set[Run] = set()
        """Tasks running messages one by one (:meth:`open_run`)."""
        self.dropped = False
        """Set when the partition is revoked or the consumer stops: start no new work."""
        self.released = False
        """Set once the consumer gave the partition up: late listener results are ignored."""
        self.last_committed = -1
        """The offset last committed for this partition (kept by the committing thread)."""
        self.last_metadata = ""
        """The metadata committed with :attr:`last_committed` (kept by the committing thread)."""
        # Orderly consumption only: messages not yet handed to the listener, in order.
        self._pending: deque[MessageExt] = deque()
        self.orderly_scheduled = False
        """An orderly task owns this partition now (set and cleared under :meth:`lock`)."""

    # --- receipt and completion ---------------------------------------------------------
    def put(
        self,
        msgs: Iterable[MessageExt],
        *,
        pending: bool = False,
        sizes: Sequence[int] | None = None,
        records: Sequence[object] | None = None,
    ) -> None:
        """Hold ``msgs``; ``pending`` also queues them for an orderly task. ``sizes`` are their
        sizes in bytes (default: :func:`message_size`), ``records`` what :meth:`record_of`
        returns for them."""
        msgs = list(msgs)
        if sizes is None:
            sizes = [message_size(msg) for msg in msgs]
        if records is None:
            records = [None] * len(msgs)
        with self._mutex:
            held = self._held
            last = next(reversed(held)) if held else -1
            added = 0
            for msg, size, record in zip(msgs, sizes, records, strict=True):
                offset = msg.queue_offset
                if offset > last:  # the usual case: the next offsets of the partition
                    held[offset] = _Held(msg, size, record)
                    last = offset
                else:
                    old = held.pop(offset, None)
                    if old is not None:
                        added -= old.size
                    held[offset] = _Held(msg, size, record)
                    if offset < last:
                        # Kept in offset order: the commit offset is the first key.
                        self._held = held = OrderedDict(sorted(held.items()))
                added += size
            self._bytes += added
            self._highest = max(self._highest, last)
            if pending:
                self._pending.extend(msgs)

    def skip(self, offset: int) -> None:
        """Record an offset that needs no work (filtered out, quarantined)."""
        with self._mutex:
            self._highest = max(self._highest, offset)

    def remove(self, offsets: Iterable[int]) -> None:
        """Mark messages done."""
        with self._mutex:
            for offset in offsets:
                held = self._held.pop(offset, None)
                if held is not None:
                    self._bytes -= held.size
                    self._in_call.pop(offset, None)

    def holds(self, offset: int) -> bool:
        """True if the message at ``offset`` is held (received and not done)."""
        with self._mutex:
            return offset in self._held

    def record_of(self, offset: int) -> object:
        """The record given to :meth:`put` with the message at ``offset``; None if none."""
        with self._mutex:
            held = self._held.get(offset)
            return held.record if held is not None else None

    def note_refusal(self, offset: int) -> int:
        """A copy of the message at ``offset`` was refused for a reason that will not go away
        (too large, not authorized, ...): how many times so far, this one included; 0 if the
        message is not held (done meanwhile)."""
        with self._mutex:
            held = self._held.get(offset)
            if held is None:
                return 0
            held.refusals += 1
            return held.refusals

    def commit_offset(self) -> int | None:
        """The offset to commit (the next to read), or None if nothing was received."""
        with self._mutex:
            if self._held:
                return next(iter(self._held))
            return self._highest + 1 if self._highest >= 0 else None

    @property
    def held(self) -> int:
        """How many messages are received and not done."""
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        """The bytes of the messages received and not done (see :func:`message_size`)."""
        return self._bytes

    def over(self, max_count: int, max_bytes: int) -> bool:
        """True if the held messages reach ``max_count`` or take ``max_bytes`` bytes."""
        return len(self._held) >= max_count or self._bytes >= max_bytes

    # --- listener calls ---------------------------------------------------------------------
    def start(self, call: object, msgs: Iterable[MessageExt], now: float) -> None:
        """``call`` (any object that identifies one listener call) runs ``msgs`` from ``now``
        (monotonic seconds)."""
        with self._mutex:
            for msg in msgs:
                held = self._held.get(msg.queue_offset)
                if held is not None:
                    held.call = call
                    held.since = now
                    self._in_call[msg.queue_offset] = held

    def settle(self, call: object, msgs: Iterable[MessageExt]) -> set[int]:
        """``call`` returned: the offsets of ``msgs`` whose results still count. Not those
        taken by :meth:`overdue` (or by a later call), nor any once the queue is released."""
        return {msg.queue_offset for msg in self._end_call(call, msgs)}

    def withdraw(self, call: object, msgs: Iterable[MessageExt]) -> list[MessageExt]:
        """Take back from ``call`` (whose result cannot be used) the messages of ``msgs`` it
        still runs, to hand them to another: those, in the order given; none once the queue is
        released (the next owner has them). Messages done meanwhile, or taken by
        :meth:`overdue`, are not returned."""
        return self._end_call(call, msgs)

    def _end_call(self, call: object, msgs: Iterable[MessageExt]) -> list[MessageExt]:
        """Detach from ``call`` the messages of ``msgs`` it still runs; return them, in the
        order given (none once the queue is released)."""
        with self._mutex:
            ended: list[MessageExt] = []
            for msg in msgs:
                held = self._held.get(msg.queue_offset)
                if held is None or held.call is not call:
                    continue
                held.call = None
                self._in_call.pop(msg.queue_offset, None)
                if not self.released:
                    ended.append(held.msg)
            return ended

    def overdue(
        self,
        now: float,
        timeout_s: float,
        rest: list[MessageExt] | None = None,
        failed: list[tuple[MessageExt, int]] | None = None,
    ) -> list[MessageExt]:
        """Messages whose listener call started more than ``timeout_s`` before ``now``
        (monotonic seconds), oldest offset first; they are taken from their calls, so those
        calls' results for them will not count. They stay held.

        With ``rest``: the messages that the tasks of those calls (a :class:`Call` of a
        :class:`Run`) have not started yet are taken from them too and added to ``rest`` (for
        another task to run; they stay held); those tasks will not run them."""
        with self._mutex:
            late = sorted(
                (o for o, h in self._in_call.items() if now - h.since > timeout_s),
            )
            for offset in late:
                held = self._in_call.pop(offset)
                call = held.call
                held.call = None
                if rest is not None and isinstance(call, Call):
                    self._hand_off(call.run, rest, failed)
            for run in self._runs:
                current = run.current
                if current is None or now - current[1] <= timeout_s:
                    continue
                offset = current[0].queue_offset
                if offset not in run.taken and offset in self._held:
                    self._settle_run(run, current[2])
                    run.taken.add(offset)
                    late.append(offset)
                    if rest is not None:
                        self._hand_off(run, rest, failed)
            late.sort()
            return [self._held[o].msg for o in late]

    def _hand_off(
        self, run: Run, rest: list[MessageExt], failed: list[tuple[MessageExt, int]] | None
    ) -> None:
        """Take from ``run`` the messages its task has not started (those still held) and
        add them to ``rest``, and those it failed to ``failed`` (with their levels); hold the
        lock."""
        if failed is not None and run.failed is not None:
            # What the task appended before now; an append meanwhile stays the task's (it
            # appends a failed message before its level: count only those with both).
            n = len(run.failed) if run.levels is None else min(len(run.failed), len(run.levels))
            msgs, run.failed[:n] = run.failed[:n], []
            levels = [0] * n
            if run.levels is not None:
                levels, run.levels[:n] = run.levels[:n], []
            failed += [
                (m, level)
                for m, level in zip(msgs, levels, strict=True)
                if m.queue_offset in self._held and m.queue_offset not in run.taken
            ]
        unstarted: list[MessageExt] = []
        if run.messages is not None:
            unstarted += run.messages
        if run.requests is not None:
            for request in run.requests:
                unstarted += request
        held = self._held
        for msg in unstarted:
            if msg.queue_offset in held:
                run.handed.add(msg.queue_offset)
                rest.append(msg)

    # --- runs: one task, messages one by one ----------------------------------------------
    def open_run(self) -> Run:
        """Register a task that runs messages one after another, noting the current one in
        :attr:`Run.current` (instead of :meth:`start` per message: this costs one
        assignment); :meth:`overdue` looks at it. End it with :meth:`close_run`."""
        run = Run()
        with self._mutex:
            self._runs.add(run)
        return run

    def close_run(self, run: Run) -> None:
        """The task of ``run`` ended."""
        with self._mutex:
            self._runs.discard(run)

    def finish(self, run: Run, failed: list[MessageExt]) -> list[MessageExt]:
        """Mark what ``run`` consumed done (:attr:`Run.done` counts them), and return those of
        ``failed`` (messages its listener failed) whose results still count: held, not taken by
        :meth:`overdue`, in the order given. Nothing counts once the queue is released (the
        next owner has the messages)."""
        with self._mutex:
            if self.released:
                run.ignored += len(run.consumed) - run.settled + len(failed)
                run.settled = len(run.consumed)
                return []
            self._settle_run(run, len(run.consumed))
            taken = run.taken
            if taken and failed:
                kept = [m for m in failed if m.queue_offset not in taken]
                run.ignored += len(failed) - len(kept)
                return kept
            return failed

    def _settle_run(self, run: Run, upto: int) -> None:
        """Mark ``run.consumed[run.settled:upto]`` done (not those taken); hold the lock."""
        held = self._held
        taken = run.taken
        done = 0
        for msg in run.consumed[run.settled : upto]:
            offset = msg.queue_offset
            if offset in taken:
                run.ignored += 1
                continue
            entry = held.pop(offset, None)
            if entry is not None:
                self._bytes -= entry.size
                done += 1
        run.settled = max(run.settled, upto)
        run.done += done

    def withdraw_run(self, run: Run, msgs: Iterable[MessageExt]) -> list[MessageExt]:
        """Take back from ``run`` (whose results cannot be used) those of ``msgs`` still held
        and neither taken nor handed to another task by :meth:`overdue`, in the order given;
        none once released. Its unstarted messages can no longer be handed off."""
        with self._mutex:
            run.messages = run.requests = run.failed = run.levels = None
            if self.released:
                return []
            taken, handed = run.taken, run.handed
            return [
                m
                for m in msgs
                if m.queue_offset not in taken
                and m.queue_offset not in handed
                and m.queue_offset in self._held
            ]

    # --- running work ---------------------------------------------------------------------
    def begin(self) -> bool:
        """Count a listener task as running; False (and nothing counted) once dropped."""
        with self._mutex:
            if self.dropped:
                return False
            self._running += 1
            return True

    def end(self) -> None:
        """A listener task counted by :meth:`begin` finished."""
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._lock.notify_all()

    @property
    def running(self) -> int:
        """How many listener tasks run now."""
        return self._running

    def drop(self) -> None:
        """Start no new work (revoked, or the consumer stops)."""
        with self._mutex:
            self.dropped = True

    def release(self) -> None:
        """The consumer gave the partition up: results of calls still running are ignored."""
        with self._mutex:
            self.dropped = True
            self.released = True

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for running tasks to finish; True if none remain."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._running:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def drop_and_drain(self, timeout_s: float) -> bool:
        """Mark dropped and wait up to ``timeout_s`` for running calls; True if none remain."""
        self.drop()
        return self.wait_idle(timeout_s)

    # --- orderly --------------------------------------------------------------------------
    @property
    def lock(self) -> threading.Condition:
        """The queue's lock, for callers that combine several steps."""
        return self._lock

    def take(self, count: int) -> list[MessageExt]:
        """Up to ``count`` pending messages, oldest first (orderly)."""
        with self._mutex:
            n = min(count, len(self._pending))
            return [self._pending.popleft() for _ in range(n)]

    def enqueue(self, msgs: Iterable[MessageExt]) -> None:
        """Queue held messages for an orderly task, in order (see :meth:`put`)."""
        with self._mutex:
            self._pending.extend(msgs)

    def put_back(self, msgs: list[MessageExt]) -> None:
        """Return messages taken by :meth:`take` to the head, in order (orderly retry)."""
        with self._mutex:
            self._pending.extendleft(reversed(msgs))
