from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH
from .partitioned import PartitionRowsManager


class Progress(NamedTuple):
    """A group's progress through one partition, both in log positions."""

    acked: int  # the watermark: every message at or below it is acked
    fetched: int  # the read cursor: every message at or below it has a delivery row (or is acked)


class ConsumerOffsetManager(PartitionRowsManager):
    """SQL for ``queue_offsets``: read and advance watermarks, find the GC horizon."""

    def ensure(self, group: str, topic: str, partitions: Sequence[str], using: str) -> None:
        """Start a watermark at 0 for partitions that have none yet."""
        if partitions:
            connection = connections[using]
            sqlb.insert_missing_partitions(
                connection, "queue_offsets", group, topic, partitions,
                {"offset_acked": "0", "offset_fetched": "0",
                 "updated_at": vendor.now_ms_sql(connection)},
            )

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
        if not progress:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        cases = " ".join(["WHEN %s THEN %s"] * len(progress))
        acked = f"CASE {q('partition_key')} {cases} END"
        fetched = f"CASE {q('partition_key')} {cases} END"
        acked_params: list[object] = [v for p, mark in progress.items() for v in (p, mark.acked)]
        fetched_params: list[object] = [v for p, mark in progress.items() for v in (p, mark.fetched)]
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_offsets')} SET "  # noqa: S608 - names quoted, values bound
            f"{q('offset_acked')} = CASE WHEN {q('offset_acked')} < {acked} THEN {acked} "
            f"ELSE {q('offset_acked')} END, "
            f"{q('offset_fetched')} = CASE WHEN {q('offset_fetched')} < {fetched} THEN {fetched} "
            f"ELSE {q('offset_fetched')} END, "
            f"{q('updated_at')} = %s WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} IN ({sqlb.placeholders(len(progress))})",
            [*acked_params, *acked_params, *fetched_params, *fetched_params, now_ms, group, topic,
             *progress],
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
            f"SELECT {q('partition_key')}, MIN({q('offset_acked')}), COUNT(*) FROM {q('queue_offsets')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('topic')} = %s AND {q('consumer_group')} IN ({sqlb.placeholders(len(groups))}) "
            f"GROUP BY {q('partition_key')}",
            [topic, *groups],
        )
        return {r[0]: int(r[1]) for r in rows if int(r[2]) == len(groups) and int(r[1]) > 0}

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

    def estimated_lag(self, group: str, topic: str, sample: int, using: str) -> tuple[int, bool]:
        """(messages above the group's watermarks, plus the waiting ones it has parked below
        them, whether that is an estimate).

        Per partition they are counted exactly up to ``sample``; a partition with more is
        estimated as its first ``sample`` spread over the span up to its newest position
        (positions are shared by every topic and partition, so the span alone would
        overcount). Reads at most ``sample`` index entries and one index seek per
        partition, two queries per 200 partitions, whatever the lag. Parked messages are
        counted up to ``sample`` per partition too."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        first = (
            f"SELECT %s AS part, COUNT(*) AS n, MIN(p) AS lo, MAX(p) AS hi FROM ("  # noqa: S608 - names quoted, values bound
            f"SELECT {q('position')} AS p FROM {q('queue_messages')} WHERE {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('position')} > %s "
            f"ORDER BY {q('position')} LIMIT %s) AS s"
        )
        head = (
            f"SELECT %s AS part, MAX({q('position')}) AS newest FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('topic')} = %s AND {q('partition_key')} = %s"
        )
        marks = list(self.using(using).filter(consumer_group=group, topic=topic)
                     .values_list("partition_key", "offset_acked"))
        total, estimated = 0, False
        for counted in _parked_counts(connection, group, topic, [p for p, _ in marks], sample):
            total += counted
            estimated = estimated or counted >= sample
        for batch in sqlb.chunks(marks):
            params: list[object] = []
            for partition, watermark in batch:
                params += [partition, topic, partition, watermark, sample]
            full: dict[str, tuple[int, int]] = {}
            for partition, counted, lowest, nth in sqlb.fetch_all(
                    connection, sqlb.union_all([first] * len(batch)), params):
                if int(counted) < sample:
                    total += int(counted)
                else:
                    full[partition] = (int(lowest), int(nth))
            if not full:
                continue
            estimated = True
            params = [v for partition in full for v in (partition, topic, partition)]
            for partition, newest in sqlb.fetch_all(
                    connection, sqlb.union_all([head] * len(full)), params):
                lowest, nth = full[partition]
                total += 1 + round((sample - 1) * (int(newest) - lowest) / max(1, nth - lowest))
        return total, estimated

    def oldest_pending(self, group: str, topic: str, using: str, now_ms: int | None = None
                       ) -> int | None:
        """When the oldest message the group has not consumed became due (epoch ms: the
        earliest ``deliver_at`` of the first message above each watermark, and with
        ``now_ms`` the earliest due time of a parked message due by then), or None when
        every partition is consumed. One index seek per partition, 200 to a query."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        branch = (
            f"SELECT {q('deliver_at')} AS due FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('topic')} = %s AND {q('partition_key')} = %s AND {q('position')} > %s "
            f"ORDER BY {q('position')} LIMIT 1"
        )
        marks = list(self.using(using).filter(consumer_group=group, topic=topic)
                     .values_list("partition_key", "offset_acked"))
        oldest: int | None = None
        for batch in sqlb.chunks(marks):
            params: list[object] = []
            for partition, watermark in batch:
                params += [topic, partition, watermark]
            for (due,) in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(batch)),
                                         params):
                oldest = int(due) if oldest is None else min(oldest, int(due))
        if now_ms is not None:
            for due in _parked_due(connection, group, topic, [p for p, _ in marks], now_ms):
                oldest = due if oldest is None else min(oldest, due)
        return oldest

    def unconsumed_counts(self, topic: str, groups: Sequence[str], using: str) -> dict[str, int]:
        """Per group, how many of the topic's sequenced messages lie above the group's
        watermark of their partition (0 where it has no watermark yet), or wait parked
        below it (delayed, or backing off before a retry)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        sql = (
            f"SELECT COUNT(*) FROM {q('queue_messages')} m LEFT JOIN {q('queue_offsets')} o "  # noqa: S608 - names quoted, values bound
            f"ON o.{q('consumer_group')} = %s AND o.{q('topic')} = m.{q('topic')} "
            f"AND o.{q('partition_key')} = m.{q('partition_key')} "
            f"WHERE m.{q('topic')} = %s AND m.{q('position')} IS NOT NULL "
            f"AND m.{q('position')} > COALESCE(o.{q('offset_acked')}, 0)"
        )
        parked = (
            f"SELECT COUNT(*) FROM {q('queue_delivery_state')} WHERE {q('consumer_group')} = %s "  # noqa: S608 - names quoted, values bound
            f"AND {q('topic')} = %s AND {q('parked')} > 0 "
            f"AND {q('acked')} = {vendor.false_sql(connection)}"
        )
        return {group: int(sqlb.fetch_all(connection, sql, [group, topic])[0][0])
                + int(sqlb.fetch_all(connection, parked, [group, topic])[0][0])
                for group in groups}


def _parked_counts(connection: Any, group: str, topic: str, partitions: Sequence[str],
                   cap: int) -> list[int]:
    """Per partition, the group's unacked parked messages, counted up to ``cap`` (a range
    of the queue_delivery_parked index each)."""
    q = sqlb.quoter(connection)
    false = vendor.false_sql(connection)
    branch = (
        f"SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {q('queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s "
        f"AND {q('parked')} IN (1, 2) AND {q('acked')} = {false} LIMIT %s) AS capped"
    )
    counts: list[int] = []
    for batch in sqlb.chunks(list(partitions)):
        params = [v for partition in batch for v in (group, topic, partition, cap)]
        counts += [int(n) for (n,) in sqlb.fetch_all(
            connection, sqlb.union_all([branch] * len(batch)), params)]
    return counts


def _parked_due(connection: Any, group: str, topic: str, partitions: Sequence[str],
                now_ms: int) -> list[int]:
    """Per partition with one, the earliest due time (at most ``now_ms``) of the group's
    parked messages that wait for nothing but a worker."""
    q = sqlb.quoter(connection)
    branch = (
        f"SELECT {q('invisible_until')} AS due FROM {q('queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s "
        f"AND {q('parked')} = 1 AND {q('acked')} = {vendor.false_sql(connection)} "
        f"AND {q('invisible_until')} <= %s ORDER BY {q('invisible_until')} LIMIT 1"
    )
    dues: list[int] = []
    for batch in sqlb.chunks(list(partitions)):
        params = [v for partition in batch for v in (group, topic, partition, now_ms)]
        dues += [int(due) for (due,) in sqlb.fetch_all(
            connection, sqlb.union_all([branch] * len(batch)), params)]
    return dues


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
