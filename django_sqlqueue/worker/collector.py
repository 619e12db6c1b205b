"""Garbage collection: delete messages every consumer group has acked past."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction

from ..models import ConsumerOffset, QueueMessage, SubscriberHeartbeat

logger = logging.getLogger("django_sqlqueue.worker")

GC_BATCH = 1000  # messages deleted per statement


def collect_garbage(
    topics: Iterable[str], known_groups: dict[str, set[str]], using: str,
    collected: dict[tuple[str, str], int] | None = None,
) -> int:
    """Delete, per partition, the messages at or below the lowest watermark of all groups.

    A group counts if it ever registered a worker for the topic (or is configured here);
    a partition that some such group has no watermark for yet is not collected, so a
    group that is merely behind never loses messages. Dead-letter copies live in their
    own topic and are kept until that topic's own consumers pass them.

    ``collected`` remembers each partition's horizon from earlier calls, so partitions
    whose horizon has not moved cost nothing.
    """
    collected = {} if collected is None else collected
    deleted = 0
    topics = list(topics)
    registered = SubscriberHeartbeat.objects.groups_of(topics, using)
    for topic in topics:
        groups = sorted(set(registered.get(topic, [])) | known_groups.get(topic, set()))
        horizons = ConsumerOffset.objects.gc_horizons(topic, groups, using)
        for partition, horizon in horizons.items():
            if collected.get((topic, partition), 0) >= horizon:
                continue
            while True:
                offsets = QueueMessage.objects.collectable_offsets(topic, partition, horizon,
                                                                   GC_BATCH, using)
                if not offsets:
                    break
                with transaction.atomic(using=using):
                    deleted += QueueMessage.objects.delete_offsets(offsets, using)
                if len(offsets) < GC_BATCH:
                    break
            collected[(topic, partition)] = horizon
    if deleted:
        logger.info("gc deleted=%s topics=%s", deleted, ",".join(topics))
    return deleted
