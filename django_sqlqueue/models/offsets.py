from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django.db import models

from ..db import sql as sqlb
from ..store import lag
from ..store import offsets as store_offsets
from ..store.connection import django_connection
from ..store.lag import LagFigures
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH
from .partitioned import PartitionRowsManager

__all__ = ["ConsumerOffset", "ConsumerOffsetManager", "LagFigures", "Progress"]


class Progress(NamedTuple):
    """A group's progress through one partition, both in log positions."""

    acked: int  # the watermark: every message at or below it is acked
    fetched: int  # the read cursor: every message at or below it has a delivery row (or is acked)


class ConsumerOffsetManager(PartitionRowsManager):
    """``queue_offsets`` for Django code: the statements of
    :mod:`django_sqlqueue.store.offsets` (watermarks, the GC horizon) and
    :mod:`django_sqlqueue.store.lag` (the backlog behind them) on the alias's connection."""

    def ensure(self, group: str, topic: str, partitions: Sequence[str], using: str) -> None:
        """Start a watermark at 0 for partitions that have none yet."""
        store_offsets.ensure(django_connection(using), group, topic, partitions)

    def progress(self, group: str, topic: str, partitions: Sequence[str],
                 using: str) -> dict[str, Progress]:
        """Each partition's (watermark, read cursor)."""
        result: dict[str, Progress] = {}
        for batch in sqlb.chunks(list(partitions), 500):
            for partition, acked, fetched in (
                self.using(using)
                .filter(consumer_group=group, topic=topic, partition_key__in=batch)
                .values_list("partition_key", "offset_acked", "offset_fetched")
            ):
                result[partition] = Progress(int(acked), max(int(acked), int(fetched)))
        return result

    def save_progress(self, group: str, topic: str, progress: dict[str, Progress], now_ms: int,
                      using: str) -> int:
        """Move watermarks and read cursors forward (never back), one statement for all."""
        return store_offsets.save_progress(django_connection(using), group, topic, progress,
                                           now_ms)

    def gc_horizons(self, topic: str, groups: Sequence[str], using: str) -> dict[str, int]:
        """Per partition, the lowest watermark over ``groups``; partitions some group has
        no watermark for are left out (that group has not consumed them yet)."""
        if not groups:
            return {}
        return store_offsets.gc_horizons(django_connection(using), topic, groups)

    def registered_groups(self, topics: Sequence[str], using: str
                          ) -> dict[str, dict[str, int]]:
        """Per topic, the consumer groups registered for it (they have watermark rows), each
        with the last time one of its watermarks was written (epoch ms): workers create a
        group's rows when they start, before they fetch anything."""
        result: dict[str, dict[str, int]] = {topic: {} for topic in topics}
        rows = (
            self.using(using).filter(topic__in=list(topics))
            .values_list("topic", "consumer_group").annotate(last=models.Max("updated_at"))
        )
        for topic, group, last in rows:
            result[topic][group] = int(last or 0)
        return result

    def lag_figures(self, sample: int, using: str, *, topic: str | None = None,
                    group: str | None = None, now_ms: int | None = None
                    ) -> dict[tuple[str, str], LagFigures]:
        """Per registered (topic, group): its partitions, its lag and when the oldest of
        it became due (:func:`django_sqlqueue.store.lag.lag_figures`)."""
        return lag.lag_figures(django_connection(using), sample, topic=topic, group=group,
                               now_ms=now_ms)

    def unconsumed_counts(self, topic: str, groups: Sequence[str], using: str) -> dict[str, int]:
        """Per group, the topic's messages it has yet to consume
        (:func:`django_sqlqueue.store.lag.unconsumed_counts`)."""
        return lag.unconsumed_counts(django_connection(using), topic, groups)


class ConsumerOffset(models.Model):
    """A consumer group's contiguous-acked watermark for one partition (``queue_offsets``).

    ``offset_acked`` is measured in log *positions* (see ``QueueMessage.position``), the
    commit-ordered sequence consumers read by: every message of the partition whose
    position is at or below it has been acked by the group. ``partition_key`` is the
    partition number (see ``QueueMessage``).
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    offset_acked = models.BigIntegerField(default=0)
    # Beyond the RFC: the read cursor (a position). Every message of the partition at or
    # below it has a delivery row for the group, or is at or below offset_acked, so a
    # worker that takes the partition over reads on from here instead of re-reading the
    # acked messages behind a slow head.
    offset_fetched = models.BigIntegerField(db_default=0)
    updated_at = models.BigIntegerField(default=0)  # epoch ms, database clock

    objects = ConsumerOffsetManager()

    class Meta:
        db_table = "queue_offsets"
        verbose_name = "consumer offset"
        verbose_name_plural = "consumer offsets"
        indexes = [
            models.Index(fields=["consumer_group"], name="queue_offsets_group"),
            models.Index(fields=["topic"], name="queue_offsets_topic"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key} = {self.offset_acked}"
