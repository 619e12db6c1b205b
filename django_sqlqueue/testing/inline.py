"""The worker's poll cycle, run in the calling thread with the handlers: drain()'s engine.

It is a worker made of the worker's own pieces (leasing, sequencing, the poll cycle with
its reads, delivery rows, outcome recording and dead letters, the signals), with three
differences a test needs:

- handlers run one after another in this thread, on this thread's connection, so inside
  a ``TestCase`` everything happens in the test's transaction (each handler in a savepoint
  of its own, as a worker's handler has its own transactions);
- no thread, no garbage collection, no fault backoff: an error fails the drain at once;
- a clock that can jump forward, so a delay, a retry's backoff or a rate limit's next token
  comes due when asked (limits: see :mod:`.limits`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable

from django.db import DatabaseError, connections

from ..conf import get_settings
from ..consuming.message import Message
from ..consuming.registry import Subscription
from ..exceptions import LeaseLost, SQLQueueError
from ..models import DeliveryState, GroupControl, LogSequencer
from ..rows import epoch_ms_to_datetime
from ..worker.arrivals import note_new_messages, sequence_backlog
from ..worker.attention import cycle_wanted
from ..worker.clock import DatabaseClock
from ..worker.controls import Controls
from ..worker.cycle import PollCycle
from ..worker.dispatcher import _priority as priority
from ..worker.handling import handle
from ..worker.leasing import Leasing
from ..worker.outcomes import Acked, DeadLettered, Outcome, Retried
from ..worker.partitions import Ident, Partition
from ..worker.results import CycleResult, Delivery
from ..worker.signalling import send_signal
from ..worker.window import NEVER_MS
from .limits import DrainLimits
from .summary import DrainResult, Failure

CAPACITY = 100  # messages one cycle hands out at most, as a worker's default
SEQUENCER_BUSY_WAIT = 0.05  # seconds to wait while another process holds the sequencer


class DrainLimitExceeded(SQLQueueError):
    """drain() stopped: it reached ``max_messages`` or ``max_cycles`` with work left."""


class TestClock:
    """The database clock, moved forward on request (all queue timing uses it)."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.database = DatabaseClock()
        self.offset_ms = 0

    def sync(self, server_ms: int) -> None:
        self.database.sync(server_ms)

    def real_ms(self) -> int:
        return self.database.now_ms()

    def now_ms(self) -> int:
        return self.database.now_ms() + self.offset_ms

    def set(self, when_ms: int) -> None:
        self.offset_ms = when_ms - self.database.now_ms()

    def advance_to(self, due_ms: int) -> None:
        self.offset_ms += max(0, due_ms - self.now_ms())


def _nothing_runs(ident: Ident, offset: int) -> bool:
    """No handler runs while a cycle does: they run between cycles, in this thread."""
    return False


class InlineWorker:
    def __init__(self, subscriptions: list[Subscription], *, name: str, using: str,
                 clock: TestClock, advance_delays: bool, max_messages: int,
                 max_cycles: int) -> None:
        conf = get_settings()
        self.name = name
        self.using = using
        self.clock = clock
        self.advance_delays = advance_delays
        self.max_messages = max_messages
        self.max_cycles = max_cycles
        self.renew_interval = conf.renew_interval
        self.leasing = Leasing(name, using, subscriptions, conf.lease_duration)
        self.cycle = PollCycle(name, self.leasing.token, using, conf.dlq_suffix, clock.now_ms,
                               _nothing_runs, _nothing_runs, DrainLimits(using))
        self.controls = Controls(((s.group, s.topic) for s in subscriptions), using)
        self.topics = sorted({s.topic for s in subscriptions})
        self.groups_by_topic: dict[str, set[str]] = {}
        for s in subscriptions:
            self.groups_by_topic.setdefault(s.topic, set()).add(s.group)
        self.pending: list[Outcome] = []
        self.result = DrainResult()
        self._seen_head = 0
        self._unsequenced = False
        self._next_renewal = 0.0
        self._handed_out: Counter[str] = Counter()  # deliveries per topic, for the limit's error

    @property
    def partitions(self) -> dict[Ident, Partition]:
        return self.leasing.partitions

    def run(self, now_ms: int | None = None) -> DrainResult:
        """Drain, then give back every lease; ``now_ms``: start the clock there."""
        head, _, db_now = LogSequencer.objects.head(self.using)
        self.clock.sync(db_now)
        if now_ms is not None:
            self.clock.set(now_ms)
        self._seen_head = head
        try:
            self.leasing.prepare()
            self._loop()
            due = self._next_due()
            self.result.next_due = None if due is None else epoch_ms_to_datetime(due)
        except BaseException:
            with contextlib.suppress(Exception):  # the original error is the one to see
                self._stop()
            raise
        self._stop()
        return self.result

    # ----------------------------------------------------------------- the loop

    def _loop(self) -> None:
        polls = 0
        while True:
            polls += 1
            if polls > self.max_cycles:
                raise DrainLimitExceeded(
                    f"drain() polled {self.max_cycles} times (max_cycles) and there was still "
                    f"work: {self._busiest()}; raise max_cycles if this test needs more")
            self._poll()
            if self.pending or cycle_wanted(self.partitions.values(), self.clock.now_ms()):
                self._cycle()
            elif self._unsequenced:
                time.sleep(SEQUENCER_BUSY_WAIT)  # another process is sequencing right now
            elif self.advance_delays and (due := self._next_due()) is not None:
                self.clock.advance_to(due)
            else:
                return

    def _poll(self) -> None:
        """What a worker's tick does before its cycle: read the log head and the clock,
        sequence what was published, renew the leases when due, note new messages."""
        head, pending, db_now, controls = LogSequencer.objects.poll_head(
            self.using, GroupControl.objects.version_sql(connections[self.using]))
        self.clock.sync(db_now)
        self.controls.note_version(controls)
        self._unsequenced = False
        if pending:
            head, self._unsequenced, _, _ = sequence_backlog(head, self.using, self.name)
        if time.monotonic() >= self._next_renewal:
            # Leases are kept by the real clock: only delivery times move with the test's.
            self.leasing.maintain(self.clock.real_ms())
            self._next_renewal = time.monotonic() + self.renew_interval
        if head > self._seen_head:
            note_new_messages(self.partitions, self._seen_head, head, self.topics,
                              self.groups_by_topic, self.using)
            self._seen_head = head
        self.controls.apply(self.partitions)

    def _cycle(self) -> None:
        result = self.cycle.run(self.partitions, self.pending, CAPACITY, CAPACITY)
        self.result.cycles += 1
        self.leasing.drop(result.lost)
        done = {id(o) for o in result.done}
        self.pending = [o for o in self.pending if id(o) not in done]
        self._report(result)
        # Highest priority first, as a worker's free threads take them.
        deliveries = sorted(result.deliveries, key=lambda d: -priority(d.partition, d.message))
        for delivery in deliveries:
            self._limit(delivery)
            self.pending.append(self._run(delivery))

    def _limit(self, delivery: Delivery) -> None:
        """Count a handler about to run; refuse it past ``max_messages``."""
        if sum(self._handed_out.values()) < self.max_messages:
            self._handed_out[delivery.partition.topic] += 1
        else:
            raise DrainLimitExceeded(
                f"drain() ran {self.max_messages} handlers (max_messages) and there was "
                f"still work: {self._busiest()}; a handler that publishes a message each "
                "time it runs never drains. Raise max_messages if this test needs more")

    def _busiest(self) -> str:
        if not self._handed_out:
            return "no handler ran"
        return "handlers ran for " + ", ".join(
            f"{topic!r} {count} time(s)" for topic, count in self._handed_out.most_common(3))

    # ----------------------------------------------------------------- handlers

    def _run(self, delivery: Delivery) -> Outcome:
        """Run one handler here. Inside a transaction (a TestCase) it gets a savepoint,
        as a worker's handler gets transactions of its own: a database error it ends with
        undoes its own writes, not the test's."""
        partition, generation, message = delivery.partition, delivery.generation, delivery.message
        message._extend = self._extender(partition, generation, message)
        connection = connections[self.using]
        savepoint = connection.savepoint() if connection.in_atomic_block else None
        outcome = handle(partition, generation, message)
        if savepoint is None:
            return outcome
        try:
            if connection.needs_rollback:  # a failed query inside Django's own atomic blocks
                raise DatabaseError("the handler's writes must be undone")
            connection.savepoint_commit(savepoint)
        except DatabaseError:  # or one that aborted the transaction (PostgreSQL)
            # What leaving an atomic block whose savepoint rolls back does.
            connection.needs_rollback = False
            connection.savepoint_rollback(savepoint)
        return outcome

    def _extender(self, partition: Partition, generation: int,
                  message: Message) -> Callable[[float], None]:
        """Message.extend_visibility() in a drain: on this thread's connection, since no
        poll transaction runs at the same time here (a worker uses a connection of its own
        inside a handler's atomic block, which a TestCase could not see)."""

        def extend(seconds: float) -> None:
            until = self.clock.now_ms() + int(seconds * 1000)
            updated = DeliveryState.objects.extend(
                partition.group, partition.topic, [partition.ref(message.offset)], until,
                self.using, fence=(self.name, self.leasing.token, generation))
            if not updated:
                raise LeaseLost(f"cannot extend offset {message.offset}: partition "
                                f"{partition.number!r} of {partition.topic!r} is not held")
            partition.extended(message.offset, until)

        return extend

    # ----------------------------------------------------------------- reporting

    def _report(self, result: CycleResult) -> None:
        """Count what the cycle recorded and send the worker's signals for it."""
        for report in result.reports.values():
            subscription = report.partition.subscription
            counts = self.result.counts(subscription.topic)
            for outcome in report.recorded:
                if isinstance(outcome, Acked):
                    counts.handled += 1
                elif isinstance(outcome, Retried | DeadLettered):
                    dead = isinstance(outcome, DeadLettered)
                    counts.dead_lettered += dead
                    counts.retried += not dead
                    self.result.failures.append(_failure(outcome, dead))
                if outcome.signal:
                    send_signal(outcome.signal, outcome.message, subscription=subscription,
                                **outcome.signal_arguments())
            for lost in report.dead_on_fetch:
                counts.dead_lettered += 1
                send_signal("message_dead_lettered", lost.message, subscription=subscription,
                            error=lost.error)
            for delivery in report.deliveries:
                counts.delivered += 1
                send_signal("message_delivered", delivery.message, subscription=subscription)

    def _next_due(self) -> int | None:
        """When the earliest waiting message comes due (epoch ms, the test's clock)."""
        dues = [due for p in self.partitions.values() if not p.paused
                for due in (p.next_due(), p.parked_next) if due is not None and due < NEVER_MS]
        return min(dues) if dues else None

    def _stop(self) -> None:
        self.leasing.release_all()
        self.leasing.deregister(self.clock.real_ms())


def _failure(outcome: Outcome, dead: bool) -> Failure:
    message = outcome.message
    return Failure(topic=outcome.partition.topic, group=outcome.partition.group, key=message.key,
                   offset=message.offset, attempt=message.attempt, error=outcome.error,
                   dead_lettered=dead)
