from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, models

from ..db import sql as sqlb
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

# (topic, key, id, payload_json, headers_json, delay_ms)
NewRow = tuple[str, str, str, str, str, int]
StoredRow = tuple[Any, ...]
_NO_BOUND = 2**62  # a position no log will reach


def _insert_sql(connection: Any, rows: int, returning: bool) -> str:
    """The publish INSERT for ``rows`` rows, built once per backend and row count."""
    key = (connection.vendor, connection.alias, rows, returning)
    sql = _INSERT_SQL_CACHE.get(key)
    if sql is None:
        q = lambda name: vendor.quote(connection, name)  # noqa: E731
        now = vendor.now_ms_sql(connection)
        json_param = vendor.json_param_sql(connection)
        row_sql = (
            f"(%s, %s, %s, {json_param}, {json_param}, 0, 0, '', '', 0, '', {now}, {now}, "
            f"{now} + %s)"
        )
        sql = (
            f"INSERT INTO {q('queue_messages')} ({', '.join(q(c) for c in _INSERT_COLUMNS)}) "
            f"VALUES {', '.join([row_sql] * rows)}"
            + vendor.insert_keep_existing_sql(connection, ("topic", "partition_key", "id"), "topic")
        )
        if returning:
            sql += f" RETURNING {', '.join(q(c) for c in STORED_COLUMNS)}"
        if len(_INSERT_SQL_CACHE) < 64:  # a few batch sizes per alias; never unbounded
            _INSERT_SQL_CACHE[key] = sql
    return sql


_INSERT_SQL_CACHE: dict[tuple[str, str, int, bool], str] = {}


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
        returning = vendor.supports_returning(connection)
        sql = _insert_sql(connection, len(rows), returning)
        params: list[Any] = [value for row in rows for value in row]
        with connection.cursor() as cursor:
            if returning:
                cursor.execute(sql, params)
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

    def new_since(
        self, after_position: int, up_to_position: int, topics: Sequence[str], now_ms: int,
        using: str,
    ) -> list[tuple[str, str, int | None]]:
        """Partitions of ``topics`` that got messages with a position in (after, up_to].

        Returns (topic, partition_key, earliest deliver_at still in the future or None).
        Reads only the new rows, through the position index.
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        sql = (
            f"SELECT {q('topic')}, {q('partition_key')}, "
            f"MIN(CASE WHEN {q('deliver_at')} > %s THEN {q('deliver_at')} END) "
            f"FROM {q('queue_messages')} WHERE {q('position')} > %s AND {q('position')} <= %s "
            f"AND {q('topic')} IN ({vendor.placeholders(len(topics))}) "
            f"GROUP BY {q('topic')}, {q('partition_key')}"
        )
        rows = sqlb.fetch_all(connection, sql, [now_ms, after_position, up_to_position, *topics])
        return [(r[0], r[1], None if r[2] is None else int(r[2])) for r in rows]

    def partition_keys(self, topic: str, using: str) -> list[str]:
        """Every partition key that has messages in ``topic``."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return [r[0] for r in sqlb.fetch_all(
            connection,
            f"SELECT DISTINCT {q('partition_key')} FROM {q('queue_messages')} WHERE {q('topic')} = %s",
            [topic],
        )]

    def walk(
        self, group: str, topic: str, ranges: dict[str, tuple[int, int | None]], limit: int,
        using: str,
    ) -> dict[str, list[tuple[int, int, bool]]]:
        """Per partition ``key: (watermark, upper bound or None)``, up to ``limit``
        (position, offset, acked) rows above the watermark, in position order.

        The watermark walk reads the log and the group's delivery state together; a
        message without a delivery row has not been delivered (acked = False).
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        result: dict[str, list[tuple[int, int, bool]]] = {key: [] for key in ranges}
        branch = (
            f"SELECT m.{q('partition_key')} AS pk, m.{q('position')} AS pos, m.{q('offset')} AS off, "
            f"d.{q('acked')} AS acked FROM {q('queue_messages')} m "
            f"LEFT JOIN {q('queue_delivery_state')} d ON d.{q('consumer_group')} = %s "
            f"AND d.{q('topic')} = m.{q('topic')} AND d.{q('partition_key')} = m.{q('partition_key')} "
            f"AND d.{q('message_offset')} = m.{q('offset')} "
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s AND m.{q('position')} > %s "
            f"AND m.{q('position')} <= %s ORDER BY m.{q('position')} LIMIT %s"
        )
        for keys in sqlb.chunks(list(ranges)):
            params: list[Any] = []
            for key in keys:
                low, high = ranges[key]
                params += [group, topic, key, low, _NO_BOUND if high is None else high, limit]
            for pk, pos, off, acked in sqlb.fetch_all(
                connection, sqlb.union_all([branch] * len(keys)), params
            ):
                result[pk].append((int(pos), int(off), bool(acked)))
        for rows in result.values():
            rows.sort()
        return result

    def fetch_deliverable(
        self, group: str, topic: str, windows: dict[str, tuple[int, int]], strict: bool,
        now_ms: int, using: str,
    ) -> list[tuple[Any, ...]]:
        """Messages the group may be handed now, per partition ``key: (watermark, limit)``.

        Concurrent mode: the first ``limit`` messages above the watermark that are not
        acked, are due (``deliver_at``) and are visible (``invisible_until``); nacked and
        delayed messages do not hold back the ones behind them. Strict mode: only the
        partition's first unacked message, and only if it is deliverable, so a partition
        is handled one message at a time in order.

        Rows: (offset, position, partition_key, id, payload, metadata, published_at,
        retry_count or -1 when never delivered, last_error).
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        false = vendor.false_sql(connection)
        due = (
            f"m.{q('deliver_at')} <= %s AND (d.{q('message_offset')} IS NULL "
            f"OR d.{q('invisible_until')} <= %s)"
        )
        columns = (
            f"m.{q('offset')} AS off, m.{q('position')} AS pos, m.{q('partition_key')} AS pk, "
            f"m.{q('id')} AS mid, m.{q('payload')} AS payload, m.{q('metadata')} AS metadata, "
            f"m.{q('published_at')} AS published_at, m.{q('deliver_at')} AS deliver_at, "
            f"COALESCE(d.{q('retry_count')}, -1) AS retries, "
            f"COALESCE(d.{q('invisible_until')}, 0) AS invisible, "
            f"COALESCE(d.{q('last_error')}, '') AS last_error"
        )
        branch = (
            f"SELECT {columns} FROM {q('queue_messages')} m "
            f"LEFT JOIN {q('queue_delivery_state')} d ON d.{q('consumer_group')} = %s "
            f"AND d.{q('topic')} = m.{q('topic')} AND d.{q('partition_key')} = m.{q('partition_key')} "
            f"AND d.{q('message_offset')} = m.{q('offset')} "
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s AND m.{q('position')} > %s "
            f"AND (d.{q('acked')} IS NULL OR d.{q('acked')} = {false}) "
            + ("" if strict else f"AND {due} ")
            + f"ORDER BY m.{q('position')} LIMIT %s"
        )
        rows: list[tuple[Any, ...]] = []
        for keys in sqlb.chunks(list(windows)):
            params: list[Any] = []
            for key in keys:
                watermark, limit = windows[key]
                params += [group, topic, key, watermark]
                if not strict:
                    params += [now_ms, now_ms]
                params.append(1 if strict else limit)
            for row in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(keys)), params):
                (off, pos, pk, mid, payload, metadata, published_at, deliver_at, retries,
                 invisible, last_error) = row
                if strict and (int(deliver_at) > now_ms or int(invisible) > now_ms):
                    continue  # the head is in flight, backing off or delayed: wait for it
                rows.append((int(off), int(pos), pk, mid, payload, metadata, int(published_at),
                             int(retries), last_error))
        rows.sort(key=lambda r: r[1])
        return rows

    def copy_to_dead_letters(
        self, offset: int, dlq_topic: str, group: str, attempts: int, error: str, using: str
    ) -> None:
        """Append the dead-letter copy of message ``offset`` for ``group``; the original stays.

        The copy's id is ``<group>:<offset>``, so each failing group gets its own entry and
        repeating the move after a crash is a no-op.
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        now = vendor.now_ms_sql(connection)
        prefix, suffix = vendor.insert_ignore_sql(connection, ("topic", "partition_key", "id"))
        sql = (
            f"{prefix} {q('queue_messages')} ({', '.join(q(c) for c in _INSERT_COLUMNS)}) "
            f"SELECT %s, {q('partition_key')}, %s, {q('payload')}, {q('metadata')}, {now}, %s, %s, "
            f"{q('topic')}, {q('offset')}, %s, {now}, {q('published_at')}, {now} "
            f"FROM {q('queue_messages')} WHERE {q('offset')} = %s{suffix}"
        )
        sqlb.execute(connection, sql, [dlq_topic, f"{group}:{offset}", attempts, error, group, offset])

    def collectable_offsets(
        self, topic: str, key: str, up_to_position: int, limit: int, using: str
    ) -> list[int]:
        connection = connections[using]
        q = sqlb.quoter(connection)
        return [int(r[0]) for r in sqlb.fetch_all(
            connection,
            f"SELECT {q('offset')} FROM {q('queue_messages')} WHERE {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('position')} <= %s "
            f"ORDER BY {q('position')} LIMIT %s",
            [topic, key, up_to_position, limit],
        )]

    def delete_offsets(self, offsets: Sequence[int], using: str) -> int:
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"DELETE FROM {q('queue_messages')} WHERE {q('offset')} IN "
            f"({vendor.placeholders(len(offsets))})",
            list(offsets),
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
