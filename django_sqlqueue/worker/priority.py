"""Handing out a prioritised subscription's messages (task queues): highest priority first.

A worker reads ahead of its free capacity into each held partition's window (held
messages get a delivery row, so a new owner finds them), keeps the due ones in a
priority heap per partition, and each cycle hands out the best of all the partitions it
holds for that subscription. So a task enqueued behind a backlog starts before the
backlog, as far as this worker has read: up to READ_AHEAD messages per cycle, and at
most the window (SQLQUEUE["MAX_WINDOW"] unacked messages per partition; messages that
are not due yet are parked instead, and come back when due). With several workers each
orders its own partitions; priority does not reach across workers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ..models import DeliveryState, QueueMessage
from ..models.delivery import Hold
from ..models.messages import MessageRow
from .handout import HandOut
from .partitions import Partition
from .waiting import note_parked_keys
from .window import Entry

# Messages one cycle reads ahead for a subscription, over all its partitions: bounds the
# cycle's cost however deep the backlog is; later cycles read on until the windows hold
# the whole backlog (or are full).
READ_AHEAD = 2000


def best_first(partitions: list[Partition], now_ms: int, limit: int) -> list[tuple[Partition, Entry]]:
    """Up to ``limit`` due entries of ``partitions``, highest priority first, then oldest."""
    heads: list[tuple[int, int, int, int]] = []  # (-priority, position, offset, index)
    for index, partition in enumerate(partitions):
        entry = partition.best_ready(now_ms)
        if entry is not None:
            heads.append((-entry.priority, entry.position, entry.offset, index))
    heapq.heapify(heads)
    chosen: list[tuple[Partition, Entry]] = []
    while heads and len(chosen) < limit:
        _, _, offset, index = heapq.heappop(heads)
        partition = partitions[index]
        partition.pop_best()
        chosen.append((partition, partition.entries[offset]))
        entry = partition.best_ready(now_ms)
        if entry is not None:
            heapq.heappush(heads, (-entry.priority, entry.position, entry.offset, index))
    return chosen


def deliver_by_priority(members: list[Partition], limit: int, now_ms: int, handout: HandOut,
                        on_hand_out: Callable[[Partition], None], using: str) -> None:
    """Read ahead into the windows of one subscription's ``members``, then hand out its
    ``limit`` best due messages; what is read and not handed out is held."""
    subscription = members[0].subscription
    group, topic = subscription.group, subscription.topic
    fresh: dict[int, MessageRow] = {}
    held: dict[int, Hold] = {}
    reads = [p for p in members if p.unread() and p.window_space() > 0]
    if reads:
        each = max(1, READ_AHEAD // len(reads))
        limits = {p.number: min(each, p.window_space()) for p in reads}
        rows = DeliveryState.objects.read_new(
            group, topic, {p.number: (p.cursor, limits[p.number]) for p in reads}, using)
        by_number = {p.number: p for p in reads}
        counts = dict.fromkeys(limits, 0)
        note_parked_keys(reads, rows, using)
        for row in rows:
            partition = by_number[row.partition]
            counts[row.partition] += 1
            admitted = partition.admit(row, now_ms, may_deliver=False)
            if admitted.entry is None:
                continue
            fresh[row.message.offset] = row.message
            if admitted.hold_until is not None:
                held[row.message.offset] = Hold(partition.number, row.message.offset,
                                                admitted.hold_until)
        for partition in reads:
            if counts[partition.number] < limits[partition.number]:
                partition.head = partition.cursor  # a short read reached the end
    chosen = best_first(members, now_ms, limit)
    missing = [entry.offset for _, entry in chosen if entry.offset not in fresh]
    stored = QueueMessage.objects.by_offsets(missing, using) if missing else {}
    for partition, entry in chosen:
        message_row = fresh.get(entry.offset) or stored.get(entry.offset)
        if message_row is None:  # cannot happen while the watermark is below it; never wedge on it
            partition.settled(entry)
            continue
        message = handout.message(partition, entry, message_row, entry.attempts + 1)
        if message is None:  # held back, or dead-lettered
            continue
        # Handed out now: the delivery row written for it makes a hold row needless.
        held.pop(entry.offset, None)
        if entry.attempts >= subscription.max_attempts:
            handout.expire(partition, entry, message)
            continue
        handout.give(partition, entry, message)
        on_hand_out(partition)
    if held:
        handout.holds[(group, topic)].extend(held.values())
