from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, models

from ..db import vendor
from .fields import GROUP_LENGTH, ID_LENGTH, KEY_LENGTH, TOPIC_LENGTH

# Columns written by publish, in the order of NewRow below.
_INSERT_COLUMNS = (
    "topic", "partition_key", "id", "payload", "metadata",
    "failed_at", "failure_count", "last_error", "original_topic", "original_offset",
    "consumer_group", "created_at", "published_at", "deliver_at",
)
# Columns read back into a StoredRow, in order.
STORED_COLUMNS = ("offset", "topic", "partition_key", "id", "payload", "metadata",
                  "published_at", "deliver_at")

# (topic, key, id, payload_json, metadata_json, delay_ms, dlq fields or None)
NewRow = tuple[str, str, str, str, str, int]
StoredRow = tuple[Any, ...]


class QueueMessageManager(models.Manager["QueueMessage"]):
    """SQL for ``queue_messages``: append, sequence, read by position, garbage-collect."""

    def insert_rows(self, rows: Sequence[NewRow], using: str) -> dict[tuple[str, str, str], StoredRow]:
        """Append rows in one multi-row INSERT; duplicates of (topic, key, id) keep the stored row.

        ``rows`` must not repeat a (topic, key, id). Returns the stored rows (STORED_COLUMNS)
        by (topic, key, id), whether new or already there.
        Times come from the database clock, so a publisher's wrong clock cannot make a
        delayed message due early.
        """
        connection = connections[using]
        q = lambda name: vendor.quote(connection, name)  # noqa: E731
        now = vendor.now_ms_sql(connection)
        json_param = vendor.json_param_sql(connection)
        row_sql = (
            f"(%s, %s, %s, {json_param}, {json_param}, 0, 0, '', '', 0, '', {now}, {now}, "
            f"{now} + %s)"
        )
        sql = (
            f"INSERT INTO {q('queue_messages')} ({', '.join(q(c) for c in _INSERT_COLUMNS)}) "
            f"VALUES {', '.join([row_sql] * len(rows))}"
            + vendor.insert_keep_existing_sql(connection, ("topic", "partition_key", "id"), "topic")
        )
        params: list[Any] = [value for row in rows for value in row]
        returning = ", ".join(q(c) for c in STORED_COLUMNS)
        with connection.cursor() as cursor:
            if vendor.supports_returning(connection):
                cursor.execute(f"{sql} RETURNING {returning}", params)
                stored = {(r[1], r[2], r[3]): r for r in cursor.fetchall()}
                if len(stored) == len(rows):
                    return stored
            else:
                cursor.execute(sql, params)
            # No RETURNING (Oracle MySQL), or a backend that returned fewer rows: read back
            # with a locking read, which sees rows a concurrent publisher committed after
            # this transaction's snapshot was taken.
            return self._read_back(connection, rows)

    def unsequenced_offsets(self, limit: int, using: str) -> list[int]:
        """Offsets of committed rows without a position, oldest first, locked for sequencing.

        Rows of transactions still in flight are invisible (PostgreSQL) or row-locked
        (InnoDB, skipped by SKIP LOCKED), so they get a later position once they commit.
        """
        connection = connections[using]
        q = lambda name: vendor.quote(connection, name)  # noqa: E731
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {q('offset')} FROM {q('queue_messages')} WHERE {q('position')} IS NULL "
                f"ORDER BY {q('offset')} LIMIT %s" + vendor.skip_locked_sql(connection),
                [limit],
            )
            return [int(row[0]) for row in cursor.fetchall()]

    def assign_positions(self, offsets: Sequence[int], first_position: int, using: str) -> None:
        """Give ``offsets`` (in order) the consecutive positions from ``first_position``."""
        connection = connections[using]
        q = lambda name: vendor.quote(connection, name)  # noqa: E731
        cases = " ".join(["WHEN %s THEN %s"] * len(offsets))
        params: list[int] = []
        for index, offset in enumerate(offsets):
            params += [offset, first_position + index]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {q('queue_messages')} SET {q('position')} = CASE {q('offset')} {cases} "
                f"END WHERE {q('offset')} IN ({vendor.placeholders(len(offsets))})",
                params + list(offsets),
            )

    def _read_back(
        self, connection: Any, rows: Sequence[NewRow]
    ) -> dict[tuple[str, str, str], StoredRow]:
        q = lambda name: vendor.quote(connection, name)  # noqa: E731
        keys = [(row[0], row[1], row[2]) for row in rows]
        sql = (
            f"SELECT {', '.join(q(c) for c in STORED_COLUMNS)} FROM {q('queue_messages')} "
            f"WHERE ({q('topic')}, {q('partition_key')}, {q('id')}) IN "
            f"({vendor.row_values(len(keys), 3)})" + vendor.for_share_sql(connection)
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [v for key in keys for v in key])
            return {(r[1], r[2], r[3]): r for r in cursor.fetchall()}


class QueueMessage(models.Model):
    """The immutable message log (the RFC's ``queue_messages``), shared by all consumer groups.

    Beyond the RFC:

    * ``position`` is the order consumers read in. ``offset`` is allocated at INSERT, but a
      publisher's transaction may commit after later offsets were read and acked (the
      commit-order gap); positions are assigned by the sequencer only to committed rows,
      in commit order. NULL means "committed recently, not yet sequenced".
    * ``deliver_at`` (epoch ms, database clock) is when a delayed message becomes due;
      immutable, set at publish.
    * ``consumer_group`` and ``original_offset`` are set on dead-letter copies only: which
      group gave up on the message, and which log entry it copies. Each group's failure
      makes its own copy, so one group's DLQ never hides the message from another group.
    """

    offset = models.BigAutoField(primary_key=True, db_column="offset")
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True, default="")
    message_id = models.CharField(max_length=ID_LENGTH, db_column="id")
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    metadata = models.JSONField(default=dict, blank=True)
    # Dead-letter fields: zero/empty for normal messages.
    failed_at = models.BigIntegerField(default=0)
    failure_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    original_topic = models.CharField(max_length=TOPIC_LENGTH, blank=True, default="")
    original_offset = models.BigIntegerField(default=0)
    consumer_group = models.CharField(max_length=GROUP_LENGTH, blank=True, default="")
    created_at = models.BigIntegerField()  # epoch ms, database clock
    published_at = models.BigIntegerField()  # epoch ms; a DLQ copy keeps the original's
    deliver_at = models.BigIntegerField()  # epoch ms; not delivered before this
    position = models.BigIntegerField(null=True, blank=True)

    objects = QueueMessageManager()

    class Meta:
        db_table = "queue_messages"
        verbose_name = "message"
        verbose_name_plural = "messages"
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "partition_key", "message_id"], name="queue_msg_idempotency"
            ),
        ]
        indexes = [
            models.Index(fields=["topic", "partition_key", "offset"], name="queue_msg_partition"),
            # Consumers read a partition in position order above their watermark.
            models.Index(fields=["topic", "partition_key", "position"], name="queue_msg_position"),
            # The sequencer finds unsequenced rows (position IS NULL) in offset order
            # without sorting the backlog.
            models.Index(fields=["position", "offset"], name="queue_msg_sequencing"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition_key}@{self.offset}"
