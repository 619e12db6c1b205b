"""Runs handlers on a thread pool and turns what they do into outcomes.

What a handler does comes back to the main thread on two queues: its outcome, and the
visibility extensions it makes itself (``Message.extend_visibility``, which the
dispatcher gives each message before its handler starts).

Handed-out messages wait for a free thread in a priority queue, not in submission order:
a message of a higher priority (a task's ``priority``; 0 for subscriptions) starts before
every lower one this worker has fetched, whichever partition it came from. Equal
priorities start in the order they were handed out.

Handlers holding a slot of a ``max_running`` limit (see :mod:`.limits`) run on threads
of their own, as many as the worker's concurrency, not on the threads every other
subscription shares: a limited subscription, often the slow one kept from overloading
something, never takes a thread from the others, the way a queue of its own would. Its
fleet-wide limit bounds how many such threads run (see LimitGate.own_room). A message
delivered to wait for a slot this worker holds (see :mod:`.handover`) takes no thread
while it waits: the handler that frees the slot queues it as it finishes.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connections

from ..consuming.message import Message
from ..exceptions import LeaseLost, SQLQueueError
from ..models import DeliveryState
from .clock import DatabaseClock
from .handling import handle
from .handover import LocalSlots
from .outcomes import NotStarted, Outcome
from .partitions import Ident, Partition
from .prefetch import Prefetch

logger = logging.getLogger("django_sqlqueue.worker")

# The thread pools: ``shared`` runs every handler but those holding a slot of a
# ``max_running`` limit, which run on ``limited``.
SHARED, LIMITED = "shared", "limited"

# (partition, offset, invisible until): extensions made by handler threads, for the main
# thread to fold into the partition's state (only the main thread touches that state).
Extensions = queue.SimpleQueue[tuple[Ident, int, int]]


class Dispatcher:
    """Hands messages to handler threads; outcomes come back on ``outcomes``, and the
    handlers' own visibility extensions on ``extensions``."""

    def __init__(self, concurrency: int, wake: threading.Event, worker_name: str, token: str,
                 clock: DatabaseClock, using: str,
                 on_finished: Callable[[Ident, float], None] | None = None,
                 slots: LocalSlots | None = None) -> None:
        # The limits' slots held here: a message may wait for one (None: no limits).
        self.slots = slots
        # Told each handler's run time (seconds) when metrics are on; None costs nothing.
        self.on_finished = on_finished
        self.outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.extensions: Extensions = queue.SimpleQueue()
        self._fence = (worker_name, token)  # what extensions check the lease with
        self._clock = clock
        self._using = using
        self._pools = {SHARED: ThreadPoolExecutor(max_workers=concurrency,
                                                  thread_name_prefix="sqlqueue-handler")}
        if slots is not None:  # threads start as needed: none unless a limit is used
            self._pools[LIMITED] = ThreadPoolExecutor(max_workers=concurrency,
                                                      thread_name_prefix="sqlqueue-limited")
        self._wake = wake
        # Per pool: messages queued or running, and the jobs that run them. A job runs
        # what waits for its pool until nothing does, so a busy worker submits a job per
        # free thread, not one (a Future, its lock and condition) per message.
        self._concurrency = concurrency  # threads of each pool
        self.prefetch = Prefetch(concurrency)  # the worker's in-flight cap
        self._busy = {lane: 0 for lane in self._pools}
        self._jobs = {lane: 0 for lane in self._pools}
        self._closed = False
        self._lock = threading.Lock()
        self._running_refs: dict[tuple[Ident, int], int] = {}
        # When each running handler started (time.monotonic()), for MAX_HANDLER_TIME.
        self._started: dict[tuple[Ident, int], float] = {}
        self._overdue_logged: set[tuple[Ident, int]] = set()
        # Messages waiting for a thread, per pool: (-priority, hand-out order, partition,
        # generation, message). Each one queued comes with one job of its pool that runs
        # the best.
        self._waiting: dict[str, list[tuple[int, int, Partition, int, Message]]] = {
            lane: [] for lane in self._pools}
        self._order = itertools.count()

    @property
    def busy(self) -> int:
        """Handlers queued or running, on every pool."""
        with self._lock:
            return sum(self._busy.values())

    @property
    def shared_busy(self) -> int:
        """Handlers queued or running on the shared threads (``concurrency`` of them)."""
        with self._lock:
            return self._busy[SHARED]

    def is_running(self, ident: Ident, offset: int) -> bool:
        """Whether a handler for this message is queued or running in this process."""
        with self._lock:
            return (ident, offset) in self._running_refs

    def may_extend(self, ident: Ident, offset: int, max_seconds: float | None) -> bool:
        """Whether the worker should keep this message invisible: its handler is queued or
        running here, and has not run longer than ``max_seconds`` (None: no limit)."""
        ref = (ident, offset)
        with self._lock:
            if ref not in self._running_refs:
                return False
            started = self._started.get(ref)
            if max_seconds is None or started is None:
                return True
            overdue = time.monotonic() - started > max_seconds
            first_time = overdue and ref not in self._overdue_logged
            if first_time:
                self._overdue_logged.add(ref)
        if first_time:
            logger.warning(
                "handler running longer than MAX_HANDLER_TIME (%.0fs), no longer extending "
                "its message; it will be redelivered when its visibility runs out group=%s "
                "topic=%s partition=%s offset=%s", max_seconds, ident[0], ident[1], ident[2],
                offset,
            )
        return not overdue

    def overdue(self, ident: Ident, offset: int, max_seconds: float | None) -> bool:
        """Whether this message's handler still runs here but has run longer than
        ``max_seconds``: the worker has given up on it (None: it never does)."""
        if max_seconds is None:
            return False
        ref = (ident, offset)
        with self._lock:
            started = self._started.get(ref)
            return (ref in self._running_refs and started is not None
                    and time.monotonic() - started > max_seconds)

    def submit(self, partition: Partition, generation: int, message: Message) -> None:
        """Run ``message``'s handler on a free thread, highest priority first."""
        worker_name, token = self._fence
        message._extend = extender(partition, generation, message, worker_name, token,
                                   self._clock, self._using, self.extensions)
        ref = (partition.ident, message.offset)
        with self._lock:
            self._running_refs[ref] = self._running_refs.get(ref, 0) + 1
        start = functools.partial(self._queue, partition, generation, message)
        drop = functools.partial(self._give_back, partition, generation, message)
        if self.slots is None or not self.slots.defer(_delivery(partition, message), start,
                                                       drop):
            start()

    def _give_back(self, partition: Partition, generation: int, message: Message) -> None:
        """A message waiting for a slot that will not come to it here (the slot went back
        to the database): its delivery is undone, for a poll cycle to hand it out again."""
        self.outcomes.put(NotStarted(partition, generation, message))
        self._finished((partition.ident, message.offset))
        self._wake.set()

    def _queue(self, partition: Partition, generation: int, message: Message) -> None:
        lane = (LIMITED if self.slots is not None
                and self.slots.holds_own(_delivery(partition, message)) else SHARED)
        priority = _priority(partition, message)
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's handler threads are shut down")
            heapq.heappush(self._waiting[lane], (-priority, next(self._order), partition,
                                                 generation, message))
            self._busy[lane] += 1
            start_job = self._jobs[lane] < self._concurrency
            if start_job:
                self._jobs[lane] += 1
        if start_job:
            try:
                self._pools[lane].submit(self._run_waiting, lane)
            except RuntimeError:  # shut down meanwhile: nothing of the lane runs any more
                with self._lock:
                    self._jobs[lane] -= 1
                raise

    def _run_waiting(self, lane: str) -> None:
        """A pool job: run the highest-priority message waiting for the pool, then the
        next, until none waits (or the dispatcher shuts down)."""
        while True:
            with self._lock:
                if self._closed or not self._waiting[lane]:
                    self._jobs[lane] -= 1
                    return
                _, _, partition, generation, message = heapq.heappop(self._waiting[lane])
            quiet = False
            try:
                self._run(partition, generation, message)
            except Exception:
                logger.exception("handler thread failed group=%s topic=%s partition=%s "
                                 "offset=%s", partition.group, partition.topic,
                                 partition.number, message.offset)
            finally:
                self._finished((partition.ident, message.offset))
                # A limited handler whose slot went on to a message with more waiting
                # behind it needs no poll cycle now: its outcome is recorded by the next
                # poll (within POLL_INTERVAL). Waking one per finished handler would cost
                # the worker's other subscriptions a cycle over all its partitions each
                # time.
                try:
                    quiet = self._hand_over(_delivery(partition, message))
                finally:
                    with self._lock:
                        self._busy[lane] -= 1
                    if not quiet:
                        self._wake.set()

    def _hand_over(self, delivery: tuple[Ident, int, int]) -> bool:
        """Start the messages waiting for the slots this handler held (before its job
        ends: a draining worker sees it busy until they run). Returns whether each slot
        still has a message waiting behind the one it went to."""
        if self.slots is None:
            return False
        starts, supplied = self.slots.finished(delivery)
        for start in starts:
            try:
                start()
            except RuntimeError:  # the pool shut down: the worker stops, it is redelivered
                logger.info("not starting a message waiting for a limit slot: the worker "
                            "is stopping")
                supplied = False
        return supplied

    def _finished(self, ref: tuple[Ident, int]) -> None:
        with self._lock:
            left = self._running_refs.get(ref, 1) - 1
            if left > 0:
                self._running_refs[ref] = left
            else:
                self._running_refs.pop(ref, None)
                self._started.pop(ref, None)
                self._overdue_logged.discard(ref)

    def shutdown(self, wait: bool) -> None:
        """Start no more handlers: those waiting for a thread are dropped (redelivered
        once their visibility lapses); running ones end on their own (``wait``: wait
        for them)."""
        with self._lock:
            self._closed = True
            for lane, waiting in self._waiting.items():
                self._busy[lane] -= len(waiting)
                waiting.clear()
        for pool in self._pools.values():
            pool.shutdown(wait=wait, cancel_futures=True)

    def _run(self, partition: Partition, generation: int, message: Message) -> None:
        if self.slots is not None and not self.slots.may_start(_delivery(partition, message)):
            # A slot it holds may have lapsed (the worker was paused past its deadline) or
            # was found another worker's: starting now could run more than max_running.
            logger.info("not starting a handler under a limit slot this worker may no "
                        "longer hold group=%s topic=%s partition=%s offset=%s",
                        partition.group, partition.topic, partition.number, message.offset)
            self.outcomes.put(NotStarted(partition, generation, message))
            return
        if not partition.usable(generation):
            # The worker lost the partition, or may have (its lease was not renewed in time:
            # the process was paused, say). Its new owner delivers the message; if the
            # partition is still this worker's, the poll makes it deliverable again.
            logger.info("not starting a handler for a partition this worker may no longer "
                        "own group=%s topic=%s partition=%s offset=%s", partition.group,
                        partition.topic, partition.number, message.offset)
            self.outcomes.put(NotStarted(partition, generation, message))
            return
        with self._lock:
            self._started.setdefault((partition.ident, message.offset), time.monotonic())
        close_old_connections()
        started = time.monotonic()
        try:
            self.outcomes.put(handle(partition, generation, message))
        finally:
            took = time.monotonic() - started
            self.prefetch.ran(took)
            if self.on_finished is not None:
                self.on_finished(partition.ident, took)
            close_old_connections()


def _delivery(partition: Partition, message: Message) -> tuple[Ident, int, int]:
    return (partition.ident, message.offset, message.attempt)


def _priority(partition: Partition, message: Message) -> int:
    priority_of = partition.subscription.priority_of
    if priority_of is None:
        return 0
    try:
        return int(priority_of(message.payload))
    except Exception:  # noqa: BLE001 - a message that names no usable priority runs at 0
        return 0


def extender(partition: Partition, generation: int, message: Message, worker_name: str,
             token: str, clock: DatabaseClock, using: str,
             notices: Extensions) -> Callable[[float], None]:
    """The extension function for one delivery: a single UPDATE that checks the lease
    generation itself (the handler runs outside the worker's fenced poll transaction).

    Inside the handler's own ``transaction.atomic`` the UPDATE runs on a connection of its
    own and commits at once. On the handler's connection it would lock the delivery row
    until the handler's transaction ends, and the worker, which extends and acks that row
    in its poll transaction, would wait for it with every other partition.
    """

    def extend(seconds: float) -> None:
        until = clock.now_ms() + int(seconds * 1000)
        refs = [partition.ref(message.offset)]
        fence = (worker_name, token, generation)
        own = connections[using]
        if not own.in_atomic_block:
            updated = DeliveryState.objects.extend(partition.group, partition.topic, refs,
                                                   until, using, fence=fence)
        elif own.vendor == "sqlite":
            raise SQLQueueError(
                "cannot extend visibility inside transaction.atomic on SQLite: SQLite has "
                "one writer at a time and this transaction is it; call extend_visibility() "
                "before the atomic block or after it"
            )
        else:
            separate = connections.create_connection(using)
            try:
                updated = DeliveryState.objects.extend(
                    partition.group, partition.topic, refs, until, using, fence=fence,
                    connection=separate,
                )
            finally:
                separate.close()
        if not updated:
            raise LeaseLost(
                f"cannot extend offset {message.offset}: partition {partition.number!r} of "
                f"{partition.topic!r} is no longer leased to {worker_name}"
            )
        notices.put((partition.ident, message.offset, until))

    return extend


def taken(items: queue.SimpleQueue[Any] | queue.Queue[Any]) -> list[Any]:
    """Everything ``items`` holds now, without waiting."""
    found = []
    with contextlib.suppress(queue.Empty):
        while True:
            found.append(items.get_nowait())
    return found
