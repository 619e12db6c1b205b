"""Change a topic's partition count, which is only safe once the topic is drained.

A key's messages are ordered because they all land in one partition. With a new count a
key may map to another partition, where a second worker could handle its new messages
while the old ones still wait in the old partition. So a topic is repartitioned only when
every consumer group has acked all its sequenced messages. The check and the new count
are one short transaction that holds the sequencer's lock, so no message is positioned
(and mapped) in between; every message positioned later is mapped with the new count.
What the old mapping leaves is then removed in short transactions of their own, so no
worker waits long for a row they hold: the removed partitions' lease rows, then their
watermark rows, then the consumed messages (and any delivery rows of them), DELETE_BATCH
at a time. Watermarks and read cursors of the remaining partitions stay: they are log
positions, and every later message gets a higher one. Unsequenced messages are left
alone; the sequencer maps them with the new count.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from .conf import MAX_PARTITIONS, queue_database
from .exceptions import TopicNotDrained
from .models import (
    ConsumerOffset,
    DeliveryState,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
    Topic,
)
from .partitioning import partition_names
from .publishing import validate_topic

DELETE_BATCH = 1000  # messages per DELETE statement


@dataclass(frozen=True)
class RepartitionResult:
    topic: str
    old_partitions: int | None  # None: the topic had no recorded count yet
    new_partitions: int
    deleted_messages: int  # consumed messages removed with the old mapping

    @property
    def changed(self) -> bool:
        return self.old_partitions != self.new_partitions


def repartition(topic: str, partitions: int, *, using: str | None = None) -> RepartitionResult:
    """Give ``topic`` ``partitions`` partitions; raise TopicNotDrained unless every consumer
    group registered for it has consumed all its sequenced messages (see module doc)."""
    using = using or queue_database(topic)
    validate_topic(topic)
    if (not isinstance(partitions, int) or isinstance(partitions, bool)
            or not 1 <= partitions <= MAX_PARTITIONS):
        raise ValueError(
            f"partitions must be a whole number from 1 to {MAX_PARTITIONS}, got {partitions!r}"
        )
    with transaction.atomic(using=using):
        # Wait for a running sequencer rather than skip it: until this commits, nothing is
        # positioned, so the topic cannot gain unconsumed messages after the check below,
        # and every message positioned up to ``last`` is mapped with the old count.
        last = LogSequencer.objects.lock_counter_wait(using)
        old = Topic.objects.partition_counts([topic], using).get(topic)
        if old is None:
            # Never sequenced: nothing is mapped yet. A worker starting meanwhile may have
            # recorded the configured count first; then that is the count to change.
            old = Topic.objects.record({topic: partitions}, using)[topic]
            if old == partitions:
                return RepartitionResult(topic, None, partitions, 0)
        if old == partitions:
            return RepartitionResult(topic, old, partitions, 0)
        _check_drained(topic, using)
        groups = DeliveryState.objects.groups_of(topic, using)
        Topic.objects.set_partitions(topic, partitions, using)
    keep = set(partition_names(partitions))
    # Lease rows first: a worker's poll locks its lease rows before the state they guard.
    with transaction.atomic(using=using):
        PartitionLease.objects.delete_other_partitions(topic, keep, using)
    with transaction.atomic(using=using):
        ConsumerOffset.objects.delete_other_partitions(topic, keep, using)
    return RepartitionResult(topic, old, partitions, _delete_consumed(topic, last, groups, using))


def _delete_consumed(topic: str, last: int, groups: list[str], using: str) -> int:
    """Delete the topic's messages positioned up to ``last`` (every group consumed them)
    and the groups' delivery rows of them, DELETE_BATCH messages per transaction."""
    deleted, after = 0, 0
    while True:
        offsets = QueueMessage.objects.sequenced_offsets(topic, after, DELETE_BATCH, using,
                                                         up_to=last)
        if not offsets:
            return deleted
        with transaction.atomic(using=using):
            DeliveryState.objects.delete_messages(groups, topic, offsets, using)
            deleted += QueueMessage.objects.delete_offsets(offsets, using)
        after = offsets[-1]


def _check_drained(topic: str, using: str) -> None:
    """Raise TopicNotDrained unless each group registered for ``topic`` (the groups GC
    waits for: those with watermark rows) and each group with a worker on record has acked
    every sequenced message of it."""
    groups = sorted(set(ConsumerOffset.objects.registered_groups([topic], using)[topic])
                    | set(SubscriberHeartbeat.objects.groups_of([topic], using)[topic]))
    if not groups:
        # Nobody has consumed these yet; deleting them would lose them.
        waiting = QueueMessage.objects.sequenced_count(topic, using)
        if waiting:
            raise TopicNotDrained(topic, {}, unclaimed=waiting)
        return
    behind = {group: count for group, count
              in ConsumerOffset.objects.unconsumed_counts(topic, groups, using).items() if count}
    if behind:
        raise TopicNotDrained(topic, behind)
