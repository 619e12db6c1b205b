"""Retiring a consumer group: ``forget_group()``, behind ``manage.py sqlqueue forget``.

A registered group (one with watermark rows for a topic) holds garbage collection back
until it has acked each message, even while none of its workers runs: that is what lets a
group be stopped for a deploy without losing messages. A group that is gone for good must
therefore be retired, or the log grows without end. Forgetting deletes the group's state
for the topic (watermarks, delivery rows, leases, heartbeats); messages only it still
needed become collectable. ``SQLQUEUE["GROUP_RETENTION"]`` retires idle groups from GC
automatically, without deleting their state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .conf import get_settings, queue_database
from .db.liveness import judged_by_locks
from .exceptions import SQLQueueError
from .models import (
    ConsumerOffset,
    DeliveryState,
    LogSequencer,
    PartitionLease,
    SubscriberHeartbeat,
)
from .models.fields import GROUP_LENGTH, TOPIC_LENGTH
from .models.heartbeats import lock_held_expression

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")  # what @subscriber and publish() accept


class GroupInUse(SQLQueueError):
    """forget_group() refused: a worker of the group is running."""


class UnknownGroup(SQLQueueError, ValueError):
    """forget_group() was given a group (or group and topic) with no state to forget."""


@dataclass(frozen=True)
class Forgotten:
    """What forget_group() deleted, per kind of row."""

    group: str
    topics: list[str]
    watermarks: int
    deliveries: int
    leases: int
    heartbeats: int


def forget_group(group: str, topic: str | None = None, *, using: str | None = None,
                 now_ms: int | None = None) -> Forgotten:
    """Delete the state of consumer ``group`` for ``topic`` (every topic when None).

    Refuses with GroupInUse while a worker of the group has a live heartbeat for one of
    those topics (stop its workers first, or they would register it again at once), and
    with UnknownGroup when there is nothing to forget.
    """
    using = using or queue_database(topic)
    if not group:
        raise UnknownGroup("a consumer group name is required")
    # A name no group or topic can have has no state; saying so is also what keeps text
    # the database cannot take (a lone surrogate from a badly encoded argument) away from it.
    _check_name("consumer group", group, GROUP_LENGTH)
    if topic is not None:
        _check_name("topic", topic, TOPIC_LENGTH)
    offsets = ConsumerOffset.objects.using(using).filter(consumer_group=group)
    if topic is not None:
        offsets = offsets.filter(topic=topic)
    topics = sorted(set(offsets.values_list("topic", flat=True)) | set(
        SubscriberHeartbeat.objects.using(using).filter(
            consumer_group=group, **({"topic": topic} if topic else {}))
        .values_list("topic", flat=True)))
    if not topics:
        where = f" for topic {topic!r}" if topic else ""
        raise UnknownGroup(f"consumer group {group!r} has no state{where} to forget")
    if now_ms is None:
        now_ms = LogSequencer.objects.head(using)[2]  # the database clock
    alive_after = now_ms - int(get_settings().lease_duration * 1000)
    running = SubscriberHeartbeat.objects.using(using).filter(
        consumer_group=group, topic__in=topics, deregistered_at=0, heartbeat_at__gt=alive_after)
    if judged_by_locks(using):  # a killed worker's session is gone: it runs nothing
        running = running.filter(lock_held_expression(using))
    live = sorted(running.values_list("subscriber_name", flat=True))
    if live:
        raise GroupInUse(
            f"consumer group {group!r} has {len(live)} running worker(s) "
            f"({', '.join(live[:3])}{', ...' if len(live) > 3 else ''}); stop them first")
    counts = {"watermarks": 0, "deliveries": 0, "leases": 0, "heartbeats": 0}
    with transaction.atomic(using=using):
        for name in topics:
            mine = {"consumer_group": group, "topic": name}
            counts["deliveries"] += DeliveryState.objects.using(using).filter(**mine).delete()[0]
            counts["watermarks"] += ConsumerOffset.objects.using(using).filter(**mine).delete()[0]
            counts["leases"] += PartitionLease.objects.using(using).filter(**mine).delete()[0]
            counts["heartbeats"] += (
                SubscriberHeartbeat.objects.using(using).filter(**mine).delete()[0])
    return Forgotten(group, topics, **counts)


def _check_name(kind: str, name: Any, limit: int) -> None:
    if not isinstance(name, str) or len(name) > limit or not _NAME_RE.fullmatch(name):
        raise UnknownGroup(f"{name!r} is not a {kind} name (up to {limit} letters, digits, '.', "
                           "'_' and '-'), so there is no state to forget")
