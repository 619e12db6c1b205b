"""Cancelling a message that has not started, for one consumer group or for all of them.

A cancellation marks the group's delivery row of the message acked, so no worker of the
group hands it out, its watermark passes it and GC collects it, as if it had been handled.
It is ordered against the group's worker by the partition's lease row: the worker
share-locks that row for its whole poll cycle (the transaction that hands messages out),
and the cancellation locks it exclusively. So either the cycle that hands the message out
commits first, and the cancellation finds it running, or the cancellation commits first,
having bumped the row's count of cancellations, and the worker's next cycle, reading that
count under its fence, rebuilds its window from the delivery rows without the message.
Never both.

Handed out counts as started, whatever the delivery's visibility: a message handed out
may still wait in its worker for a thread, or its worker may have stalled past the
visibility timeout while keeping the lease, and either way its handler starts (or goes
on) without asking the database again. Only an outcome recorded for it (or a start
undone) ends that. Recording each start in the database instead would let a cancellation
take a message still queued in a worker, at the price of a write per handler start.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from django.db import transaction

from .conf import queue_database
from .models import (
    Cancellation,
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    PartitionLease,
    QueueMessage,
    Topic,
    waiting,
)
from .models.cancellations import ALL_GROUPS
from .models.delivery import MessageRef
from .models.fields import ID_LENGTH, KEY_LENGTH
from .operations.errors import AmbiguousMessage, UnknownMessage, UnknownSubscription
from .operations.names import check_name, database_now_ms, require_registered
from .sequencing import sequence_all

# last_error of a delivery row acked by a cancellation.
CANCELLED_MARK = "cancelled"
# Seconds cancel() waits for a message just published to be positioned by the sequencer.
SEQUENCING_WAIT = 5.0

__all__ = ["AmbiguousMessage", "CancelResult", "CancelStatus", "cancel", "skip_cancelled"]


class CancelStatus(enum.StrEnum):
    """What a cancellation found for one consumer group."""

    CANCELLED = "cancelled"  # never handed to this group's handlers (now, or by an earlier call)
    RUNNING = "running"  # handed to a handler already: not interrupted, not cancelled
    DONE = "done"  # the group has handled it (acked or dead-lettered) already


@dataclass(frozen=True)
class CancelResult:
    """The outcome of :func:`cancel`: the message, and per consumer group what was found."""

    topic: str
    id: str
    key: str
    offset: int
    groups: dict[str, CancelStatus] = field(default_factory=dict)
    for_all_groups: bool = False  # groups registering later skip it too

    @property
    def cancelled(self) -> bool:
        """Cancelled for every group asked about (and, for all groups, for later ones)."""
        return all(status is CancelStatus.CANCELLED for status in self.groups.values())

    def __str__(self) -> str:
        groups = ", ".join(f"{g}: {s}" for g, s in sorted(self.groups.items())) or "no group yet"
        return f"{self.topic} id={self.id!r} offset={self.offset}: {groups}"


def cancel(topic: str, id: str, group: str | None = None, *, key: str | None = None,  # noqa: A002 - the publish() argument's name
           by: str = "", using: str | None = None) -> CancelResult:
    """Cancel message ``id`` of ``topic`` for ``group``, or for every consumer group
    (those registered now and those that register later) when ``group`` is None.

    A message already running is not interrupted: the result says so per group. Safe to
    repeat. ``key`` is needed when the id was published under several keys (ids are unique
    per topic and key); giving it also makes the look-up one index seek.
    """
    check_name("topic", topic)
    if not isinstance(id, str) or not id or len(id) > ID_LENGTH:
        raise UnknownMessage(f"{id!r} is not a message id (1-{ID_LENGTH} characters)")
    if key is not None and (not isinstance(key, str) or len(key) > KEY_LENGTH):
        raise UnknownMessage(f"{key!r} is not a message key (up to {KEY_LENGTH} characters)")
    using = using or queue_database(topic)
    if group is not None:
        require_registered(group, topic, using)
    found = _find(topic, id, key, using)
    deadline = time.monotonic() + SEQUENCING_WAIT
    while found[2] is None and time.monotonic() < deadline:
        # Committed but not positioned yet: position it, or let the worker sequencing
        # right now (which this sequencer passes over) do it.
        if not sequence_all(using, sequenced_by=by or "cancel"):
            time.sleep(0.05)
        found = _find(topic, id, key, using)
    offset, partition, position, message_key = found
    if position is None:
        raise UnknownMessage(f"message {id!r} of topic {topic!r} is not sequenced yet; "
                             "try again in a moment")
    message = _Message(topic, partition, offset, position, message_key)
    statuses: dict[str, CancelStatus] = {}
    with transaction.atomic(using=using):
        if group is None:
            # Exclusive on the topic's row: a group registering meanwhile (it shares the
            # row to copy the "all groups" records) either is among the groups read
            # below, or registers after this commits and sees the record.
            Topic.objects.lock(topic, shared=False, using=using)
            Cancellation.objects.record(topic, partition, offset, [ALL_GROUPS], by, using)
            groups = PartitionLease.objects.groups_of_partition(topic, partition, using)
        else:
            groups = [group]
        for name in groups:
            statuses[name] = _cancel_for(name, message, explicit=group is not None, by=by,
                                        using=using)
        Cancellation.objects.record(
            topic, partition, offset,
            [g for g, s in statuses.items() if s is CancelStatus.CANCELLED], by, using)
    return CancelResult(topic, id, message_key, offset, statuses, for_all_groups=group is None)


@dataclass(frozen=True)
class _Message:
    topic: str
    partition: str
    offset: int
    position: int
    key: str

    @property
    def ref(self) -> MessageRef:
        return MessageRef(self.partition, self.offset)


def _find(topic: str, id: str, key: str | None, using: str  # noqa: A002 - as in cancel()
          ) -> tuple[int, str, int | None, str]:
    rows = QueueMessage.objects.using(using).filter(topic=topic, message_id=id)
    if key is not None:
        rows = rows.filter(message_key=key)
    found = list(rows.values_list("offset", "partition_key", "position", "message_key")[:11])
    if not found:
        under = "" if key is None else f" under key {key!r}"
        raise UnknownMessage(f"topic {topic!r} has no message with id {id!r}{under} (never "
                             "published, or consumed by every group and collected)")
    if len(found) > 1:
        keys = ", ".join(repr(r[3]) for r in found[:10]) + (", ..." if len(found) > 10 else "")
        raise AmbiguousMessage(f"id {id!r} names messages of topic {topic!r} under several keys "
                               f"({keys}): name one with --key / key=")
    offset, partition, position, message_key = found[0]
    return int(offset), partition, None if position is None else int(position), message_key


def _cancel_for(group: str, message: _Message, *, explicit: bool, by: str, using: str
                ) -> CancelStatus:
    """Cancel for one group, under its lease row's lock (see the module's docstring)."""
    if not PartitionLease.objects.lock_for_cancel(group, message.topic, message.partition,
                                                  using):
        if explicit:
            raise UnknownSubscription(
                f"consumer group {group!r} has no worker lease on topic {message.topic!r} "
                "(a Spark stream reads every message; only worker groups can skip one)")
        return CancelStatus.DONE  # pragma: no cover - the groups were read from lease rows
    view = DeliveryState.objects.cancel_view(group, message.topic, message.ref, using)
    if view is None:
        watermark = (ConsumerOffset.objects.using(using)
                     .filter(consumer_group=group, topic=message.topic,
                             partition_key=message.partition)
                     .values_list("offset_acked", flat=True).first()) or 0
        if message.position <= int(watermark):
            return _done_or_cancelled(group, message, using)
    elif view.acked:
        if view.last_error == CANCELLED_MARK:
            return CancelStatus.CANCELLED
        return _done_or_cancelled(group, message, using)
    elif view.running():
        return CancelStatus.RUNNING
    DeliveryState.objects.cancel(group, message.topic, message.ref, CANCELLED_MARK, using)
    PartitionLease.objects.note_cancellation(group, message.topic, message.partition, using)
    if message.key and _release_key(group, message, using):
        # The key's next message is due now, which the group's workers cannot know: wake
        # them (they reload their windows of the topic within a poll interval).
        GroupControl.objects.nudge(group, message.topic, by, using)
    return CancelStatus.CANCELLED


def _done_or_cancelled(group: str, message: _Message, using: str) -> CancelStatus:
    cancelled = Cancellation.objects.recorded_for(message.topic, message.offset, group, using)
    return CancelStatus.CANCELLED if cancelled else CancelStatus.DONE


def _release_key(group: str, message: _Message, using: str) -> bool:
    """Strict mode: the key's next parked message waited for the cancelled one (or for
    nothing the group still keeps): let it go, as a worker does when a key's head is done.
    Returns whether it did."""
    if DeliveryState.objects.key_in_window(group, message.topic, message.partition,
                                           message.key, using):
        return False  # the worker releases it when the message it keeps is done
    heads = waiting.key_heads(group, message.topic, [(message.partition, message.key)], using)
    head = heads.get((message.partition, message.key))
    if head is None or head.state != waiting.PARKED_BEHIND:
        return False
    ref = MessageRef(head.partition, head.offset)
    waiting.promote(group, message.topic, [ref], using)
    # It waited with the cancelled message's due time: now it is due at its own.
    deliver_at = (QueueMessage.objects.using(using).filter(offset=head.offset)
                  .values_list("deliver_at", flat=True).first()) or 0
    DeliveryState.objects.make_due(group, message.topic, ref,
                                   max(int(deliver_at), database_now_ms(using)), using)
    return True




def skip_cancelled(group: str, topic: str, partitions: list[str], using: str) -> None:
    """A group registering for ``partitions`` of ``topic`` skips the messages cancelled
    there for all groups. Run after its lease and watermark rows are committed."""
    with transaction.atomic(using=using):
        # Shared on the topic's row, which cancel() holds exclusively while it cancels for
        # all groups: this group is among the groups it cancels for, or sees its record.
        if Topic.objects.lock(topic, shared=True, using=using):
            Cancellation.objects.for_new_group(group, topic, partitions, CANCELLED_MARK, using)
