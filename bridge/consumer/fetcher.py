"""A push consumer's fetcher: the one thread that talks to the Kafka consumer.

It polls, holds what each poll brings in the partitions' :class:`ProcessQueue` (see
:mod:`bridge.consumer.intake`) and hands it to the consumption strategy; pauses a partition
that holds too much and resumes it once drained; takes and gives up partitions on a rebalance
(or, BROADCASTING, takes every partition of the subscribed topics, looking for new ones every
:data:`_BROADCAST_REFRESH_S`); commits each partition's smallest offset not done; and runs the
consumer's deferred work. Rebalance callbacks run inside ``consume()``, on this thread too.

A listener measured fast runs on this thread too, after each poll (see
:mod:`bridge.consumer.listener_path`). A watchdog thread sees to it that no listener holds the
poll loop: once a poll's listener work has run for :data:`HELD_TOO_LONG_S` (less for a short
``consume_timeout``), the poll loop goes on on a new thread, what the held thread had not
started goes to the pool at once, and the held thread ends once its listener returns. So
heartbeats, rebalances, commits, ``consume_timeout`` and ``max.poll.interval.ms`` never wait
for a listener, even one that never returns, nor does the rest of its poll.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

from bridge.consumer.commits import OffsetCommits
from bridge.consumer.consumption import Strategy
from bridge.consumer.context import ConsumerContext
from bridge.consumer.intake import Intake, Key
from bridge.consumer.model import ConsumeFromWhere
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Quarantine
from bridge.consumer.tuning import fetch_tuning, group_tuning
from bridge.kafka.clients import new_consumer
from bridge.message import MessageExt
from bridge.observability.metrics import active_metrics
from topics.naming import broadcast_group

logger = logging.getLogger(__name__)

_POLL_TIMEOUT_S: Final = 0.1
_PAUSED_POLL_TIMEOUT_S: Final = 0.005
"""The poll timeout while a partition is paused, seconds: its listeners may drain it at any
moment, and a paused partition fetches nothing, so waiting the full timeout would idle it."""
_MAX_RECORDS_PER_POLL: Final = 1000
_MIN_RECORDS_PER_POLL: Final = 100
_BROADCAST_REFRESH_S: Final = 30.0
"""How often a BROADCASTING consumer looks for new partitions, seconds."""
_WAIT_SLICE_S: Final = 0.1
"""Waits for running listeners look at the shutdown deadline this often, seconds."""
CLOSE_GRACE_S: Final = 5.0
"""What a shutdown allows beyond its timeout for closing the Kafka consumer (leaving the
group), seconds."""
_GAUGE_INTERVAL_S: Final = 1.0
"""How often the held-message gauges are updated while metrics are on, seconds."""
HELD_TOO_LONG_S: Final = 1.0
"""The longest a poll's listener work holds the poll thread before the poll loop moves to a
new thread, seconds (a quarter of ``consume_timeout`` when that is shorter)."""
_WATCH_INTERVAL_S: Final = 0.05
"""How often, at most, the watchdog looks at the poll thread while it runs listeners, s."""
_WATCH_IDLE_S: Final = 1.0
"""How long the watchdog sleeps while the poll thread runs no listener, at most, s (it is
woken when the poll thread starts running some)."""


class Fetcher:
    """Polls Kafka for one consumer and keeps its partitions' queues and offsets.

    ``topic_names``: the RocketMQ name of each Kafka topic to read; ``retry_kafka_topic``: the
    group's retry topic among them ("" if not read)."""

    def __init__(
        self,
        context: ConsumerContext,
        consumption: Strategy,
        quarantine: Quarantine,
        topic_names: dict[str, str],
        retry_kafka_topic: str,
        *,
        on_poll_thread: Callable[[], None] | None = None,
    ) -> None:
        self._context = context
        self._on_poll_thread = on_poll_thread
        """Called first on each poll thread (a listener may run there)."""
        self._consumption = consumption
        self._quarantine = quarantine
        self._topic_names = topic_names
        self._retry_kafka_topic = retry_kafka_topic
        self.queues: dict[Key, ProcessQueue] = {}
        """The partitions held now."""
        self.paused: set[Key] = set()
        """Partitions paused for holding too much."""
        self._kafka: Any = None
        self._intake: Intake | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._revoke_wait_s = 0.0
        """How long a revoke waits for running listeners, seconds (CLUSTERING)."""
        self._commits = OffsetCommits(context.group, self.queues, consumption)
        self._last_refresh = 0.0
        self._last_gauges = 0.0
        self._gauged_topics: set[str] = set()
        """Topics whose held-message gauges were set (zeroed once nothing is held)."""
        self._baton = threading.Lock()
        """Guards :attr:`_thread` and :attr:`_here_since` between the poll thread running
        listeners and the watchdog moving the poll loop."""
        self._here_since = 0.0
        """When the poll thread began running listeners (monotonic s; 0: it does not)."""
        self._here_left: deque[tuple[ProcessQueue, list[MessageExt]]] = deque()
        """What the poll thread running listeners has not started yet (guarded by
        :attr:`_baton`): whoever moves the poll loop off it hands these to the pool at once,
        so they never wait for a listener that may never return."""
        self._held: list[threading.Thread] = []
        """Poll threads the watchdog moved the poll loop off, maybe still held by a listener
        (guarded by :attr:`_baton`): while one is, no listener runs on the poll thread, so a
        listener that hangs now and then holds one poll thread at most, not one more each
        time it measures fast again."""
        self._here_began = threading.Event()
        """Set when the poll thread begins running listeners: wakes the watchdog."""
        self._closed = threading.Event()
        """Set once the last poll thread gave its partitions up and closed the consumer."""

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Create the Kafka consumer, join the group (CLUSTERING) or take every partition
        (BROADCASTING), and start the poll thread."""
        context = self._context
        group, config, settings = context.group, context.config, context.settings
        reset = (
            "earliest"
            if settings.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            else "latest"
        )
        if context.broadcasting:
            instance = settings.instance_name or f"{socket.gethostname()}@{os.getpid()}"
            self._kafka = new_consumer(
                config,
                broadcast_group(group, instance),
                f"{group}-broadcast",
                statistics=True,
                auto_offset_reset=reset,
                **fetch_tuning(config),
            )
        else:
            tuning = group_tuning(group, config, settings, orderly=self._consumption.in_place)
            self._revoke_wait_s = tuning.revoke_wait_s
            if self._consumption.cooperative:
                tuning.options["partition_assignment_strategy"] = "cooperative-sticky"
            self._kafka = new_consumer(
                config,
                group,
                f"{group}-consumer",
                statistics=True,
                on_commit=self._commits.on_commit,
                auto_offset_reset=reset,
                **fetch_tuning(config),
                **tuning.options,
            )
        self._commits.kafka = self._kafka
        self._intake = Intake(
            context, self.queues, self._kafka, self._topic_names, self._retry_kafka_topic
        )
        if context.broadcasting:
            self._assign_new_partitions()
        else:
            self._kafka.subscribe(
                list(self._topic_names),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        self._thread = self._poll_thread()
        self._thread.start()
        if self._consumption.may_run_here():
            threading.Thread(
                target=self._watch, name=f"bridge-consumer-watch-{group}", daemon=True
            ).start()

    def _poll_thread(self) -> threading.Thread:
        return threading.Thread(
            target=self._run, name=f"bridge-consumer-{self._context.group}", daemon=True
        )

    def resubscribe(self) -> None:
        """Subscribe the Kafka consumer to the topics of ``topic_names`` as they are now (a
        :class:`~bridge.SimpleConsumer` changed its subscriptions while running; the
        rebalance that follows takes and gives up partitions as usual). Call on the poll
        thread (through the scheduler)."""
        if self._kafka is None or self._context.broadcasting:
            return
        self._kafka.subscribe(
            list(self._topic_names),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def stop_within(self, timeout_ms: int) -> None:
        """Stop for a shutdown that must be done in ``timeout_ms`` (ms): no wait of the
        consumer's parts goes past that (the context's deadline), and the poll thread gets
        :data:`CLOSE_GRACE_S` more to close the Kafka consumer (leave the group)."""
        self._context.deadline = time.monotonic() + timeout_ms / 1000
        self.stop(timeout_ms / 1000 + CLOSE_GRACE_S)

    def stop(self, join_timeout_s: float) -> None:
        """Stop polling; wait up to ``join_timeout_s`` for the poll thread to give its
        partitions up (see :meth:`_release`, bounded by the shutdown deadline) and close the
        Kafka consumer."""
        self._stopping.set()
        thread = self._thread
        # The poll loop may move to another thread meanwhile (see _watch): wait for the one
        # that closes the consumer, whichever it is.
        if (
            thread is not None
            and thread is not threading.current_thread()
            and not self._closed.wait(join_timeout_s)
        ):
            logger.warning(
                "push consumer %s: the Kafka consumer is still closing; not waiting",
                self._context.group,
            )

    # --- the poll thread -----------------------------------------------------------------
    def _run(self) -> None:
        kafka = self._kafka
        me = threading.current_thread()
        if self._on_poll_thread is not None:
            self._on_poll_thread()
        try:
            while not self._stopping.is_set():
                try:
                    self._poll_once()
                except Exception:
                    logger.exception("push consumer %s: poll loop error", self._context.group)
                    self._stopping.wait(1.0)
                if self._thread is not me:
                    return  # the poll loop went on on another thread (see _watch)
        finally:
            if self._thread is me:
                try:
                    self._release(list(self.queues), math.inf)
                    kafka.close()
                except Exception:
                    logger.exception(
                        "push consumer %s: closing the Kafka consumer", self._context.group
                    )
                finally:
                    self._closed.set()

    def _watch(self) -> None:
        """The watchdog: once the poll thread has run listeners for longer than
        :data:`HELD_TOO_LONG_S` (or a quarter of ``consume_timeout``), start a new poll
        thread; the held one ends once its listener returns (see :meth:`_run_here`)."""
        limit_s = min(HELD_TOO_LONG_S, self._context.settings.consume_timeout * 60 / 4)
        interval_s = min(_WATCH_INTERVAL_S, limit_s / 4)
        while not self._closed.is_set():
            self._here_began.wait(_WATCH_IDLE_S)
            if self._closed.wait(interval_s):
                return
            with self._baton:
                since = self._here_since
                if not since:
                    self._here_began.clear()  # under the lock: a new begin sets it again
                    continue
                held_s = time.monotonic() - since
                if held_s < limit_s:
                    continue
                self._here_since = 0.0
                rest = list(self._here_left)
                self._here_left.clear()  # the held thread starts none of them now
                if self._thread is not None:
                    self._held.append(self._thread)
                self._thread = thread = self._poll_thread()
                thread.start()  # under the lock, as the held thread reads _thread
            self._hand_to_pool(rest)
            logger.warning(
                "push consumer %s: a listener has held the poll thread %.1f s; polling goes on "
                "on a new thread",
                self._context.group,
                held_s,
            )
            self._consumption.held_too_long(held_s)

    def _run_here(self) -> bool:
        """Run on this (the poll) thread what the strategy kept for it from the poll. False
        if the poll loop moved to another thread meanwhile (a listener held this one too
        long): what this thread had not started then went to the pool, and it polls no more.

        A listener's exception of any kind, ``SystemExit`` included, ends neither this loop
        nor the poll loop: the strategy has already sent its messages back, as a pool task's
        would be, and the rest of the poll still runs."""
        here = self._consumption.taken_here()
        if not here:
            return True
        with self._baton:
            self._held = [thread for thread in self._held if thread.is_alive()]
            elsewhere = bool(self._held)
        if elsewhere:
            # A listener still holds an earlier poll thread: the pool, not a second hold.
            self._hand_to_pool(here)
            return True
        me = threading.current_thread()
        left = deque(here)
        with self._baton:
            self._here_since = time.monotonic()
            self._here_left = left
            self._here_began.set()
        try:
            while True:
                with self._baton:
                    if self._thread is not me:
                        # Moved on: what the watchdog did not hand over yet goes now.
                        rest = list(left)
                        left.clear()
                        break
                    if not left or self._stopping.is_set():
                        # Stopping: start nothing more (as a listener thread stops at its next
                        # request once shutdown drops the partitions); the rest stays held,
                        # never committed past, and the group consumes it again.
                        rest = []
                        break
                    pq, msgs = left.popleft()
                try:
                    self._consumption.run_here(pq, msgs)
                except BaseException:  # as a pool task's: logged, the loop lives
                    logger.exception(
                        "push consumer %s: a listener escaped on the poll thread; its messages "
                        "run again",
                        self._context.group,
                    )
        finally:
            with self._baton:
                self._here_since = 0.0
                still = self._thread is me
        self._hand_to_pool(rest)
        return still

    def _hand_to_pool(self, work: list[tuple[ProcessQueue, list[MessageExt]]]) -> None:
        """Queue ``work``, poll-thread work not started, for the listener threads."""
        for pq, msgs in work:
            try:
                self._consumption.submit(pq, msgs)
            except Exception:  # the pool is shut down: they stay held, never committed past
                logger.exception(
                    "push consumer %s: %d messages of %s[%d] not handed to the listener "
                    "threads; they will be redelivered",
                    self._context.group,
                    len(msgs),
                    pq.topic,
                    pq.partition,
                )

    def _poll_once(self) -> None:
        context = self._context
        settings = context.settings
        if context.broadcasting and time.monotonic() - self._last_refresh > _BROADCAST_REFRESH_S:
            self._assign_new_partitions()
        context.scheduler.run_due()
        self._consumption.expire_overdue(self.queues.values())
        self._resume_drained()
        limit = min(
            _MAX_RECORDS_PER_POLL,
            max(_MIN_RECORDS_PER_POLL, settings.pull_batch_size * len(self.queues)),
        )
        timeout = _PAUSED_POLL_TIMEOUT_S if self.paused else _POLL_TIMEOUT_S
        records = self._kafka.consume(num_messages=limit, timeout=timeout)
        if records:
            self._receive(records)
        # Unconditionally: what a poll that failed half-way kept for this thread runs now.
        if not self._run_here():
            return  # the poll loop is another thread's now
        if self._consumption.commit_wanted() or time.monotonic() - self._commits.last_commit >= (
            settings.persist_consumer_offset_interval_ms / 1000
        ):
            self._commits.commit(list(self.queues), asynchronous=True)
        if time.monotonic() - self._last_gauges >= _GAUGE_INTERVAL_S:
            self._update_gauges()

    def _update_gauges(self) -> None:
        """Set ``rocketmq_consumer_cached_messages`` and ``_bytes`` per topic (RocketMQ
        name) from the partitions held, while metrics are on."""
        self._last_gauges = time.monotonic()
        metrics = active_metrics()
        if metrics is None:
            return
        held: dict[str, list[int]] = {topic: [0, 0] for topic in self._gauged_topics}
        for (kafka_topic, _), pq in list(self.queues.items()):
            counts = held.setdefault(self._topic_names.get(kafka_topic, kafka_topic), [0, 0])
            counts[0] += pq.held
            counts[1] += pq.held_bytes
        namespace, group = self._context.config.namespace, self._context.group
        for topic, (count, size) in held.items():
            metrics.cached_messages.labels(namespace, topic, group).set(count)
            metrics.cached_bytes.labels(namespace, topic, group).set(size)
        self._gauged_topics = set(held)

    def _receive(self, records: list[Any]) -> None:
        """Hold and dispatch ``records``, each on its own: one that cannot be handled goes to
        quarantine with the reason, and the rest of the batch proceeds."""
        assert self._intake is not None  # set by start()
        settings = self._context.settings
        max_count = settings.pull_threshold_for_queue
        max_bytes = settings.pull_threshold_size_for_queue << 20
        for key, incoming in self._intake.sort(records).items():
            pq = self.queues[key]
            pq.put(incoming.msgs, sizes=incoming.sizes, records=incoming.records)
            for record, reason in incoming.poison:
                self._quarantine.send(record, pq, reason)
            if incoming.work:
                self._consumption.receive(pq, incoming.work)
            if key not in self.paused and pq.over(max_count, max_bytes):
                self._kafka.pause([TopicPartition(*key)])
                self.paused.add(key)

    def _resume_drained(self) -> None:
        if not self.paused:
            return
        count = self._context.settings.pull_threshold_for_queue
        size = self._context.settings.pull_threshold_size_for_queue << 20
        ready = [
            key
            for key in self.paused
            if key not in self.queues or not self.queues[key].over(count, size)
        ]
        for key in ready:
            self.paused.discard(key)
            if key in self.queues:
                self._kafka.resume([TopicPartition(*key)])

    # --- rebalance -----------------------------------------------------------------------
    def _start_positions(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Committed offsets where the group has them; else the retry topic from its start
        and other topics by ``consume_from_where``."""
        group, config, settings = self._context.group, self._context.config, self._context.settings
        try:
            committed = self._kafka.committed(partitions, timeout=config.request_timeout_ms / 1000)
        except Exception as exc:
            logger.warning("push consumer %s: committed offsets unknown (%s)", group, exc)
            return partitions
        where = settings.consume_from_where
        stamp: list[TopicPartition] = []
        out: list[TopicPartition] = []
        for tp in committed:
            if tp.offset >= 0:
                out.append(tp)
            elif tp.topic == self._retry_kafka_topic:
                out.append(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
            elif where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                when = settings.consume_timestamp_ms or int((time.time() - 1800) * 1000)
                stamp.append(TopicPartition(tp.topic, tp.partition, when))
            else:
                first = where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
                start = OFFSET_BEGINNING if first else OFFSET_END
                out.append(TopicPartition(tp.topic, tp.partition, start))
        if stamp:
            found = self._kafka.offsets_for_times(stamp, timeout=config.request_timeout_ms / 1000)
            out += [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                for tp in found
            ]
        return out

    def _take(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        positions = self._start_positions(partitions)
        for tp in positions:
            pq = self.queues[(tp.topic, tp.partition)] = ProcessQueue(tp.topic, tp.partition)
            metadata = getattr(tp, "metadata", None)
            if tp.offset >= 0 and metadata:
                self._consumption.inherit(pq, tp.offset, metadata)
        logger.info(
            "push consumer %s: assigned %s",
            self._context.group,
            [f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in positions],
        )
        return positions

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if not self._consumption.cooperative:
            consumer.assign(self._take(partitions))
        elif partitions:  # cooperative: only the partitions added, maybe none
            consumer.incremental_assign(self._take(partitions))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # Orderly, FIFO: never let the next owner run a partition while its listener runs here.
        self._release([(tp.topic, tp.partition) for tp in partitions], self._revoke_wait_s)
        if self._consumption.cooperative and partitions:
            consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # The partitions already belong to someone else: stop, commit nothing.
        gone = []
        for tp in partitions:
            pq = self.queues.pop((tp.topic, tp.partition), None)
            if pq is not None:
                pq.release()
                gone.append(pq)
            self.paused.discard((tp.topic, tp.partition))
        self._consumption.released(gone)
        if self._consumption.cooperative and partitions:
            consumer.incremental_unassign(partitions)
        logger.warning("push consumer %s: lost %d partitions", self._context.group, len(partitions))

    def _release(self, keys: list[Key], wait_s: float) -> None:
        """Stop new work on ``keys``, give running listeners up to ``wait_s`` seconds (never
        past the shutdown deadline), commit what is done, forget the partitions. Messages
        still in a listener then are abandoned: logged, never committed past (the next owner
        consumes them again), their listeners' late results ignored."""
        context = self._context
        queues = [(key, self.queues[key]) for key in keys if key in self.queues]
        for _, pq in queues:
            pq.drop()
        began = time.monotonic()
        deadline = began + wait_s
        while True:
            busy = [(key, pq) for key, pq in queues if pq.running]
            remaining = min(deadline, context.deadline) - time.monotonic()
            if not busy or remaining <= 0:
                break
            busy[0][1].wait_idle(min(remaining, _WAIT_SLICE_S))
            if self._consumption.expires_while_waiting:
                # The poll thread waits here: deadlines of every partition still pass.
                self._consumption.expire_overdue(self.queues.values())
        for _, pq in queues:
            pq.release()
        self._consumption.released(pq for _, pq in queues)
        if busy:
            logger.warning(
                "push consumer %s: abandoned %s (partition: messages held) with listeners "
                "still running after %.1f s; they will be redelivered, their offsets are not "
                "committed past",
                context.group,
                ", ".join(f"{key[0]}[{key[1]}]: {pq.held}" for key, pq in busy),
                time.monotonic() - began,
            )
        if context.producer is not None and not context.broadcasting:
            # Copies still in flight: let them be acknowledged so their offsets can pass.
            try:
                context.flush_copies(context.bounded_ms(context.config.send_msg_timeout_ms))
            except Exception as exc:  # the producer stopped (a shutdown that gave up waiting)
                logger.warning("push consumer %s: copies not flushed: %s", context.group, exc)
        self._commits.commit(keys, asynchronous=False)
        for key in keys:
            self.queues.pop(key, None)
            self.paused.discard(key)

    def _assign_new_partitions(self) -> None:
        """BROADCASTING: take every partition of the subscribed topics not yet taken."""
        self._last_refresh = time.monotonic()
        timeout_s = self._context.config.request_timeout_ms / 1000
        new: list[TopicPartition] = []
        for kafka_topic in self._topic_names:
            try:
                meta = self._kafka.list_topics(kafka_topic, timeout=timeout_s)
            except Exception as exc:
                logger.warning(
                    "push consumer %s: metadata of %s: %s", self._context.group, kafka_topic, exc
                )
                continue
            info = meta.topics.get(kafka_topic)
            if info is None or info.error is not None:
                continue
            new += [
                TopicPartition(kafka_topic, p)
                for p in info.partitions
                if (kafka_topic, p) not in self.queues
            ]
        if new:
            self._kafka.incremental_assign(self._take(new))

    # --- offsets -------------------------------------------------------------------------
    def commit_now(self, queues: Iterable[ProcessQueue]) -> bool:
        """Commit ``queues``' partitions (those still held) with the strategy's metadata now,
        synchronously; on the poll thread only (a commit from another thread waits for the
        poll thread's ``consume`` calls, and a synchronous one hung there during a rebalance).
        False if the commit failed (logged)."""
        return self._commits.commit([(pq.topic, pq.partition) for pq in queues], asynchronous=False)
