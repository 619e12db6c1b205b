"""The poll cycle: one fenced transaction that settles, extends, delivers and advances.

Order inside the transaction, all on partitions the worker still owns:
fence (share-lock own leases) → rebuild the windows of newly taken partitions → record
handler outcomes (acks, nacks, dead letters) → extend visibility of long-running messages
→ hand out what is due and read new messages, within the worker's free capacity → advance
watermarks and drop the delivery rows they passed → save watermarks and read cursors.
Messages are handed to handlers only after the transaction commits.

The cycle changes the partitions' in-memory state as it goes. If the transaction fails,
the worker marks those partitions unloaded, and the next cycle rebuilds them from what
the database committed.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

from ..consuming.message import DeadLetterInfo, Message
from ..db.errors import is_transient
from ..logtext import loggable
from ..models import ConsumerOffset, DeliveryState, PartitionLease, QueueMessage, Throughput
from ..models.delivery import Hold, MessageRef, ReadRow
from ..models.messages import DeadLetterSource
from ..models.offsets import Progress
from ..models.throughput import MINUTE_MS
from . import hooks
from .outcomes import Outcome
from .partitions import Entry, Ident, Partition
from .priority import deliver_by_priority
from .waiting import note_parked_keys, settle_parked, unpark_due

logger = logging.getLogger("django_sqlqueue.worker")

Subscriber = tuple[str, str]  # (consumer group, topic)
# Cycles in which recording one outcome may fail before it is dropped (and its message
# redelivered once its visibility runs out).
OUTCOME_ATTEMPTS = 3
# Messages one cycle reads from the log at most when what it reads waits (and is parked)
# instead of going out: bounds the cycle, however many waiting messages lie ahead.
READ_BUDGET = 1000


@dataclass
class Delivery:
    partition: Partition
    generation: int
    message: Message


@dataclass
class DeadOnFetch:
    """A message whose attempts ran out without an outcome (its workers kept dying)."""

    partition: Partition
    message: Message
    error: str


@dataclass
class PartitionReport:
    """What one cycle did in one partition."""

    partition: Partition
    deliveries: list[Delivery] = field(default_factory=list)
    recorded: list[Outcome] = field(default_factory=list)
    dead_on_fetch: list[DeadOnFetch] = field(default_factory=list)
    more: bool = False  # it could hand out more at once


@dataclass
class CycleResult:
    reports: dict[Ident, PartitionReport] = field(default_factory=dict)
    lost: list[Partition] = field(default_factory=list)
    # Outcomes no longer pending: recorded, ignored as stale, or for a lost partition.
    done: list[Outcome] = field(default_factory=list)

    def report(self, partition: Partition) -> PartitionReport:
        report = self.reports.get(partition.ident)
        if report is None:
            report = self.reports[partition.ident] = PartitionReport(partition)
        return report

    @property
    def deliveries(self) -> list[Delivery]:
        return [d for r in self.reports.values() for d in r.deliveries]

    @property
    def full(self) -> bool:
        return any(r.more for r in self.reports.values())


@dataclass
class _Writes:
    """Delivery-state writes of one cycle, batched per subscription."""

    handed_out: dict[Subscriber, list[tuple[Partition, Entry]]] = field(
        default_factory=lambda: defaultdict(list))
    holds: dict[Subscriber, list[Hold]] = field(default_factory=lambda: defaultdict(list))
    # (partition, offset) of every message handed out this cycle: each goes out once.
    out: set[tuple[Ident, int]] = field(default_factory=set)


class PollCycle:
    def __init__(self, worker_name: str, token: str, using: str, dlq_suffix: str,
                 clock: Callable[[], int], is_running: Callable[[Ident, int], bool],
                 may_extend: Callable[[Ident, int], bool]) -> None:
        self.worker_name = worker_name
        self.token = token  # this process's fencing token (see PartitionLease)
        self.using = using
        self.dlq_suffix = dlq_suffix
        self.clock = clock  # epoch ms by the database clock
        self.is_running = is_running  # a handler of this process runs (partition, offset)
        self.may_extend = may_extend  # ... and its message should be kept invisible
        # Hand-outs left this cycle for partitions without auto-extension: only as many as
        # there are idle handler threads, so no such message waits in the worker while
        # its visibility timeout runs.
        self._unextended_left = 0

    def run(self, partitions: dict[Ident, Partition], outcomes: list[Outcome],
            capacity: int, idle_threads: int) -> CycleResult:
        result = CycleResult()
        self._unextended_left = idle_threads
        with transaction.atomic(using=self.using):
            owned, seen = PartitionLease.objects.fence(self.worker_name, self.token,
                                                       list(partitions), self.using)
            # A partition whose lease row another transaction holds sits this cycle out:
            # its outcomes wait, and the leasing finds out soon whether it is still ours.
            result.lost = [p for p in partitions.values()
                           if p.ident in seen and owned.get(p.ident) != p.generation]
            lost = {p.ident for p in result.lost}
            held = [p for p in partitions.values()
                    if p.ident in seen and p.ident not in lost]
            sitting_out = {ident for ident in partitions if ident not in seen}
            self._load([p for p in held if not p.loaded])
            now_ms = self.clock()
            self._record(partitions, outcomes, lost, sitting_out, now_ms, result)
            settle_parked(held, now_ms, self.using)  # a settled key's next message goes now
            self._extend(held, now_ms)
            self._deliver(held, capacity, now_ms, result)
            settle_parked(held, now_ms, self.using)
            self._advance(held)
            self._count(result, now_ms)
        return result

    # ----------------------------------------------------------------- steps

    def _count(self, result: CycleResult, now_ms: int) -> None:
        """Add what this cycle finished to the per-minute throughput counters, one upsert
        for all subscriptions, in the cycle's transaction: it counts exactly what the
        cycle committed."""
        counts: dict[Subscriber, tuple[int, int]] = {}
        for report in result.reports.values():
            partition = report.partition
            handled = sum(o.counts[0] for o in report.recorded) + len(report.dead_on_fetch)
            failed = sum(o.counts[1] for o in report.recorded) + len(report.dead_on_fetch)
            if handled or failed:
                key = (partition.group, partition.topic)
                before = counts.get(key, (0, 0))
                counts[key] = (before[0] + handled, before[1] + failed)
        if counts:
            Throughput.objects.add(self.worker_name, now_ms - now_ms % MINUTE_MS, counts,
                                   self.using)

    def _load(self, partitions: list[Partition]) -> None:
        """Rebuild the windows of partitions just taken (or left unreliable by a failed
        cycle) from the delivery rows of their unacked messages."""
        for (group, topic), members in _by_subscription(partitions).items():
            numbers = [p.number for p in members]
            ConsumerOffset.objects.ensure(group, topic, numbers, self.using)
            progress = ConsumerOffset.objects.progress(group, topic, numbers, self.using)
            for partition in members:
                mark = progress.get(partition.number, Progress(0, 0))
                partition.reset(mark.acked, mark.fetched,
                                functools.partial(self.is_running, partition.ident))
            rows = DeliveryState.objects.unacked_window(
                group, topic, {p.number: (p.watermark, p.cursor) for p in members}, self.using,
            )
            by_number = {p.number: p for p in members}
            now_ms = self.clock()
            for row in rows:
                partition = by_number[row.partition]
                entry = partition.admit(row, now_ms, may_deliver=False).entry
                if entry is not None and self.is_running(partition.ident, entry.offset):
                    partition.running(entry)
            for partition in members:
                partition.rebuilt()

    def _record(self, partitions: dict[Ident, Partition], outcomes: list[Outcome],
                lost: set[Ident], sitting_out: set[Ident], now_ms: int,
                result: CycleResult) -> None:
        ledger = _Ledger(self, now_ms)
        for outcome in outcomes:
            partition = outcome.partition
            if partition.ident in sitting_out and partitions.get(partition.ident) is partition:
                continue  # recorded once its lease row can be fenced again
            if (partitions.get(partition.ident) is not partition or partition.ident in lost
                    or outcome.generation != partition.generation):
                result.done.append(outcome)
                continue  # the partition was lost: its new owner decides
            entry = partition.entry_for(outcome.message)
            if entry is None:
                result.done.append(outcome)
                continue  # already acked (a duplicate run finished first)
            if outcome.message.attempt < entry.attempts and not outcome.stands_when_superseded:
                result.done.append(outcome)
                continue  # a newer delivery of it is running; that one decides
            if self._record_one(outcome, ledger, entry, partition):
                result.done.append(outcome)
                result.report(partition).recorded.append(outcome)
            elif outcome.failures >= OUTCOME_ATTEMPTS:
                result.done.append(outcome)
                logger.error(
                    "giving up recording a handler outcome after %s failures; the message "
                    "will be redelivered when its visibility runs out group=%s topic=%s "
                    "partition=%s offset=%s", outcome.failures, partition.group,
                    partition.topic, partition.number, entry.offset,
                )
        ledger.flush()
        hooks.call(result.reports.values(), lambda report: report.recorded,
                   lambda hooks_, outcomes: hooks_.recorded(outcomes, self.using))

    def _record_one(self, outcome: Outcome, ledger: _Ledger, entry: Entry,
                    partition: Partition) -> bool:
        """Record one outcome in a savepoint of its own: an outcome the database refuses
        (a bug, or a value no check foresaw) is kept back, not allowed to fail the whole
        cycle and with it every other partition's progress. Returns whether it stuck."""
        if not outcome.writes_now:
            outcome.record(ledger, entry, partition.ref(entry.offset))
            return True
        try:
            with transaction.atomic(using=self.using):
                outcome.record(ledger, entry, partition.ref(entry.offset))
        except Exception as exc:
            if is_transient(exc):
                raise  # contention or a lost connection: the whole cycle is retried
            outcome.failures += 1
            logger.warning(
                "could not record a handler outcome (try %s of %s) group=%s topic=%s "
                "partition=%s offset=%s error=%s: %s", outcome.failures, OUTCOME_ATTEMPTS,
                partition.group, partition.topic, partition.number, entry.offset,
                type(exc).__name__, loggable(" ".join(str(exc).split()), 300),
            )
            return False
        return True

    def dead_letter(self, partition: Partition, message: Message, error: str) -> None:
        """Copy to the group's dead-letter topic and ack for this group only; the original
        stays in the log for every other group."""
        QueueMessage.objects.copy_to_dead_letters(
            _dead_letter_source(message), partition.topic + self.dlq_suffix, partition.group,
            message.attempt, error, self.using,
        )
        DeliveryState.objects.ack(partition.group, partition.topic,
                                  [partition.ref(message.offset)], self.using,
                                  error=error or "dead-lettered")

    def _extend(self, partitions: list[Partition], now_ms: int) -> None:
        """Push back the visibility of running messages that used half their timeout."""
        due: dict[Subscriber, list[tuple[Partition, Entry]]] = defaultdict(list)
        for partition in partitions:
            for entry in partition.due_for_extension(now_ms, self.may_extend):
                due[(partition.group, partition.topic)].append((partition, entry))
        for (group, topic), items in due.items():
            until = now_ms + int(items[0][0].subscription.visibility_timeout * 1000)
            DeliveryState.objects.extend(group, topic, [p.ref(e.offset) for p, e in items],
                                         until, self.using)
            for partition, entry in items:
                partition.extended(entry.offset, until)

    def _deliver(self, partitions: list[Partition], capacity: int, now_ms: int,
                 result: CycleResult) -> None:
        """Hand out what is due, then read new messages, sharing the worker's free capacity
        fairly: every partition that wants work gets at least one slot."""
        free = capacity - sum(p.in_flight_count() for p in partitions)
        # Only from partitions whose lease is surely still ours: a handler would not start
        # for the others (see Partition.usable), and their messages would wait out their
        # visibility. The next renewal makes them sure again.
        sure = time.monotonic()
        wanting = [p for p in partitions if sure < p.valid_until and p.wants_look(now_ms)]
        if not wanting or free <= 0:
            return  # a handler finishing wakes the worker, and frees capacity
        share = {p.ident: max(1, free // len(wanting)) for p in wanting}
        unpark_due(wanting, share, now_ms, self.using)
        writes = _Writes()
        prioritised = [p for p in wanting if p.subscription.priority_of is not None]
        for members in _by_subscription(prioritised).values():
            # The subscription's partitions pool their shares: the best message of any of
            # them goes first.
            deliver_by_priority(self, members, sum(share[p.ident] for p in members), now_ms,
                                writes, result, lambda p: _spend(share, p))
        wanting = [p for p in wanting if p.subscription.priority_of is None]
        ready: list[tuple[Partition, Entry]] = []
        for partition in wanting:
            limit = share[partition.ident]
            if not partition.subscription.auto_extend:
                limit = min(limit, self._unextended_left)
            for entry in partition.take_ready(now_ms, limit):
                ready.append((partition, entry))
                share[partition.ident] -= 1
                if not partition.subscription.auto_extend:
                    self._unextended_left -= 1
        self._redeliver(ready, writes, result)
        reads = {p.ident: p for p in wanting
                 if share[p.ident] > 0 and p.unread() and p.window_space() > 0}
        budget = READ_BUDGET
        while reads and budget > 0:
            kept = {ident: _kept(p) for ident, p in reads.items()}
            for (group, topic), members in _by_subscription(reads.values()).items():
                limits = {p.number: min(share[p.ident], p.window_space()) for p in members}
                rows = DeliveryState.objects.read_new(
                    group, topic, {p.number: (p.cursor, limits[p.number]) for p in members},
                    self.using,
                )
                budget -= len(rows)
                self._admit(members, rows, limits, share, writes, result)
            # Messages read and parked (they wait) used none of the share: read on past
            # them, within the cycle's read budget, while nothing read stays waiting here.
            reads = {ident: p for ident, p in reads.items()
                     if share[ident] > 0 and p.unread() and p.window_space() > 0
                     and _kept(p) == kept[ident]}
        for partition in reads.values():
            result.report(partition).more = True  # the budget ran out: poll again at once
        self._write_deliveries(writes, result)
        hooks.call(result.reports.values(), lambda report: [d.message for d in report.deliveries],
                   lambda hooks_, messages: hooks_.handed_out(messages, self.using))
        self._describe_dead_letters(result)
        # Poll again at once only while capacity is left for partitions that used up
        # their share: with none left, the next handler to finish wakes the worker.
        if free - len(result.deliveries) > 0:
            for partition in [*prioritised, *wanting]:
                if share[partition.ident] <= 0 and partition.wants_look(now_ms):
                    result.report(partition).more = True

    def _redeliver(self, ready: list[tuple[Partition, Entry]], writes: _Writes,
                   result: CycleResult) -> None:
        if not ready:
            return
        rows = QueueMessage.objects.by_offsets([entry.offset for _, entry in ready], self.using)
        for partition, entry in ready:
            row = rows.get(entry.offset)
            subscription = partition.subscription
            if row is None:  # cannot happen while the watermark is below it; never wedge on it
                partition.settled(entry)
                continue
            message = Message.from_row(row, subscription.group, entry.attempts + 1,
                                       partition.number)
            if entry.attempts >= subscription.max_attempts:
                self.expire(partition, entry, message, result)
                continue
            self._hand_out(partition, entry, message, writes, result)

    def expire(self, partition: Partition, entry: Entry, message: Message,
               result: CycleResult) -> None:
        """Dead-letter a message whose attempts ran out without an outcome (its workers
        kept dying, or kept losing it to the visibility timeout)."""
        subscription = partition.subscription
        error = entry.last_error or (
            f"visibility timeout expired {subscription.max_attempts} time(s) "
            "without an ack or nack"
        )
        message.attempt = entry.attempts  # the last attempt that actually ran
        self.dead_letter(partition, message, error)
        partition.settled(entry)
        result.report(partition).dead_on_fetch.append(DeadOnFetch(partition, message, error))

    def _admit(self, members: list[Partition], rows: list[ReadRow], limits: dict[str, int],
               share: dict[Ident, int], writes: _Writes, result: CycleResult) -> None:
        by_number = {p.number: p for p in members}
        counts: dict[str, int] = defaultdict(int)
        now_ms = self.clock()
        note_parked_keys(members, rows, self.using)
        for row in rows:
            partition = by_number[row.partition]
            counts[row.partition] += 1
            may_deliver = share[partition.ident] > 0 and (
                partition.subscription.auto_extend or self._unextended_left > 0)
            admitted = partition.admit(row, now_ms, may_deliver=may_deliver)
            if admitted.entry is None:
                continue
            if admitted.deliver:
                share[partition.ident] -= 1
                if not partition.subscription.auto_extend:
                    self._unextended_left -= 1
                message = Message.from_row(row.message, partition.group, 1, partition.number)
                self._hand_out(partition, admitted.entry, message, writes, result)
            elif admitted.hold_until is not None:
                writes.holds[(partition.group, partition.topic)].append(
                    Hold(partition.number, admitted.entry.offset, admitted.hold_until))
        for partition in members:
            if counts[partition.number] < limits[partition.number]:
                # A short read reached the end of the partition: only new messages follow.
                partition.head = partition.cursor

    def _hand_out(self, partition: Partition, entry: Entry, message: Message, writes: _Writes,
                  result: CycleResult) -> None:
        """Deliver ``entry``; its visibility is set in _write_deliveries, from the clock read
        after every fetch of the cycle, so slow reads never eat into a handler's time."""
        if (partition.ident, entry.offset) in writes.out:
            return  # already going out in this cycle: one handler per delivery
        writes.out.add((partition.ident, entry.offset))
        writes.handed_out[(partition.group, partition.topic)].append((partition, entry))
        result.report(partition).deliveries.append(Delivery(partition, partition.generation, message))

    def _write_deliveries(self, writes: _Writes, result: CycleResult) -> None:
        for (group, topic), holds in writes.holds.items():
            DeliveryState.objects.hold(group, topic, holds, self.using)
        now_ms = self.clock()
        for (group, topic), items in writes.handed_out.items():
            until = now_ms + int(items[0][0].subscription.visibility_timeout * 1000)
            DeliveryState.objects.mark_delivered(
                group, topic, [p.ref(e.offset) for p, e in items], until, self.using)
            for partition, entry in items:
                partition.delivered(entry, until)

    def _describe_dead_letters(self, result: CycleResult) -> None:
        """Tell handlers of a dead-letter topic which group gave up on each message, where
        it came from and why."""
        copies = [d.message for d in result.deliveries if d.partition.topic.endswith(self.dlq_suffix)]
        if not copies:
            return
        details = QueueMessage.objects.dead_letter_details([m.offset for m in copies], self.using)
        for message in copies:
            found = details.get(message.offset)
            if found is not None and found[0]:  # a copy made by a worker, not a plain publish
                message.dead_letter = DeadLetterInfo(*found)

    def _advance(self, partitions: list[Partition]) -> None:
        """Move watermarks past acked messages, drop the delivery rows they passed, and save
        watermarks and read cursors, one statement per subscription for each."""
        for (group, topic), members in _by_subscription(partitions).items():
            passed: dict[str, tuple[int, int]] = {}
            for partition in members:
                moved = partition.advance()
                if moved is not None:
                    passed[partition.number] = moved
            if passed:
                offsets = QueueMessage.objects.offsets_between(topic, passed, self.using)
                DeliveryState.objects.delete_acked(
                    group, topic, [MessageRef(p, o) for p, o in offsets], self.using)
            unsaved = {p.number: Progress(p.watermark, p.cursor)
                       for p in members if not p.progress_saved}
            if unsaved:
                ConsumerOffset.objects.save_progress(group, topic, unsaved, self.clock(),
                                                     self.using)
                for partition in members:
                    partition.progress_written()


class _Ledger:
    """How a poll cycle records outcomes: acks batched into one statement per consumer
    group and topic, retries and dead letters one by one."""

    def __init__(self, cycle: PollCycle, now_ms: int) -> None:
        self.cycle = cycle
        self.now_ms = now_ms
        self.acks: dict[Subscriber, list[MessageRef]] = defaultdict(list)

    def ack(self, partition: Partition, ref: MessageRef) -> None:
        self.acks[(partition.group, partition.topic)].append(ref)

    def nack(self, partition: Partition, ref: MessageRef, due_ms: int, error: str) -> None:
        DeliveryState.objects.nack(partition.group, partition.topic, ref, due_ms, error,
                                   self.cycle.using)

    def dead_letter(self, partition: Partition, message: Message, error: str) -> None:
        self.cycle.dead_letter(partition, message, error)

    def undeliver(self, partition: Partition, ref: MessageRef) -> None:
        DeliveryState.objects.undeliver(partition.group, partition.topic, ref, self.now_ms,
                                        self.cycle.using)

    def flush(self) -> None:
        for (group, topic), refs in self.acks.items():
            DeliveryState.objects.ack(group, topic, refs, self.cycle.using)


def _dead_letter_source(message: Message) -> DeadLetterSource:
    return DeadLetterSource(
        message.offset, message.topic, message.key, message.id,
        json.dumps(message.payload, cls=DjangoJSONEncoder, separators=(",", ":")),
        json.dumps(message.headers, separators=(",", ":")),
        round(message.published_at.timestamp() * 1000),
    )


def _kept(partition: Partition) -> int:
    """Entries of the window that are not in flight."""
    return len(partition.entries) - partition.in_flight_count()


def _spend(share: dict[Ident, int], partition: Partition) -> None:
    share[partition.ident] -= 1


def _by_subscription(partitions: Iterable[Partition]) -> dict[Subscriber, list[Partition]]:
    grouped: dict[Subscriber, list[Partition]] = defaultdict(list)
    for partition in partitions:
        grouped[(partition.group, partition.topic)].append(partition)
    return grouped
