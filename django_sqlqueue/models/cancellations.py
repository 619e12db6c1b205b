"""``queue_cancellations``: who cancelled which message, for which consumer group, when.

A cancellation itself is the group's delivery row marked acked (see
:mod:`django_sqlqueue.cancelling`); this table is its record, for operators and for
groups that register after a message was cancelled "for all groups" (``consumer_group``
empty), which skip it when they reach it.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH

# consumer_group of the record of a message cancelled for every group, later ones included.
ALL_GROUPS = ""

_COLUMNS = ("topic", "message_offset", "consumer_group", "partition_key", "cancelled_by",
            "cancelled_at")


class CancellationManager(models.Manager["Cancellation"]):
    """SQL for ``queue_cancellations``."""

    def record(self, topic: str, partition: str, offset: int, groups: Sequence[str], by: str,
               using: str) -> None:
        """Record the cancellation for ``groups`` (``ALL_GROUPS`` for every group); a
        record that exists already keeps its first author and time."""
        if not groups:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        prefix, suffix = sqlb.insert_ignore(connection, ("topic", "message_offset",
                                                         "consumer_group"))
        now = vendor.now_ms_sql(connection)
        values = ", ".join([f"(%s, %s, %s, %s, %s, {now})"] * len(groups))
        params: list[object] = []
        for group in groups:
            params += [topic, offset, group, partition, by[:255]]
        sqlb.execute(
            connection,
            f"{prefix} {q('queue_cancellations')} ({', '.join(q(c) for c in _COLUMNS)}) "
            f"VALUES {values}{suffix}",
            params,
        )

    def recorded_for(self, topic: str, offset: int, group: str, using: str) -> bool:
        """Whether the message's cancellation for ``group`` is recorded (in its own name:
        a group registered when it was cancelled for all may have been running it)."""
        return self.using(using).filter(topic=topic, message_offset=offset,
                                        consumer_group=group).exists()

    def of_message(self, topic: str, offset: int, using: str) -> list[Cancellation]:
        return list(self.using(using).filter(topic=topic, message_offset=offset)
                    .order_by("cancelled_at", "consumer_group"))

    def for_new_group(self, group: str, topic: str, partitions: Sequence[str], mark: str,
                      using: str) -> None:
        """Give a group registering for ``partitions`` of ``topic`` an acked delivery row
        (``last_error`` = ``mark``) and a record of its own for each message cancelled
        there for all groups that lies above its watermark, so it skips them (read above
        the read cursor, such a row is honoured). A message the group has a row for
        already (a group that was there when it was cancelled) is left as it is."""
        if not partitions:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        in_partitions = f"c.{q('partition_key')} IN ({sqlb.placeholders(len(partitions))})"
        above_watermark = (
            f"FROM {q('queue_cancellations')} c JOIN {q('queue_messages')} m "
            f"ON m.{q('offset')} = c.{q('message_offset')} JOIN {q('queue_offsets')} o "
            f"ON o.{q('consumer_group')} = %s AND o.{q('topic')} = c.{q('topic')} "
            f"AND o.{q('partition_key')} = c.{q('partition_key')} "
            f"WHERE c.{q('topic')} = %s AND c.{q('consumer_group')} = '' AND {in_partitions} "
            f"AND m.{q('position')} > o.{q('offset_acked')}"
        )
        prefix, suffix = sqlb.insert_ignore(
            connection, ("consumer_group", "topic", "partition_key", "message_offset"))
        columns = ", ".join(q(c) for c in ("consumer_group", "topic", "partition_key",
                                           "message_offset", "acked", "invisible_until",
                                           "retry_count", "last_error"))
        sqlb.execute(
            connection,
            f"{prefix} {q('queue_delivery_state')} ({columns}) "  # noqa: S608 - names quoted, values bound
            f"SELECT %s, c.{q('topic')}, c.{q('partition_key')}, c.{q('message_offset')}, "
            f"{vendor.true_sql(connection)}, 0, -1, %s {above_watermark}{suffix}",
            [group, mark, group, topic, *partitions],
        )
        prefix, suffix = sqlb.insert_ignore(connection, ("topic", "message_offset",
                                                         "consumer_group"))
        sqlb.execute(
            connection,
            f"{prefix} {q('queue_cancellations')} ({', '.join(q(c) for c in _COLUMNS)}) "  # noqa: S608 - names quoted, values bound
            f"SELECT c.{q('topic')}, c.{q('message_offset')}, %s, c.{q('partition_key')}, "
            f"c.{q('cancelled_by')}, c.{q('cancelled_at')} {above_watermark} "
            f"AND EXISTS (SELECT 1 FROM {q('queue_delivery_state')} d "
            f"WHERE d.{q('consumer_group')} = %s AND d.{q('topic')} = c.{q('topic')} "
            f"AND d.{q('partition_key')} = c.{q('partition_key')} "
            f"AND d.{q('message_offset')} = c.{q('message_offset')} "
            f"AND d.{q('acked')} = {vendor.true_sql(connection)} AND d.{q('last_error')} = %s)"
            f"{suffix}",
            [group, group, topic, *partitions, group, mark],
        )

    def prune_collected(self, limit: int, using: str) -> int:
        """Forget records whose message garbage collection has deleted from the log."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        rows = sqlb.fetch_all(
            connection,
            f"SELECT c.{q('topic')}, c.{q('message_offset')} FROM {q('queue_cancellations')} c "  # noqa: S608 - names quoted, values bound
            f"WHERE NOT EXISTS (SELECT 1 FROM {q('queue_messages')} m "
            f"WHERE m.{q('offset')} = c.{q('message_offset')}) LIMIT %s",
            [limit],
        )
        deleted = 0
        for topic, offset in sorted(set(rows)):
            deleted += self.using(using).filter(topic=topic, message_offset=offset).delete()[0]
        return deleted


class Cancellation(models.Model):
    """One message cancelled for one consumer group (or, ``consumer_group`` empty, for
    all of them): never handed to that group's handlers, counted as consumed."""

    pk = models.CompositePrimaryKey("topic", "message_offset", "consumer_group")
    topic = models.CharField(max_length=TOPIC_LENGTH)
    message_offset = models.BigIntegerField()
    # '' (ALL_GROUPS): cancelled for every group, including groups registered later.
    consumer_group = models.CharField(max_length=GROUP_LENGTH, blank=True)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    cancelled_by = models.CharField(max_length=255, blank=True, default="")
    cancelled_at = models.BigIntegerField(default=0)  # epoch ms, database clock

    objects = CancellationManager()

    class Meta:
        db_table = "queue_cancellations"
        verbose_name = "cancellation"
        verbose_name_plural = "cancellations"

    def __str__(self) -> str:
        return f"{self.consumer_group or '*'}:{self.topic}@{self.message_offset}"

    @property
    def for_all_groups(self) -> bool:
        return self.consumer_group == ALL_GROUPS


