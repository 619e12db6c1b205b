"""The worker process: a loop of short steps that each return quickly.

``Worker.run()`` polls until stopped: read the log head (one query when idle), sequence
newly committed messages, renew leases when due, then run a poll cycle when a partition
has something to do. A committed cycle's result is applied here, in one place: lost
partitions dropped, settled outcomes forgotten, deliveries handed to handler threads, and
the signals sent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import connections

from ..conf import get_settings, queue_database
from ..consuming.registry import Subscription
from ..db import notify
from ..db.errors import is_disconnect, is_transient
from ..db.liveness import fallback_reason
from ..db.schema_state import is_missing_schema, not_migrated_line
from ..db.vendor import has_row_locks
from ..models.fields import SUBSCRIBER_NAME_LENGTH
from . import attention
from .arrivals import Backlog, HeadPoll, note_new_messages, sequence_backlog
from .burst import REMAINING_CAP as BURST_REMAINING_CAP
from .burst import Burst
from .clock import DatabaseClock
from .collector import GarbageCollector
from .controls import Controls
from .cycle import PollCycle
from .dispatcher import Dispatcher, taken
from .faults import FaultBackoff
from .interrupts import stop_on_signals
from .isolation import Batch, Isolation
from .leasing import Leasing
from .lifecycle_log import log_start
from .limits import LimitGate
from .liveness import holding
from .outcomes import Outcome
from .partitions import Ident, Partition
from .results import CycleResult, touched_by_failed_cycle
from .scheduling import Scheduler
from .session import SessionBounds
from .shutdown import drain
from .signalling import send_cycle_signals
from .startup import Startup
from .wakeup import Listener

if TYPE_CHECKING:
    from ..metrics.worker import WorkerMetrics

logger = logging.getLogger("django_sqlqueue.worker")

ACQUIRE_INTERVAL = 0.5  # seconds between rebalance checks and lease attempts between renewals
# Seconds until the next poll when committed messages were left unsequenced because another
# worker was sequencing them: that worker commits within milliseconds, and waiting a whole
# poll interval for its positions would make their messages wait two.
SEQUENCER_BUSY_RETRY = 0.01
SLOW_CYCLE = 1.0  # seconds; a poll cycle slower than this is logged
# Exit status of a worker that stopped while handlers were still running after the
# shutdown grace period (their messages are redelivered after the visibility timeout).
EXIT_HANDLERS_ABANDONED = 3


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    def __init__(
        self,
        subscriptions: list[Subscription],
        *,
        name: str | None = None,
        concurrency: int = 4,
        burst: bool = False,
        using: str | None = None,
        metrics: WorkerMetrics | None = None,
        schedules: bool | str = False,  # True, or the alias the schedules live on
    ) -> None:
        if not subscriptions:
            raise ValueError("a worker needs at least one subscription")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if name is not None and len(name) > SUBSCRIBER_NAME_LENGTH:
            # Lease and heartbeat columns would cut it short, and the worker would then not
            # recognise its own leases.
            raise ValueError(f"worker name is {len(name)} characters long; the limit is "
                             f"{SUBSCRIBER_NAME_LENGTH}")
        conf = get_settings()
        self.conf = conf
        self.subscriptions = subscriptions
        self.name = name or default_worker_name()
        self.burst = burst
        self.using = using = using or queue_database()
        self.clock = DatabaseClock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.concurrency = concurrency
        # Prometheus metrics, when runqueueworker --metrics-port asked for them.
        self.metrics = metrics
        self.leasing = Leasing(self.name, using, subscriptions, conf.lease_duration,
                               liveness=fallback_reason(using) is None)
        self.limits = LimitGate(self.leasing.token, int(conf.lease_duration * 1000), using,
                                concurrency, self._sharers, self.leasing.judges_liveness)
        self.dispatcher = Dispatcher(concurrency, self.wake, self.name, self.leasing.token,
                                     self.clock, using,
                                     metrics.handler_finished if metrics else None,
                                     self.limits.local)
        self.cycle = PollCycle(self.name, self.leasing.token, using, conf.dlq_suffix,
                               self.clock.now_ms, self.dispatcher.is_running, self._may_extend,
                               self.limits)
        self.faults = FaultBackoff(using)
        self.isolation = Isolation()
        self.session = SessionBounds(using, conf.lease_duration)
        self.faults_delay = 0.0  # seconds to wait after the last failed step
        self.topics = sorted({s.topic for s in subscriptions})
        self.controls = Controls(((s.group, s.topic) for s in subscriptions), using)
        self.head_poll = HeadPoll(using, self.clock, self.controls, self.conf.poll_interval)
        self.groups_by_topic: dict[str, set[str]] = {}
        for s in subscriptions:
            self.groups_by_topic.setdefault(s.topic, set()).add(s.group)
        self._pending: list[Outcome] = []
        self._seen_head: int | None = None
        self._next_maintain = 0.0
        self._next_acquire = 0.0
        self.collector: GarbageCollector | None = None
        # Fires recurring schedules (runqueueworker runs one unless --no-schedules).
        self.scheduler = Scheduler(using if schedules is True else schedules) if schedules else None
        self.listener: Listener | None = None
        self._retried_busy = False  # the last poll was an early one after a busy sequencer
        self.bursting = Burst(using)  # when a burst worker is done
        self.startup = Startup(self.name, using, self.leasing, self.session, self.clock,
                               conf.lease_duration + conf.renew_interval,
                               wait_for_migrate=not burst)
        self.cycles = 0  # poll cycles run, and the longest one (seconds), logged at stop
        self.longest_cycle = 0.0
        self.exit_code = 0
        self.exit_reason = ""

    @property
    def partitions(self) -> dict[Ident, Partition]:
        return self.leasing.partitions

    # ------------------------------------------------------------------ running

    def run(self) -> int:
        """Poll until stopped (or, with burst, until nothing is left to do); return the exit
        status: 0, or why it stopped early (see ``exit_reason``)."""
        log_start(name=self.name, using=self.using, concurrency=self.concurrency,
                  burst=self.burst, schedules=self.scheduler is not None,
                  subscriptions=self.subscriptions, liveness=self.leasing.liveness is not None)
        with holding(self.leasing.liveness):
            return self._run()

    def _run(self) -> int:
        with stop_on_signals(self.stop, self.conf.shutdown_grace):
            while self._seen_head is None and not self.stopping.is_set():
                delay = self._step("start", self._start)
                self.wake.wait(self.faults_delay if delay is None else delay)
            if self._seen_head is None:
                return self.exit_code  # stopped (or refused) before it started: nothing to undo
            if self.conf.gc_interval:
                self.collector = GarbageCollector(self.topics, self.groups_by_topic, self.using,
                                                  self.conf.gc_interval,
                                                  self.conf.group_retention)
                self.collector.start()
            if self.scheduler is not None:
                self.scheduler.start()
            for hooks in {id(s.hooks): s.hooks for s in self.subscriptions if s.hooks}.values():
                hooks.started(self.stopping, self.stop, self.using)
            if notify.enabled(connections[self.using]):
                self.listener = Listener(self.topics, self.wake, self.using, self.name)
                self.listener.start()
            while not self.stopping.is_set():
                started = time.monotonic()
                delay = self._step("poll", self._tick)
                if self.metrics is not None:
                    self.metrics.poll_finished(time.monotonic() - started)
                if delay is None:
                    delay = self.faults_delay
                else:
                    # POLL_INTERVAL is the cadence of polls, not a pause after each one.
                    delay -= time.monotonic() - started
                if delay > 0 and not self.stopping.is_set():
                    self.wake.wait(delay)
                    self.wake.clear()
            self._shutdown()
            if self.collector is not None:
                self.collector.stop()
            if self.scheduler is not None:
                self.scheduler.stop()
            if self.listener is not None:
                self.listener.stop()  # after the leases are released: it may take WAIT_SLICE
        self.session.release()
        logger.info("worker stopped name=%s cycles=%s longest_cycle_ms=%.0f", self.name,
                    self.cycles, self.longest_cycle * 1000)
        return self.exit_code

    def _start(self) -> float:
        """One try at starting (see :mod:`.startup`); 0 once started or refused, else
        seconds until the next try."""
        delay = self.startup.attempt()
        if self.startup.refusal:
            self.exit_reason = self.startup.refusal
            self.exit_code = self.startup.refusal_status
            self.stop()
        self._seen_head = self.startup.head
        return delay

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _step(self, name: str, fn: Callable[[], float | None]) -> float | None:
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - the worker must outlive database faults
            if is_missing_schema(exc):
                # A queue table or column is missing: one line naming manage.py migrate,
                # no traceback; a burst worker exits with it.
                with contextlib.suppress(Exception):
                    connections[self.using].close()
                self.faults_delay = self.startup.not_migrated(not_migrated_line(self.using))
                if self.startup.refusal and not self.exit_code:
                    self.exit_reason = self.startup.refusal
                    self.exit_code = self.startup.refusal_status
                    self.stop()
                return None
            self.faults_delay = self.faults.failed(name, exc)
            return None
        self.faults.succeeded()
        return value if value is not None else 0.0

    def _tick(self) -> float:
        poll = self.conf.poll_interval
        self.session.ensure()
        head, pending = self.head_poll.read(self._seen_head or 0, self.listener is not None
                                            and self.listener.notified.is_set())
        if self.listener is not None:
            self.listener.notified.clear()
        backlog = sequence_backlog(head, self.using, self.name, wait=self._idle()) if pending else None
        head, pending = (backlog.head, backlog.pending) if backlog else (head, pending)
        now = time.monotonic()
        now_ms = self.clock.now_ms()
        if now >= self._next_maintain or self.leasing.liveness_changed():
            self._maintain(now, now_ms)
        elif now >= self._next_acquire and not self.stopping.is_set():
            # Between renewals, once per ACQUIRE_INTERVAL: rebalance early when workers
            # joined or left (one query), else take what was freed.
            self._next_acquire = now + ACQUIRE_INTERVAL
            if self.leasing.membership_changed(now_ms):
                self._maintain(now, now_ms)
            elif self.leasing.below_share():
                self.leasing.acquire(now_ms)
        self.controls.apply(self.partitions)
        self._drain_outcomes()
        self._drain_extensions()
        self._note_new_messages(head, backlog)
        held = list(self.partitions.values())
        full = False
        delivered = 0  # deliveries and recorded outcomes of this poll's cycles
        if (self._pending or attention.cycle_wanted(held, now_ms)
                or attention.extension_due(held, now_ms, self._may_extend)):
            waited = False
            for batch in self.isolation.batches(self.partitions, time.monotonic()):
                if waited and batch.suspects is not None:
                    # One lock wait per poll at most: the renewals must not wait for a
                    # row of every suspect in turn. The others are tried at the next poll.
                    continue
                result = self._cycle(batch)
                if isinstance(result, CycleResult):
                    full = full or result.full
                    # What a cycle records may publish (a dead-letter copy) to a topic this
                    # worker consumes: a burst ends only after a poll that sees it.
                    delivered += len(result.deliveries) + len(result.done) + sum(
                        len(r.dead_on_fetch) for r in result.reports.values())
                else:
                    waited = waited or result
        self.leasing.release_drained(self._awaited, self._pending_idents)
        if self.burst and not self.stopping.is_set() and self._burst_done(delivered, pending):
            remaining = self.bursting.remaining(self.partitions.values())
            logger.info("burst finished: nothing left to do name=%s delayed=%s%s", self.name,
                        remaining, "+" if remaining >= BURST_REMAINING_CAP else "")
            self.stop()
        if full:
            return 0.0
        # One early poll at most in a row: a backlog that stays unsequenced (a row another
        # transaction holds) must not turn polling into a busy loop.
        self._retried_busy = pending and not self._retried_busy
        return SEQUENCER_BUSY_RETRY if self._retried_busy else poll

    def _sharers(self, subscription: Subscription) -> int:
        """The live workers consuming ``subscription``, at the last count (1: none yet)."""
        return self.leasing.last_counts.get((subscription.group, subscription.topic), (0, 1))[1]

    # ------------------------------------------------------------------ steps of a tick

    def _cycle(self, batch: Batch) -> CycleResult | bool:
        """Run one poll cycle over ``batch``'s partitions and apply it. When it failed and
        was set aside (see :mod:`.isolation`), return whether it failed waiting for a lock;
        False also when there was nothing to run."""
        members = batch.partitions
        narrowing = batch.narrowing
        # Outcomes of these partitions, and of partitions no longer held (dropped as done).
        outcomes = [o for o in self._pending if o.partition.ident in members
                    or self.partitions.get(o.partition.ident) is not o.partition]
        if narrowing is not None:  # only those of its messages (see .isolation)
            outcomes = [o for o in outcomes if o.partition.ident != narrowing.ident
                        or o.message.offset in narrowing.offsets]
        if not members and not outcomes:
            return False
        elsewhere = sum(p.in_flight_count() for ident, p in self.partitions.items()
                        if ident not in members)
        idle_threads = max(0, self.concurrency - self.dispatcher.shared_busy)
        started = time.monotonic()
        result = CycleResult()
        try:
            self.session.ensure()
            self.cycle.run(members, outcomes, self.dispatcher.prefetch.cap - elsewhere,
                           idle_threads, result, narrowing)
        except Exception as exc:
            # The cycle changed partition state that its transaction did not commit:
            # rebuild these windows from the database before the next delivery.
            for partition in members.values():
                partition.unreliable()
            contention = is_transient(exc)
            if is_disconnect(exc) or (contention and not has_row_locks(connections[self.using])):
                raise  # every partition would fail alike: the whole step is retried
            self._set_aside(batch, exc, contention, touched_by_failed_cycle(members, outcomes, result))
            return contention
        self.isolation.succeeded(batch)
        took = time.monotonic() - started
        self.cycles += 1
        self.longest_cycle = max(self.longest_cycle, took)
        if took > SLOW_CYCLE:
            logger.warning("slow poll cycle seconds=%.2f partitions=%s deliveries=%s",
                           took, len(members), len(result.deliveries))
        self._apply(result)
        return result

    def _set_aside(self, batch: Batch, exc: Exception, contention: bool,
                   touched: set[int]) -> None:
        """A cycle failed: try its partitions (or the messages it ``touched``) apart from
        the others from now on (see :mod:`.isolation`), and release a partition that keeps
        failing alone."""
        if not contention:
            # A connection an unexpected error left in doubt is replaced.
            with contextlib.suppress(Exception):
                connections[self.using].close()
        partition = self.isolation.set_aside(batch, exc, contention, time.monotonic(),
                                             touched)
        if partition is not None:
            self.session.ensure()  # a connection opened afresh gets its bounds first
            self.leasing.give_up(partition)

    def _maintain(self, now: float, now_ms: int) -> None:
        self.leasing.maintain(now_ms, acquire=not self.stopping.is_set())
        self.limits.renew(now_ms)
        self._next_maintain = now + self.conf.renew_interval
        self._next_acquire = now + ACQUIRE_INTERVAL

    def _drain_outcomes(self) -> None:
        self._pending.extend(taken(self.dispatcher.outcomes))

    def _drain_extensions(self) -> None:
        """Fold handlers' own visibility extensions into their partitions' state."""
        for ident, offset, until in taken(self.dispatcher.extensions):
            partition = self.partitions.get(ident)
            if partition is not None:
                partition.extended(offset, until)

    def _note_new_messages(self, head: int, backlog: Backlog | None = None) -> None:
        if self._seen_head is None or head <= self._seen_head:
            return
        note_new_messages(self.partitions, self._seen_head, head, self.topics,
                          self.groups_by_topic, self.using, backlog)
        # Only now: had the read failed, the next poll must read these positions again.
        self._seen_head = head

    def _apply(self, result: CycleResult) -> None:
        """Fold a committed cycle into the worker: forget lost partitions and the outcomes
        it settled, hand deliveries to handler threads, then send the signals (a slow or
        failing receiver delays no handler)."""
        self.leasing.drop(result.lost)
        done = {id(o) for o in result.done}
        self._pending = [o for o in self._pending if id(o) not in done]
        for delivery in result.deliveries:
            self.dispatcher.submit(delivery.partition, delivery.generation, delivery.message)
        send_cycle_signals(result)

    def _idle(self) -> bool:
        """Whether nothing runs or waits here: no handler, no outcome to record, no
        partition wanting a cycle."""
        return (self.dispatcher.busy == 0 and not self._pending
                and self.dispatcher.outcomes.empty()
                and not attention.cycle_wanted(self.partitions.values(), self.clock.now_ms()))

    def _may_extend(self, ident: Ident, offset: int) -> bool:
        return self.dispatcher.may_extend(ident, offset, self.conf.max_handler_time)

    def _awaited(self, ident: Ident, offset: int) -> bool:
        """Whether a handler of this message runs (or waits for a thread) here and has
        not been given up on."""
        return (self.dispatcher.is_running(ident, offset)
                and not self.dispatcher.overdue(ident, offset, self.conf.max_handler_time))

    def _pending_idents(self) -> set[Ident]:
        """Partitions with a handler outcome not recorded yet (reported ones included)."""
        self._drain_outcomes()
        return {o.partition.ident for o in self._pending}

    def _burst_done(self, delivered: int, pending: bool) -> bool:
        return (
            delivered == 0 and not pending and not self._pending
            and self.dispatcher.busy == 0
            and self.leasing.nothing_claimable
            and self.bursting.done(self.partitions.values(), self.clock.now_ms())
        )

    # ------------------------------------------------------------------ stopping

    def _shutdown(self) -> None:
        """Finish in-flight handlers within the grace period, record their outcomes,
        release every lease and deregister."""
        abandoned = drain(self.partitions.values(), self.conf.shutdown_grace,
                          lambda: self.dispatcher.busy, lambda: self._step("drain", self._tick),
                          lambda: bool(self._pending), self.wake)
        self._step("release", self._release_everything)
        self.dispatcher.shutdown(wait=False)
        if abandoned and not self.exit_code:
            # Handler threads cannot be stopped from outside; the caller ends the process
            # (runqueueworker does) instead of waiting for them at interpreter exit.
            self.exit_code = EXIT_HANDLERS_ABANDONED
            self.exit_reason = (f"stopped with {abandoned} handler(s) still running after the "
                                f"{self.conf.shutdown_grace:g}s shutdown grace")

    def _release_everything(self) -> None:
        self.limits.release_all(self.clock.now_ms())
        self.leasing.release_all()
        self.leasing.deregister(self.clock.now_ms())
