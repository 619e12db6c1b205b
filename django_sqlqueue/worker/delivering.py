"""Handing out what is due and reading new messages, within the worker's free capacity.

The capacity is shared fairly: every partition that wants work gets at least one slot.
Prioritised subscriptions (task queues) pool their partitions' shares and hand out their
best messages first (see :mod:`.priority`); the others hand out what came due (retries,
delayed messages, keys whose head was settled), then read on in log order.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from ..models import DeliveryState, QueueMessage
from ..models.delivery import Hold, ReadRow
from .handout import HandOut
from .limits import LimitGate
from .partitions import Ident, Partition, by_subscription
from .priority import deliver_by_priority
from .results import CycleResult
from .waiting import note_parked_keys, unpark_due
from .window import Entry

# Messages one cycle reads from the log at most when what it reads waits (and is parked)
# instead of going out: bounds the cycle, however many waiting messages lie ahead.
READ_BUDGET = 1000


def deliver(partitions: list[Partition], capacity: int, idle_threads: int, now_ms: int,
            result: CycleResult, clock: Callable[[], int], using: str, dlq_suffix: str,
            gate: LimitGate | None = None,
            only: Mapping[Ident, frozenset[int]] | None = None) -> None:
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
    shares = _Shares({p.ident: max(1, free // len(wanting)) for p in wanting}, idle_threads)
    share = shares.left
    # A limited subscription's partitions hand out together no more than its limits may
    # let go this cycle: more would only be read, held back and written as holds.
    capped = set()
    for members in by_subscription(wanting).values():
        if gate is None:
            break
        cap, until = gate.hand_out_cap(members[0].subscription, now_ms)
        if cap is None:
            continue
        # The cap shared by its partitions here, at least one each while it is not 0 (a
        # partition's messages may be all that can go).
        each = 0 if cap == 0 else max(1, -(-cap // len(members)))
        for partition in members:
            share[partition.ident] = min(share[partition.ident], each)
            capped.add(partition.ident)
        if cap == 0:
            # Nothing of it can go before ``until``: what is due waits for that in memory,
            # and nothing new is read (it would only be held back and written as a hold,
            # every cycle the worker runs for its other work).
            for partition in members:
                partition.postpone(now_ms, until)
    unpark_due(wanting, share, now_ms, using)
    handout = HandOut(result, clock, using, dlq_suffix, gate, only)
    prioritised = [p for p in wanting if p.subscription.priority_of is not None]
    for members in by_subscription(prioritised).values():
        # The subscription's partitions pool their shares: the best message of any of
        # them goes first.
        deliver_by_priority(members, sum(share[p.ident] for p in members), now_ms, handout,
                            shares.spend_one, using)
    wanting = [p for p in wanting if p.subscription.priority_of is None]
    ready: list[tuple[Partition, Entry]] = []
    for partition in wanting:
        limit = share[partition.ident]
        if not partition.subscription.auto_extend:
            limit = min(limit, shares.unextended_left)
        for entry in partition.take_ready(now_ms, limit):
            ready.append((partition, entry))
            shares.spend(partition)
    _redeliver(ready, handout, using)
    reads = {p.ident: p for p in wanting
             if share[p.ident] > 0 and p.unread() and p.window_space() > 0}
    budget = READ_BUDGET
    while reads and budget > 0:
        kept = {ident: _kept(p) for ident, p in reads.items()}
        for (group, topic), members in by_subscription(reads.values()).items():
            limits = {p.number: min(share[p.ident], p.window_space()) for p in members}
            rows = DeliveryState.objects.read_new(
                group, topic, {p.number: (p.cursor, limits[p.number]) for p in members},
                using,
            )
            budget -= len(rows)
            _admit(members, rows, limits, shares, handout, clock(), using)
        # Messages read and parked (they wait) used none of the share: read on past
        # them, within the cycle's read budget, while nothing read stays waiting here.
        reads = {ident: p for ident, p in reads.items()
                 if share[ident] > 0 and p.unread() and p.window_space() > 0
                 and _kept(p) == kept[ident]}
    for partition in reads.values():
        result.report(partition).more = True  # the budget ran out: poll again at once
    handout.write()
    # Poll again at once only while capacity is left for partitions that used up
    # their share: with none left, the next handler to finish wakes the worker.
    if free - len(result.deliveries) > 0:
        for partition in [*prioritised, *wanting]:
            if (share[partition.ident] <= 0 and partition.ident not in capped
                    and partition.wants_look(now_ms)):
                result.report(partition).more = True


class _Shares:
    """What is left of each partition's share of the free capacity this cycle, and of the
    hand-outs for partitions without auto-extension: only as many as there are idle
    handler threads, so no such message waits in the worker while its visibility
    timeout runs."""

    def __init__(self, left: dict[Ident, int], idle_threads: int) -> None:
        self.left = left
        self.unextended_left = idle_threads

    def may_deliver(self, partition: Partition) -> bool:
        return self.left[partition.ident] > 0 and (
            partition.subscription.auto_extend or self.unextended_left > 0)

    def spend(self, partition: Partition) -> None:
        self.left[partition.ident] -= 1
        if not partition.subscription.auto_extend:
            self.unextended_left -= 1

    def spend_one(self, partition: Partition) -> None:
        """A prioritised hand-out: it spends the partition's share only."""
        self.left[partition.ident] -= 1


def _redeliver(ready: list[tuple[Partition, Entry]], handout: HandOut, using: str) -> None:
    if not ready:
        return
    rows = QueueMessage.objects.by_offsets([entry.offset for _, entry in ready], using)
    for partition, entry in ready:
        row = rows.get(entry.offset)
        if row is None:  # cannot happen while the watermark is below it; never wedge on it
            partition.settled(entry)
            continue
        message = handout.message(partition, entry, row, entry.attempts + 1)
        if message is not None:
            handout.give_or_expire(partition, entry, message)


def _admit(members: list[Partition], rows: list[ReadRow], limits: dict[str, int],
           shares: _Shares, handout: HandOut, now_ms: int, using: str) -> None:
    by_number = {p.number: p for p in members}
    counts: dict[str, int] = defaultdict(int)
    note_parked_keys(members, rows, using)
    for row in rows:
        partition = by_number[row.partition]
        counts[row.partition] += 1
        admitted = partition.admit(row, now_ms, may_deliver=shares.may_deliver(partition))
        if admitted.entry is None:
            continue
        if admitted.deliver:
            shares.spend(partition)
            message = handout.message(partition, admitted.entry, row.message, 1)
            if message is not None:
                handout.give(partition, admitted.entry, message)
        elif admitted.hold_until is not None:
            handout.hold(partition, Hold(partition.number, admitted.entry.offset,
                                         admitted.hold_until))
    for partition in members:
        if counts[partition.number] < limits[partition.number]:
            # A short read reached the end of the partition: only new messages follow.
            partition.head = partition.cursor


def _kept(partition: Partition) -> int:
    """Entries of the window that are not in flight."""
    return len(partition.entries) - partition.in_flight_count()
