"""The poll cycle's steps for waiting messages.

A message that waits long (delayed, or a retry backing off) or waits in a crowded window is
*parked*: its delivery row says so (:mod:`django_sqlqueue.models.waiting`), the partition
forgets it and the watermark moves past it. These steps write what the partitions parked,
read parked messages back when they come due, and, in strict mode, let a key's next
parked message go once the key's earlier messages are done. So a partition's memory and
the rows its watermark holds back stay bounded however many messages wait in it, and
its due messages are never stuck behind waiting ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..models import waiting
from ..models.delivery import MessageRef, ReadRow
from .partitions import Ident, Partition

Subscriber = tuple[str, str]  # (consumer group, topic)


def note_parked_keys(members: list[Partition], rows: list[ReadRow], using: str) -> None:
    """Before ``rows`` are read into the windows of one subscription's strict partitions:
    tell each partition which of the rows' keys have parked messages (a message of such
    a key is parked behind them)."""
    by_number = {p.number: p for p in members
                 if p.strict and p.parked_keys_possible is not False}
    wanted = sorted({(row.partition, row.message.key) for row in rows
                     if row.message.key and row.partition in by_number})
    if not wanted:
        return
    subscription = members[0].subscription
    for partition, key in waiting.keys_parked(subscription.group, subscription.topic, wanted,
                                              using):
        by_number[partition].keys_have_parked({key})


def unpark_due(partitions: list[Partition], limits: dict[Ident, int], now_ms: int,
               using: str) -> None:
    """Read parked messages that came due back into the windows: up to each partition's
    limit, earliest due first, so the cycle hands them out with the rest."""
    looking = [p for p in partitions if p.parked_due(now_ms) and limits.get(p.ident, 0) > 0
               and p.window_space() > 0]
    for (group, topic), members in _by_subscription(looking).items():
        takes = {p.number: min(limits[p.ident], p.window_space()) for p in members}
        # Entries already read back (in flight, say) come first in due order: ask for
        # that many more.
        asked = {p.number: takes[p.number] + p.unparked_count() + 1 for p in members}
        rows: dict[str, list[ReadRow]] = defaultdict(list)
        for row in waiting.due(group, topic, asked, using):
            rows[row.partition].append(row)
        for partition in members:
            _take_due(partition, rows[partition.number], takes[partition.number],
                      asked[partition.number], now_ms)


def _take_due(partition: Partition, rows: list[ReadRow], take: int, asked: int,
              now_ms: int) -> None:
    next_due: int | None = None
    for row in rows:
        due = row.delivery.invisible_until if row.delivery else 0
        if row.message.offset in partition.entries:
            continue
        if due <= now_ms and take > 0:
            if partition.unpark(row) is not None:
                take -= 1
            continue
        next_due = due  # not due yet, or more are due than this cycle takes
        break
    else:
        if len(rows) >= asked:
            next_due = now_ms  # every row asked for was here already: look again
    partition.looked_for_parked(next_due)


def settle_parked(partitions: list[Partition], now_ms: int, using: str) -> None:
    """Park the rows the partitions decided to park (retries that back off for long
    included), and make the next parked message of each key whose messages here are all
    done deliverable. After recording outcomes (so that message goes out in the same
    cycle) and at the end of the cycle."""
    for (group, topic), members in _by_subscription(partitions).items():
        parks: list[waiting.Park] = []
        for partition in members:
            partition.park_retries(now_ms)
            parks += partition.take_parking()
        waiting.park(group, topic, parks, using)
        by_number = {p.number: p for p in members}
        checks = [(p.number, key) for p in members if p.strict for key in p.take_key_checks()]
        if checks:
            heads = waiting.key_heads(group, topic, checks, using)
            waiting.promote(group, topic, [MessageRef(h.partition, h.offset) for h in heads.values()
                                           if h.state == waiting.PARKED_BEHIND], using)
            for number, key in checks:
                by_number[number].key_head_found(key, heads.get((number, key)))
        for partition in members:
            if partition.strict and partition.parked_keys_possible is None:
                partition.parked_keys_possible = waiting.any_keyed(group, topic, partition.number,
                                                                   using)


def _by_subscription(partitions: Iterable[Partition]) -> dict[Subscriber, list[Partition]]:
    grouped: dict[Subscriber, list[Partition]] = defaultdict(list)
    for partition in partitions:
        grouped[(partition.group, partition.topic)].append(partition)
    return grouped
