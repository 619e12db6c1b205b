from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH


class ConsumerOffsetManager(models.Manager["ConsumerOffset"]):
    """SQL for ``queue_offsets``: read and advance watermarks, find the GC horizon."""

    def ensure(self, group: str, topic: str, keys: Sequence[str], using: str) -> None:
        """Start a watermark at 0 for partitions that have none yet."""
        if keys:
            connection = connections[using]
            sqlb.insert_missing_partitions(
                connection, "queue_offsets", group, topic, keys,
                {"offset_acked": "0", "updated_at": vendor.now_ms_sql(connection)},
            )

    def watermarks(self, group: str, topic: str, keys: Sequence[str], using: str) -> dict[str, int]:
        result: dict[str, int] = {}
        for batch in sqlb.chunks(list(keys), 500):
            result.update(
                self.using(using)
                .filter(consumer_group=group, topic=topic, partition_key__in=batch)
                .values_list("partition_key", "offset_acked")
            )
        return result

    def advance(self, group: str, topic: str, watermarks: dict[str, int], now_ms: int,
                using: str) -> int:
        """Move watermarks forward (never back), one statement for all partitions."""
        if not watermarks:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        cases = " ".join(["WHEN %s THEN %s"] * len(watermarks))
        new_value = f"CASE {q('partition_key')} {cases} END"
        params: list[object] = [v for item in watermarks.items() for v in item]
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_offsets')} SET {q('offset_acked')} = {new_value}, "
            f"{q('updated_at')} = %s WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} IN ({vendor.placeholders(len(watermarks))}) "
            f"AND {q('offset_acked')} < {new_value}",
            [*params, now_ms, group, topic, *watermarks, *params],
        )

    def gc_horizons(self, topic: str, groups: Sequence[str], using: str) -> dict[str, int]:
        """Per partition, the lowest watermark over ``groups``; partitions some group has
        no watermark for are left out (that group has not consumed them yet)."""
        if not groups:
            return {}
        connection = connections[using]
        q = sqlb.quoter(connection)
        rows = sqlb.fetch_all(
            connection,
            f"SELECT {q('partition_key')}, MIN({q('offset_acked')}), COUNT(*) FROM {q('queue_offsets')} "
            f"WHERE {q('topic')} = %s AND {q('consumer_group')} IN ({vendor.placeholders(len(groups))}) "
            f"GROUP BY {q('partition_key')}",
            [topic, *groups],
        )
        return {r[0]: int(r[1]) for r in rows if int(r[2]) == len(groups) and int(r[1]) > 0}


class ConsumerOffset(models.Model):
    """A consumer group's contiguous-acked watermark for one partition (``queue_offsets``).

    ``offset_acked`` is measured in log *positions* (see ``QueueMessage.position``), the
    commit-ordered sequence consumers read by: every message of the partition whose
    position is at or below it has been acked by the group.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    offset_acked = models.BigIntegerField(default=0)
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
