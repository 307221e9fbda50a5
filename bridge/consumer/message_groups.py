"""Which message runs next in FIFO consumption (RocketMQ 5's FIFO consumer groups). Pure logic.

Messages wait in lanes, one lane per message group of each partition, in the order they were
received (offset order). A lane has at most one message out at a time: taken by a listener,
or failed and waiting to be retried in place. Only once that message is settled (consumed,
dead-lettered, or put back and its retry due) does the lane offer its next one, so a group's
messages are consumed one at a time and in send order, and a failing message holds up its
own group only. Lanes with a message to offer take turns (first ready, first taken), however
many lanes a partition has.

A message without a group is a lane of its own, so such messages run in parallel, as normal
messages do. What is committed is not decided here: every message stays held in its
:class:`~bridge.consumer.process_queue.ProcessQueue` until it is done, so the committed offset
never passes a message waiting in a lane or out of one (G6).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from bridge.message import MessageConst, MessageExt

T = TypeVar("T")

GroupKey = bytes | int
"""A lane's group within its partition: the message group as bytes (UTF-8 for text), or, for
a message without one, its offset (an ``int``, a lane of its own)."""


def group_of(msg: MessageExt, record_key: Callable[[], object]) -> GroupKey:
    """The lane group of ``msg``: its message group (``__SHARDINGKEY``, where RocketMQ 5 keeps
    it, and whence the bridge's producer takes the record key); for a record another Kafka
    client wrote (no message id header), its record key (``record_key()``, called only then),
    as Kafka orders by key; else, or for an empty one, its own offset (no group)."""
    group = msg.sharding_key
    if group is not None:
        return (group.encode() if isinstance(group, str) else group) or msg.queue_offset
    if msg.get_property(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) is None:
        key = record_key()
        if isinstance(key, bytes) and key:
            return key
    return msg.queue_offset


Lane = tuple[Hashable, GroupKey]
"""A lane: its owner (the partition's queue) and its group."""


class GroupLanes(Generic[T]):
    """The waiting messages of every partition, in lanes by group. Not thread-safe: the caller
    holds one lock around each call."""

    __slots__ = ("_lanes", "_out", "_owners", "_ready")

    def __init__(self) -> None:
        self._lanes: dict[Lane, deque[T]] = {}
        """Waiting messages of each lane, oldest first; a lane with none is removed, unless
        one of its messages is out."""
        self._out: set[Lane] = set()
        """Lanes with a message out (taken and not yet released)."""
        self._ready: deque[Lane] = deque()
        """Lanes that may offer their head, in the order they became ready. An entry may be
        stale (its lane forgotten or emptied since): :meth:`take` skips those."""
        self._owners: dict[Hashable, set[GroupKey]] = {}
        """Each owner's groups with a lane, to forget them together."""

    def add(self, owner: Hashable, group: GroupKey, item: T) -> None:
        """Queue ``item`` at the tail of the lane ``(owner, group)``."""
        lane = (owner, group)
        waiting = self._lanes.get(lane)
        if waiting is None:
            waiting = self._lanes[lane] = deque()
            self._owners.setdefault(owner, set()).add(group)
        waiting.append(item)
        if len(waiting) == 1 and lane not in self._out:
            self._ready.append(lane)

    def push_front(self, owner: Hashable, group: GroupKey, items: list[T]) -> None:
        """Queue ``items`` (in their order) at the head of the lane ``(owner, group)``, ahead
        of its waiting ones; a lane out stays out until :meth:`release`."""
        lane = (owner, group)
        waiting = self._lanes.get(lane)
        if waiting is None:
            waiting = self._lanes[lane] = deque()
            self._owners.setdefault(owner, set()).add(group)
        was_empty = not waiting
        waiting.extendleft(reversed(items))
        if was_empty and items and lane not in self._out:
            self._ready.append(lane)

    def take(self) -> tuple[Lane, T] | None:
        """The head of the lane ready longest, now out (its lane offers nothing more until
        :meth:`release`); None if no lane is ready."""
        ready, lanes, out = self._ready, self._lanes, self._out
        while ready:
            lane = ready.popleft()
            waiting = lanes.get(lane)
            if not waiting or lane in out:
                continue  # stale: forgotten, emptied or out since it became ready
            out.add(lane)
            return lane, waiting.popleft()
        return None

    def put_back(self, lane: Lane, items: list[T]) -> None:
        """Return ``items`` (taken from ``lane``, in their order) to its head; the lane stays
        out until :meth:`release`. Nothing if the lane's owner was forgotten meanwhile."""
        if lane not in self._out:
            return
        waiting = self._lanes.get(lane)
        if waiting is None:
            waiting = self._lanes[lane] = deque()
            self._owners.setdefault(lane[0], set()).add(lane[1])
        waiting.extendleft(reversed(items))

    def release(self, lane: Lane) -> bool:
        """The message out of ``lane`` is settled: the lane offers its next (or put back) one.
        True if the lane is ready now."""
        if lane not in self._out:
            return False
        self._out.discard(lane)
        waiting = self._lanes.get(lane)
        if waiting:
            self._ready.append(lane)
            return True
        if waiting is not None:
            del self._lanes[lane]
            groups = self._owners.get(lane[0])
            if groups is not None:
                groups.discard(lane[1])
                if not groups:
                    del self._owners[lane[0]]
        return False

    def forget(self, owner: Hashable) -> int:
        """Drop every lane of ``owner`` (its partition was given up), waiting and out; return
        how many messages were waiting. A later :meth:`release` or :meth:`put_back` of one of
        its lanes does nothing."""
        dropped = 0
        for group in self._owners.pop(owner, ()):
            lane = (owner, group)
            dropped += len(self._lanes.pop(lane, ()))
            self._out.discard(lane)
        return dropped

    @property
    def ready(self) -> int:
        """Lanes that may offer a message now (at most; stale entries count until skipped)."""
        return len(self._ready)

    @property
    def waiting(self) -> int:
        """Messages waiting in lanes (not those out)."""
        return sum(len(waiting) for waiting in self._lanes.values())

    def is_out(self, lane: Lane) -> bool:
        """True if a message of ``lane`` is out."""
        return lane in self._out
