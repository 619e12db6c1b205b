"""Operator actions on consumer groups: pause, resume, deliver now, release leases,
forget, and garbage collection on demand."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from ..conf import get_settings, queue_database
from ..groups import Forgotten, forget_group
from ..models import (
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
    Topic,
)
from ..models.delivery import NEVER_DELIVERED, MessageRef
from ..worker.collector import collect_garbage
from .errors import AlreadyHandled, OperationError, UnknownMessage, UnknownSubscriber
from .names import check_name, database_now_ms, require_registered

__all__ = ["Forgotten", "deliver_now", "forget", "pause", "release_leases", "resume", "run_gc"]


def pause(group: str, topic: str, *, by: str = "", using: str | None = None) -> bool:
    """Pause ``group`` on ``topic``: within a poll interval its workers take no new
    deliveries of it; running handlers finish and are recorded, leases and order are kept,
    publishing goes on. Survives worker restarts. Returns False if it was paused already."""
    using = using or queue_database(topic)
    require_registered(group, topic, using)
    return GroupControl.objects.set_paused(group, topic, True, by, using)


def resume(group: str, topic: str, *, by: str = "", using: str | None = None) -> bool:
    """Undo :func:`pause`; the workers go on where they stopped. Returns False if the
    group was not paused."""
    using = using or queue_database(topic)
    require_registered(group, topic, using)
    return GroupControl.objects.set_paused(group, topic, False, by, using)


def deliver_now(group: str, topic: str, offset: int, *, by: str = "",
                using: str | None = None) -> bool:
    """Make message ``offset`` of ``topic`` deliverable to ``group`` at once, if it waits
    out a delay, a retry backoff or its key's head. Returns False when it was deliverable
    already (or is running); raises AlreadyHandled when the group is done with it.

    The group's workers reload their windows of the topic within a poll interval.
    """
    using = using or queue_database(topic)
    require_registered(group, topic, using)
    row = (QueueMessage.objects.using(using).filter(offset=offset, topic=topic)
           .values_list("partition_key", "position", "deliver_at").first())
    if row is None or row[1] is None:
        raise UnknownMessage(f"topic {topic!r} has no sequenced message with offset {offset}")
    partition, position, deliver_at = row[0], int(row[1]), int(row[2])
    now_ms = database_now_ms(using)
    ref = MessageRef(partition, offset)
    with transaction.atomic(using=using):
        state = (DeliveryState.objects.using(using)
                 .filter(consumer_group=group, topic=topic, partition_key=partition,
                         message_offset=offset).values_list("acked", flat=True).first())
        if state is None:
            watermark = (ConsumerOffset.objects.using(using)
                         .filter(consumer_group=group, topic=topic, partition_key=partition)
                         .values_list("offset_acked", flat=True).first()) or 0
            if position <= watermark:
                raise AlreadyHandled(f"consumer group {group!r} has consumed message {offset}")
            if deliver_at <= now_ms:
                return False  # not read yet, and due: it goes out with the next read
            # A delayed message the group has not read yet: a row read with the message
            # makes it due now (rows above the read cursor are honoured).
            try:
                with transaction.atomic(using=using):
                    DeliveryState.objects.using(using).create(
                        consumer_group=group, topic=topic, partition_key=partition,
                        message_offset=offset, acked=False, invisible_until=now_ms,
                        retry_count=NEVER_DELIVERED, last_error="")
                changed = True
            except IntegrityError:
                # A worker read it meanwhile and wrote its own row: change that one.
                changed = DeliveryState.objects.make_due(group, topic, ref, now_ms, using) > 0
        elif state:
            raise AlreadyHandled(f"consumer group {group!r} has acked message {offset}")
        else:
            changed = DeliveryState.objects.make_due(group, topic, ref, now_ms, using) > 0
        if changed:
            GroupControl.objects.nudge(group, topic, by, using)
    return changed


@dataclass(frozen=True)
class Released:
    leases: int  # partitions freed
    subscriber: str | None


def release_leases(*, subscriber: str | None = None, group: str | None = None,
                   topic: str | None = None, partition: str | None = None,
                   using: str | None = None) -> Released:
    """Free the partitions a worker holds (all, or of one group, topic, partition): the
    owner notices at its next poll and drops them, and the group rebalances. Their
    in-flight messages are redelivered once their visibility runs out.

    Needs ``subscriber`` or both ``group`` and ``topic``.
    """
    using = using or queue_database(topic)
    if subscriber is None and (group is None or topic is None):
        raise OperationError("name a subscriber, or a consumer group and a topic")
    leases = PartitionLease.objects.using(using).exclude(leased_by="")
    if subscriber is not None:
        if not subscriber or not subscriber.isprintable():
            raise UnknownSubscriber(f"{subscriber!r} is not a subscriber name")
        leases = leases.filter(leased_by=subscriber)
    if group is not None or topic is not None:
        if group is None or topic is None:
            raise OperationError("a consumer group and a topic go together")
        require_registered(group, topic, using)
        leases = leases.filter(consumer_group=group, topic=topic)
    if partition is not None:
        leases = leases.filter(partition_key=partition)
    if subscriber is not None and not leases.exists() and not SubscriberHeartbeat.objects.using(
            using).filter(subscriber_name=subscriber).exists():
        raise UnknownSubscriber(f"no worker named {subscriber!r} holds a lease or has a heartbeat")
    freed = 0
    # One subscription at a time, so each UPDATE is a primary-key range (see
    # PartitionLeaseManager): a scan would lock other workers' lease rows.
    for g, t, p, owner in list(leases.values_list("consumer_group", "topic", "partition_key",
                                                  "leased_by")):
        freed += PartitionLease.objects.using(using).filter(
            consumer_group=g, topic=t, partition_key=p, leased_by=owner,
        ).update(leased_by="", lease_token="", lease_renewed_at=0)
    return Released(freed, subscriber)


def forget(group: str, topic: str | None = None, *, using: str | None = None) -> Forgotten:
    """Retire a consumer group none of whose workers is live (stopped, or stale: killed)
    on ``topic``, or on every topic when it is None (see
    :func:`django_sqlqueue.groups.forget_group`), and its pause state. An empty topic is
    refused, never read as every topic."""
    using = using or queue_database(topic)
    if topic is not None:
        if not topic:
            raise OperationError("the topic is empty: name one, or pass None to forget the "
                                 "group on every topic")
        check_name("topic", topic)
    done = forget_group(group, topic, using=using)
    for name in done.topics:
        GroupControl.objects.delete_group(group, name, using)
    return done


@dataclass(frozen=True)
class Collected:
    deleted: dict[str, int]  # messages deleted per topic

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def run_gc(*, topic: str | None = None, using: str | None = None) -> Collected:
    """Run garbage collection now over every topic (or ``topic``), as a worker's GC
    thread does, honouring GROUP_RETENTION; return what it deleted."""
    using = using or queue_database(topic)
    if topic is not None:
        check_name("topic", topic)
        topics = [topic]
    else:
        topics = sorted(set(Topic.objects.using(using).values_list("topic", flat=True)))
    retention = get_settings().group_retention
    deleted = {}
    for name in topics:
        count = collect_garbage([name], {}, using, retention=retention)
        if count:
            deleted[name] = count
    return Collected(deleted)
