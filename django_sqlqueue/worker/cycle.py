"""The poll cycle: one fenced transaction that settles, advances and fetches.

Order inside the transaction, all on partitions the worker still owns:
fence (share-lock own leases) → record handler outcomes (acks, nacks, dead letters) →
extend visibility of long-running messages → walk and advance watermarks → fetch
deliverable messages → mark them delivered. Messages are handed to handlers only after
the transaction commits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ..consuming.message import Message
from ..consuming.registry import Subscription
from ..models import ConsumerOffset, DeliveryState, PartitionLease, QueueMessage
from ..models.delivery import MessageRef
from ..publishing import decode_json, epoch_ms_to_datetime
from .partitions import InFlight, Outcome, Partition

WALK_LIMIT = 500  # log rows read per partition per watermark walk


@dataclass
class Delivery:
    partition: Partition
    generation: int
    message: Message
    invisible_until: int


@dataclass
class DeadOnFetch:
    """A message whose attempts ran out without an outcome (its worker kept dying)."""

    partition: Partition
    message: Message
    error: str


@dataclass
class CycleResult:
    deliveries: list[Delivery] = field(default_factory=list)
    applied: list[Outcome] = field(default_factory=list)
    dropped: list[Outcome] = field(default_factory=list)  # their partition was lost
    dead_on_fetch: list[DeadOnFetch] = field(default_factory=list)
    lost: list[Partition] = field(default_factory=list)
    watermarks: dict[tuple[str, str, str], int] = field(default_factory=dict)
    settled: dict[tuple[str, str, str], bool] = field(default_factory=dict)
    walked: set[tuple[str, str, str]] = field(default_factory=set)
    # Acked delivery rows the watermark passed, deleted after the cycle (see cleanup()).
    passed: dict[tuple[str, str], list[MessageRef]] = field(default_factory=dict)
    # Partitions that may hold more deliverable messages than this cycle took.
    more: set[tuple[str, str, str]] = field(default_factory=set)
    extended: dict[tuple[tuple[str, str, str], int], int] = field(default_factory=dict)
    full: bool = False  # some partition returned a whole batch: poll again at once


class PollCycle:
    def __init__(self, worker_name: str, using: str, dlq_suffix: str) -> None:
        self.worker_name = worker_name
        self.using = using
        self.dlq_suffix = dlq_suffix

    def run(
        self, partitions: dict[tuple[str, str, str], Partition], looked: list[Partition],
        outcomes: list[Outcome], capacity: int, now_ms: int,
    ) -> CycleResult:
        result = CycleResult()
        with transaction.atomic(using=self.using):
            owned = PartitionLease.objects.fence(self.worker_name, list(partitions), self.using)
            result.lost = [p for p in partitions.values() if owned.get(p.ident) != p.generation]
            lost = {p.ident for p in result.lost}
            live = [o for o in outcomes if self._still_owned(o, partitions, lost)]
            result.dropped = [o for o in outcomes if o not in live]
            self._record_outcomes(live, now_ms)
            result.applied = live
            self._extend_visibility(partitions, lost, now_ms, result)
            looked = [p for p in looked if p.ident not in lost]
            self._advance_watermarks(looked, now_ms, result)
            self._fetch(looked, capacity, now_ms, result)
        return result

    @staticmethod
    def _still_owned(outcome: Outcome, partitions: dict[tuple[str, str, str], Partition],
                     lost: set[tuple[str, str, str]]) -> bool:
        partition = outcome.partition
        return (
            partitions.get(partition.ident) is partition
            and partition.ident not in lost
            and outcome.generation == partition.generation
        )

    def _record_outcomes(self, outcomes: list[Outcome], now_ms: int) -> None:
        acks: dict[tuple[str, str], list[MessageRef]] = defaultdict(list)
        for outcome in outcomes:
            message, ref = outcome.message, (outcome.message.key, outcome.message.offset)
            if outcome.kind == "ack":
                acks[(message.group, message.topic)].append(ref)
            elif outcome.kind == "nack":
                DeliveryState.objects.nack(
                    message.group, message.topic, ref, now_ms + int(outcome.delay * 1000),
                    outcome.error, self.using,
                )
            else:
                self._dead_letter(outcome.partition.subscription, message, outcome.error)
        for (group, topic), refs in acks.items():
            DeliveryState.objects.ack(group, topic, refs, self.using)

    def _dead_letter(self, subscription: Subscription, message: Message, error: str) -> None:
        """Copy to the group's dead-letter topic and ack for this group only; the original
        stays in the log for every other group."""
        QueueMessage.objects.copy_to_dead_letters(
            message.offset, subscription.topic + self.dlq_suffix, subscription.group,
            message.attempt, error, self.using,
        )
        DeliveryState.objects.ack(
            subscription.group, subscription.topic, [(message.key, message.offset)], self.using,
            error=error or "dead-lettered",
        )

    def _extend_visibility(self, partitions: dict[tuple[str, str, str], Partition],
                           lost: set[tuple[str, str, str]], now_ms: int,
                           result: CycleResult) -> None:
        by_subscription: dict[tuple[str, str], list[tuple[Partition, InFlight]]] = defaultdict(list)
        for partition in partitions.values():
            subscription = partition.subscription
            if partition.ident in lost or not subscription.auto_extend:
                continue
            timeout_ms = int(subscription.visibility_timeout * 1000)
            for flight in partition.in_flight.values():
                if flight.invisible_until - now_ms < timeout_ms // 2:
                    by_subscription[(partition.group, partition.topic)].append((partition, flight))
        for (group, topic), items in by_subscription.items():
            timeout_ms = int(items[0][0].subscription.visibility_timeout * 1000)
            refs = [(partition.key, flight.offset) for partition, flight in items]
            DeliveryState.objects.extend(group, topic, refs, now_ms + timeout_ms, self.using)
            for partition, flight in items:
                result.extended[(partition.ident, flight.offset)] = now_ms + timeout_ms

    def _advance_watermarks(self, looked: list[Partition], now_ms: int,
                            result: CycleResult) -> None:
        """Walk forward over acked messages; only partitions with new acks can move."""
        dirty = [p for p in looked if p.dirty]
        for partition in looked:
            result.watermarks[partition.ident] = partition.watermark
        for (group, topic), partitions in _by_subscription(dirty).items():
            bounds = {p.key: _walk_bound(p) for p in partitions}
            walked = QueueMessage.objects.walk(
                group, topic, {p.key: (p.watermark, bounds[p.key]) for p in partitions},
                WALK_LIMIT, self.using,
            )
            advanced: dict[str, int] = {}
            passed: list[MessageRef] = []
            for partition in partitions:
                rows = walked[partition.key]
                watermark = partition.watermark
                index = 0
                while index < len(rows) and rows[index][2]:
                    watermark = rows[index][0]
                    passed.append((partition.key, rows[index][1]))
                    index += 1
                if watermark > partition.watermark:
                    advanced[partition.key] = watermark
                result.watermarks[partition.ident] = watermark
                # Bounded walks cannot see past the bound, so they never claim "settled".
                result.settled[partition.ident] = (
                    index == len(rows) and len(rows) < WALK_LIMIT and bounds[partition.key] is None
                )
                result.walked.add(partition.ident)
            ConsumerOffset.objects.advance(group, topic, advanced, now_ms, self.using)
            if passed:
                result.passed[(group, topic)] = passed

    def _fetch(self, looked: list[Partition], capacity: int, now_ms: int,
               result: CycleResult) -> None:
        """Fetch and mark delivered, sharing the worker's free capacity fairly: every
        partition gets at least one slot, so many small partitions drain together."""
        wanting = [p for p in looked if p.capacity() > 0]
        if not wanting:
            return
        if capacity <= 0:
            result.more.update(p.ident for p in wanting)
            return
        fair = max(1, capacity // len(wanting))
        for (group, topic), partitions in _by_subscription(wanting).items():
            subscription = partitions[0].subscription
            windows = {
                p.key: (result.watermarks[p.ident], min(p.capacity(), fair)) for p in partitions
            }
            rows = QueueMessage.objects.fetch_deliverable(
                group, topic, windows, subscription.strict, now_ms, self.using
            )
            by_key = {p.key: p for p in partitions}
            counts: dict[str, int] = defaultdict(int)
            fresh: list[MessageRef] = []
            invisible_until = now_ms + int(subscription.visibility_timeout * 1000)
            for row in rows:
                partition = by_key[row[2]]
                counts[partition.key] += 1
                if capacity <= 0:
                    result.more.add(partition.ident)  # not marked: fetched again next cycle
                    continue
                message = _message(subscription, row)
                if message.attempt > subscription.max_attempts:
                    error = row[8] or (
                        f"visibility timeout expired {subscription.max_attempts} time(s) "
                        "without an ack or nack"
                    )
                    message.attempt -= 1  # the last attempt that actually ran
                    self._dead_letter(subscription, message, error)
                    result.dead_on_fetch.append(DeadOnFetch(partition, message, error))
                    continue
                capacity -= 1
                fresh.append((partition.key, message.offset))
                result.deliveries.append(
                    Delivery(partition, partition.generation, message, invisible_until)
                )
            DeliveryState.objects.mark_delivered(group, topic, fresh, invisible_until, self.using)
            for partition in partitions:
                if counts[partition.key] >= windows[partition.key][1]:
                    result.more.add(partition.ident)
                    result.full = True


def cleanup(passed: dict[tuple[str, str], list[MessageRef]], using: str) -> None:
    """Delete acked delivery rows behind the watermark, outside the poll transaction.

    The rows are never read again (every read is above the watermark), so this is only
    housekeeping. Done inside the poll transaction, an InnoDB DELETE that waits on a row at
    the edge of another worker's partition could deadlock with that worker's poll; alone,
    it can at worst wait a moment, and a failed attempt is simply repeated later.
    """
    for (group, topic), refs in list(passed.items()):
        DeliveryState.objects.delete_acked(group, topic, refs, using)
        del passed[(group, topic)]


def _walk_bound(partition: Partition) -> int | None:
    """While messages are in flight, acked ones lie at or below the highest position handed
    out, so the walk stops there instead of reading the backlog behind it. With nothing in
    flight the walk is unbounded, which also tells whether the partition is caught up."""
    return partition.max_position if partition.in_flight else None


def _by_subscription(partitions: list[Partition]) -> dict[tuple[str, str], list[Partition]]:
    grouped: dict[tuple[str, str], list[Partition]] = defaultdict(list)
    for partition in partitions:
        grouped[(partition.group, partition.topic)].append(partition)
    return grouped


def _message(subscription: Subscription, row: tuple[Any, ...]) -> Message:
    offset, position, key, message_id, payload, metadata, published_at, retries, _error = row
    return Message(
        topic=subscription.topic, key=key, id=message_id, offset=offset,
        payload=decode_json(payload), headers=decode_json(metadata) or {},
        published_at=epoch_ms_to_datetime(published_at),
        attempt=1 if retries < 0 else retries + 2,
        group=subscription.group, position=position,
    )
