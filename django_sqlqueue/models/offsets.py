from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH
from .partitioned import PartitionRowsManager


class Progress(NamedTuple):
    """A group's progress through one partition, both in log positions."""

    acked: int  # the watermark: every message at or below it is acked
    fetched: int  # the read cursor: every message at or below it has a delivery row (or is acked)


class LagFigures(NamedTuple):
    """A group's backlog on one topic, summed over its partitions (the overview)."""

    partitions: int  # watermark rows
    lag: int  # messages above the watermarks: exact, or an estimate when ``estimated``
    estimated: bool
    oldest_due: int | None  # epoch ms: the earliest deliver_at of each partition's next message


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

    def lag_figures(self, sample: int, using: str, *, topic: str | None = None,
                    group: str | None = None, now_ms: int | None = None
                    ) -> dict[tuple[str, str], LagFigures]:
        """Per registered (topic, group), optionally only ``topic``/``group``: its
        partitions, the messages above its watermarks and when the oldest of them became
        due, in one query however many groups and topics there are (MariaDB/MySQL: two,
        up to 2,000 watermark rows).

        Per partition the messages are counted exactly up to ``sample``; a partition with
        more is estimated as its first ``sample`` spread over the span up to its newest
        position (positions are shared by every topic and partition, so the span alone
        would overcount). Each figure is a short read of the queue_msg_position index from
        the watermark on, so the cost does not grow with the backlog or the log's age.

        Messages the group has parked below its watermarks (delayed, or backing off before
        a retry) count as lag too, up to ``sample`` per partition, and with ``now_ms`` the
        earliest due time of a parked message due by then counts for ``oldest_due``."""
        connection = connections[using]
        where: dict[str, str] = {}
        if topic is not None:
            where["topic"] = topic
        if group is not None:
            where["consumer_group"] = group
        if vendor.correlated_ranges(connection):
            rows = self._lag_rows_correlated(connection, sample, where)
        else:
            rows = self._lag_rows_by_partition(connection, sample, where, using)
        figures: dict[tuple[str, str], LagFigures] = {}
        for t, g, _, last, counted, lowest, newest, due in rows:
            seen = figures.get((t, g), LagFigures(0, 0, False, None))
            if last is None:
                lag, estimated = int(counted), seen.estimated
            else:
                lowest, last, newest = int(lowest), int(last), int(newest)
                lag = 1 + round((sample - 1) * (newest - lowest) / max(1, last - lowest))
                estimated = True
            oldest = seen.oldest_due
            if due is not None:
                oldest = int(due) if oldest is None else min(oldest, int(due))
            figures[(t, g)] = LagFigures(seen.partitions + 1, seen.lag + lag, estimated, oldest)
        marks = [(t, g, p) for t, g, p, *_ in rows]
        for t, g, parked, due in _parked_figures(connection, marks, sample, now_ms):
            seen = figures.get((t, g), LagFigures(0, 0, False, None))
            oldest = seen.oldest_due
            if due is not None:
                oldest = due if oldest is None else min(oldest, due)
            figures[(t, g)] = seen._replace(lag=seen.lag + parked, oldest_due=oldest,
                                            estimated=seen.estimated or parked >= sample)
        return figures

    def _lag_rows_correlated(self, connection: BaseDatabaseWrapper, sample: int,
                             where: dict[str, str]) -> list[tuple[Any, ...]]:
        """(topic, group, sample-th position above the watermark, messages above it up to
        ``sample``, first position above it, newest position, first one's deliver_at) per
        watermark row: subqueries correlated with the watermark, which PostgreSQL and SQLite
        run as index ranges starting at it."""
        q = sqlb.quoter(connection)
        above = (f"FROM {q('queue_messages')} m WHERE m.{q('topic')} = o.{q('topic')} "
                 f"AND m.{q('partition_key')} = o.{q('partition_key')} "
                 f"AND m.{q('position')} > o.{q('offset_acked')}")
        nth = (f"(SELECT m.{q('position')} {above} ORDER BY m.{q('position')} "
               f"LIMIT 1 OFFSET {int(sample) - 1})")
        conditions = " AND ".join(f"o.{q(column)} = %s" for column in where)
        return sqlb.fetch_all(
            connection,
            f"SELECT o.{q('topic')}, o.{q('consumer_group')}, o.{q('partition_key')}, {nth}, "  # noqa: S608 - names quoted, values bound
            f"(SELECT COUNT(*) {above} AND m.{q('position')} <= COALESCE({nth}, %s)), "
            f"(SELECT MIN(m.{q('position')}) {above}), "
            f"(SELECT MAX(m.{q('position')}) FROM {q('queue_messages')} m "
            f"WHERE m.{q('topic')} = o.{q('topic')} AND m.{q('partition_key')} = o.{q('partition_key')}), "
            f"(SELECT m.{q('deliver_at')} {above} ORDER BY m.{q('position')} LIMIT 1) "
            f"FROM {q('queue_offsets')} o{' WHERE ' + conditions if conditions else ''}",
            [2**62, *where.values()],
        )

    def _lag_rows_by_partition(self, connection: BaseDatabaseWrapper, sample: int,
                               where: dict[str, str], using: str) -> list[tuple[Any, ...]]:
        """The same rows from one branch per watermark, the watermark bound as a value:
        MariaDB/MySQL read a correlated ``position > o.offset_acked`` as an index lookup on
        (topic, partition) filtered row by row, a walk over every message of the partition
        still in the log, where a bound value makes it a range starting at the watermark."""
        marks = list(self.using(using).filter(**where)
                     .values_list("topic", "consumer_group", "partition_key", "offset_acked"))
        q = sqlb.quoter(connection)
        partition = f"FROM {q('queue_messages')} WHERE {q('topic')} = %s AND {q('partition_key')} = %s"
        above = f"{partition} AND {q('position')} > %s"
        in_order = f"ORDER BY {q('position')}"
        # The first ``sample`` positions above the watermark, read once: their count, the
        # first and the last (the sample-th when there are that many).
        branch = (
            f"SELECT %s AS t, %s AS g, %s AS p, CASE WHEN s.n = %s THEN s.hi END AS nth, s.n, s.lo, "  # noqa: S608 - names quoted, values bound
            f"(SELECT MAX({q('position')}) {partition}) AS newest, "
            f"(SELECT {q('deliver_at')} {above} {in_order} LIMIT 1) AS due "
            f"FROM (SELECT COUNT(*) AS n, MIN(p) AS lo, MAX(p) AS hi FROM "
            f"(SELECT {q('position')} AS p {above} {in_order} LIMIT %s) AS x) AS s"
        )
        rows: list[tuple[Any, ...]] = []
        for batch in sqlb.chunks(marks, 2000):  # a statement well under max_allowed_packet
            params: list[object] = []
            for t, g, p, acked in batch:
                params += [t, g, p, sample, t, p, t, p, acked, t, p, acked, sample]
            rows += sqlb.fetch_all(connection, sqlb.union_all([branch] * len(batch)), params)
        return rows

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


def _parked_figures(connection: Any, marks: Sequence[tuple[str, str, str]], cap: int,
                    now_ms: int | None) -> list[tuple[str, str, int, int | None]]:
    """Per (topic, group, partition) of ``marks``: the group's
    unacked parked messages counted up to ``cap``, and with ``now_ms`` the earliest due
    time (at most ``now_ms``) of those waiting for nothing but a worker. Ranges of the
    parked-row index, one query per 400 partitions (SQLite takes 500 terms)."""
    q = sqlb.quoter(connection)
    false = vendor.false_sql(connection)
    mine = (f"FROM {q('queue_delivery_state')} WHERE {q('consumer_group')} = %s "
            f"AND {q('topic')} = %s AND {q('partition_key')} = %s AND {q('acked')} = {false}")
    due = (f"(SELECT MIN({q('invisible_until')}) {mine} AND {q('parked')} = 1 "
           f"AND {q('invisible_until')} <= %s)" if now_ms is not None else "NULL")
    branch = (f"SELECT %s AS t, %s AS g, (SELECT COUNT(*) FROM (SELECT 1 AS one {mine} "  # noqa: S608 - names quoted, values bound
              f"AND {q('parked')} IN (1, 2) LIMIT %s) AS capped) AS n, {due} AS due")
    figures: list[tuple[str, str, int, int | None]] = []
    for batch in sqlb.chunks(marks, 2 * sqlb.MAX_UNION_BRANCHES):
        params: list[object] = []
        for topic, group, partition in batch:
            params += [topic, group, group, topic, partition, cap]
            if now_ms is not None:
                params += [group, topic, partition, now_ms]
        for topic, group, n, first_due in sqlb.fetch_all(
                connection, sqlb.union_all([branch] * len(batch)), params):
            if int(n) or first_due is not None:
                figures.append((topic, group, int(n), None if first_due is None else int(first_due)))
    return figures


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
