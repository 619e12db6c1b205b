"""The poll cycle: one fenced transaction that settles, extends, delivers and advances.

Order inside the transaction, all on partitions the worker still owns:
fence (share-lock own leases) → rebuild the windows of newly taken partitions → record
handler outcomes (acks, nacks, dead letters) → extend visibility of long-running messages
→ hand out what is due and read new messages, within the worker's free capacity → advance
watermarks, drop the delivery rows they passed, save watermarks and read cursors → write
the acks the watermarks did not pass (a passed one's row is gone already).
Messages are handed to handlers only after the transaction commits.

The cycle changes the partitions' in-memory state as it goes. If the transaction fails,
the worker marks those partitions unloaded, and the next cycle rebuilds them from what
the database committed. A cycle may be narrowed to some messages of one partition, to
find the message that makes it fail (see :mod:`.isolation`): then it touches no other
message of that partition, or dead-letters the one it found.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable

from django.db import transaction

from ..models import ConsumerOffset, DeliveryState, PartitionLease, QueueMessage, Throughput
from ..models.delivery import MessageRef
from ..models.offsets import Progress
from ..models.throughput import MINUTE_MS
from . import poison
from .delivering import deliver
from .isolation import Narrowing
from .limits import LimitGate
from .outcomes import Outcome
from .partitions import Ident, Partition, by_subscription
from .recording import Ledger, record
from .results import CycleResult
from .waiting import settle_parked
from .window import Entry

Subscriber = tuple[str, str]  # (consumer group, topic)


class PollCycle:
    def __init__(self, worker_name: str, token: str, using: str, dlq_suffix: str,
                 clock: Callable[[], int], is_running: Callable[[Ident, int], bool],
                 may_extend: Callable[[Ident, int], bool],
                 gate: LimitGate | None = None) -> None:
        self.worker_name = worker_name
        self.token = token  # this process's fencing token (see PartitionLease)
        self.using = using
        self.dlq_suffix = dlq_suffix
        self.clock = clock  # epoch ms by the database clock
        self.is_running = is_running  # a handler of this process runs (partition, offset)
        self.may_extend = may_extend  # ... and its message should be kept invisible
        self.gate = gate  # fleet-wide limits (see .limits)

    def run(self, partitions: dict[Ident, Partition], outcomes: list[Outcome],
            capacity: int, idle_threads: int, result: CycleResult | None = None,
            narrowing: Narrowing | None = None) -> CycleResult:
        """Run one cycle over ``partitions``; ``result`` (new if None) holds what it did,
        as far as it got should it fail. ``narrowing`` restricts one partition's part."""
        result = CycleResult() if result is None else result
        only = None if narrowing is None else {narrowing.ident: narrowing.offsets}
        with transaction.atomic(using=self.using):
            # A cycle with no outcome to record only hands out: a database crash that
            # undid it would redeliver, which at-least-once allows, so it does not wait
            # for its commit's flush (PostgreSQL).
            fenced = PartitionLease.objects.fence(self.worker_name, self.token,
                                                  list(partitions), self.using,
                                                  commit_async=not outcomes and narrowing is None)
            owned, seen = fenced.owned, fenced.seen
            # A partition whose lease row another transaction holds sits this cycle out:
            # its outcomes wait, and the leasing finds out soon whether it is still ours.
            result.lost = [p for p in partitions.values()
                           if p.ident in seen and owned.get(p.ident) != p.generation]
            lost = {p.ident for p in result.lost}
            held = [p for p in partitions.values()
                    if p.ident in seen and p.ident not in lost]
            sitting_out = {ident for ident in partitions if ident not in seen}
            _note_cancellations(held, fenced.cancellations)
            self._load([p for p in held if not p.loaded])
            now_ms = self.clock()
            if self.gate is not None:
                self.gate.release(now_ms)  # before delivering: held ones may go
            if narrowing is not None and narrowing.doom is not None:
                self._dead_letter(held, narrowing, result)
            ledger = record(partitions, outcomes, lost, sitting_out, now_ms, result,
                            self.using, self.dlq_suffix)
            settle_parked(held, now_ms, self.using)  # a settled key's next message goes now
            self._extend(held, now_ms, result, only)
            deliver(held, capacity, idle_threads, now_ms, result, self.clock, self.using,
                    self.dlq_suffix, self.gate, only)
            settle_parked(held, now_ms, self.using)
            ledger.flush(self._advance(held, ledger))
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
        for (group, topic), members in by_subscription(partitions).items():
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

    def _dead_letter(self, partitions: list[Partition], narrowing: Narrowing,
                     result: CycleResult) -> None:
        """A narrowed cycle that found its message: dead-letter it instead of handing it
        out or recording its outcome (an outcome still pending finds no entry, and is
        dropped)."""
        for partition in partitions:
            if partition.ident == narrowing.ident:
                poison.dead_letter_offsets(partition, narrowing.offsets, narrowing.doom or "",
                                           result, self.dlq_suffix, self.using)

    def _extend(self, partitions: list[Partition], now_ms: int, result: CycleResult,
                only: dict[Ident, frozenset[int]] | None) -> None:
        """Push back the visibility of running messages that used half their timeout."""
        due: dict[Subscriber, list[tuple[Partition, Entry]]] = defaultdict(list)
        for partition in partitions:
            allowed = None if only is None else only.get(partition.ident)
            for entry in partition.due_for_extension(now_ms, self.may_extend):
                if allowed is not None and entry.offset not in allowed:
                    continue  # a narrowed cycle touches no other message of it
                due[(partition.group, partition.topic)].append((partition, entry))
                result.report(partition).extended.append(entry.offset)
        for (group, topic), items in due.items():
            until = now_ms + int(items[0][0].subscription.visibility_timeout * 1000)
            DeliveryState.objects.extend(group, topic, [p.ref(e.offset) for p, e in items],
                                         until, self.using)
            for partition, entry in items:
                partition.extended(entry.offset, until)

    def _advance(self, partitions: list[Partition],
                 ledger: Ledger) -> dict[Subscriber, set[MessageRef]]:
        """Move watermarks past acked messages, drop the delivery rows they passed, and save
        watermarks and read cursors, one statement per subscription for each. Returns
        the rows of this cycle's acks it deleted (their acks need no write)."""
        deleted: dict[Subscriber, set[MessageRef]] = {}
        for (group, topic), members in by_subscription(partitions).items():
            passed: dict[str, tuple[int, int]] = {}
            for partition in members:
                moved = partition.advance()
                if moved is not None:
                    passed[partition.number] = moved
            if passed:
                offsets = QueueMessage.objects.offsets_between(topic, passed, self.using)
                refs = {MessageRef(p, o) for p, o in offsets}
                # This cycle's acks are not written yet: their rows go whatever they say.
                # Every other row must say acked (a parked message the watermark passed
                # keeps its row).
                acked_now = refs.intersection(ledger.acked_refs(group, topic))
                DeliveryState.objects.delete_refs(group, topic, sorted(acked_now), self.using)
                DeliveryState.objects.delete_acked(group, topic, sorted(refs - acked_now),
                                                   self.using)
                deleted[(group, topic)] = acked_now
            unsaved = {p.number: Progress(p.watermark, p.cursor)
                       for p in members if p.progress_due()}
            if unsaved:
                ConsumerOffset.objects.save_progress(group, topic, unsaved, self.clock(),
                                                     self.using)
                for partition in members:
                    partition.progress_written()
        return deleted


def _note_cancellations(partitions: list[Partition], counts: dict[Ident, int]) -> None:
    """Rebuild the windows of partitions in which a message was cancelled since the last
    cycle: the rebuild reads the delivery rows, where the cancelled message is acked, so
    it is never handed out from memory. Read under the fence, the count orders every
    cancellation before or after this cycle's hand-outs."""
    for partition in partitions:
        count = counts.get(partition.ident)
        if partition.cancellations is not None and count != partition.cancellations:
            partition.unreliable()
        partition.cancellations = count
