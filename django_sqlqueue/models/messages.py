from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, models

from ..db import sql as sqlb
from ..db import vendor
from ..db.errors import check_refusal
from ..encoding import NewRow
from ..exceptions import InvalidMessage
from ..replays import GROUP_HEADER
from .fields import GROUP_LENGTH, ID_LENGTH, KEY_LENGTH, TOPIC_LENGTH, storable_error


class MessageRow(NamedTuple):
    """A message as read from the log (``position`` is None until it is sequenced)."""

    offset: int
    position: int | None
    topic: str
    key: str
    id: str
    payload: Any  # JSON text or decoded, as the backend returns it
    metadata: Any
    published_at: int
    deliver_at: int


class PartitionProgress(NamedTuple):
    """What the log holds for one partition, seen from one watermark."""

    newest: int | None  # the highest position in the partition
    lag: int  # messages positioned above the watermark (counted up to a cap)
    oldest_pending: int | None  # published_at (epoch ms) of the first of them


# The columns of a MessageRow, in order; ``id`` and ``message_key`` keep their SQL names.
MESSAGE_COLUMNS = ("offset", "position", "topic", "message_key", "id", "payload", "metadata",
                   "published_at", "deliver_at")
# Columns written by publish and by dead-lettering.
_INSERT_COLUMNS = (
    "topic", "message_key", "partition_key", "id", "payload", "metadata",
    "failed_at", "failure_count", "last_error", "original_topic", "original_offset",
    "consumer_group", "created_at", "published_at", "deliver_at",
)
IDEMPOTENCY_COLUMNS = ("topic", "message_key", "id")
_MYSQL_DUPLICATE_KEY = 1062  # the warning INSERT IGNORE gives for a skipped duplicate
_DEAD_LETTER_COLUMNS = (*_INSERT_COLUMNS, "original_id")


class DeadLetterSource(NamedTuple):
    """The message being dead-lettered, as its worker delivered it."""

    offset: int
    topic: str
    key: str
    id: str
    payload_json: str
    headers_json: str
    published_at_ms: int


def _without_replay_group(headers_json: str) -> str:
    headers = json.loads(headers_json)
    if isinstance(headers, dict) and GROUP_HEADER in headers:
        del headers[GROUP_HEADER]
        return json.dumps(headers)
    return headers_json


def message_row(values: Sequence[Any]) -> MessageRow:
    offset, position, topic, key, message_id, payload, metadata, published_at, deliver_at = values
    return MessageRow(int(offset), None if position is None else int(position), topic, key,
                      message_id, payload, metadata, int(published_at), int(deliver_at))


def select_columns(connection: Any, alias: str = "") -> str:
    q = sqlb.quoter(connection)
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + q(c) for c in MESSAGE_COLUMNS)


def _insert_sql(connection: Any, rows: int, returning: bool, unless_stored: bool = False) -> str:
    """The publish INSERT for ``rows`` rows, built once per backend and shape.

    ``unless_stored`` (one row): an ``INSERT … SELECT`` whose SELECT finds no row with the
    row's (topic, key, id) first; its parameters are the row's, then those three again.
    """
    key = (connection.vendor, connection.alias, rows, returning, unless_stored)
    sql = _INSERT_SQL_CACHE.get(key)
    if sql is None:
        q = sqlb.quoter(connection)
        now = vendor.now_ms_sql(connection)
        json_param = vendor.json_param_sql(connection)
        # partition_key stays '' until the sequencer gives the message its position and,
        # with the topic's recorded partition count, its partition.
        row_sql = (
            f"%s, %s, '', %s, {json_param}, {json_param}, 0, 0, '', '', 0, '', {now}, {now}, "
            f"{now} + %s"
        )
        if unless_stored:
            stored = " AND ".join(f"{q(column)} = %s" for column in IDEMPOTENCY_COLUMNS)
            values = (f"SELECT {row_sql} FROM DUAL WHERE NOT EXISTS "  # noqa: S608 - names quoted, values bound
                      f"(SELECT 1 FROM {q('queue_messages')} WHERE {stored})")
        else:
            values = "VALUES " + ", ".join([f"({row_sql})"] * rows)
        # A duplicate (topic, key, id) is skipped, not updated: an upsert's no-op UPDATE
        # would lock the stored row (and on PostgreSQL write a new version of it), and the
        # sequencer, which skips locked rows, would then position later messages of its
        # key first. Skipped rows are not returned; insert_rows reads them back. On MySQL
        # this is INSERT IGNORE, which also turns data errors into warnings: publishing
        # validates every value first, and insert_rows refuses a row the server dropped.
        prefix, suffix = sqlb.insert_ignore(connection, IDEMPOTENCY_COLUMNS)
        sql = (
            f"{prefix} {q('queue_messages')} ({', '.join(q(c) for c in _INSERT_COLUMNS)}) "
            f"{values}{suffix}"
        )
        if returning:
            sql += f" RETURNING {select_columns(connection)}"
        if len(_INSERT_SQL_CACHE) < 64:  # a few batch sizes per alias; never unbounded
            _INSERT_SQL_CACHE[key] = sql
    return sql


_INSERT_SQL_CACHE: dict[tuple[str, str, int, bool, bool], str] = {}


class QueueMessageManager(models.Manager["QueueMessage"]):
    """SQL for ``queue_messages``: append, sequence, read by position, garbage-collect.

    Reads that join the group's delivery state live with that table
    (:class:`django_sqlqueue.models.delivery.DeliveryStateManager`).
    """

    def insert_rows(self, rows: Sequence[NewRow], using: str) -> dict[tuple[str, str, str], MessageRow]:
        """Append rows in one multi-row INSERT; a (topic, key, id) already stored keeps its row.

        ``rows`` must not repeat a (topic, key, id). Returns the stored rows by
        (topic, key, id), whether new or already there. A duplicate is neither locked nor
        rewritten when the stored row committed before this transaction's snapshot (see
        docs/data-model.md, "Publishing the same id again"). Times come from the database
        clock, so a publisher's wrong clock cannot make a delayed message due early.
        """
        connection = connections[using]
        stored: dict[tuple[str, str, str], MessageRow] = {}
        unless_stored = False
        if vendor.duplicate_check_locks(connection):
            # InnoDB's duplicate-key check share-locks the stored row's unique-index entry
            # until this transaction ends, which would hold up GC deleting that row. So rows
            # that may be stored already (published with an id) are looked for first with a
            # plain read: for one row in the INSERT itself where its SELECT reads without
            # locks (one round trip, as publish() has), else by a SELECT before it.
            if len(rows) == 1 and rows[0].id_given and vendor.insert_select_reads_unlocked(connection):
                unless_stored = True
            else:
                stored = self._read_back(connection, [row for row in rows if row.id_given])
                if stored:
                    rows = [row for row in rows if (row.topic, row.key, row.id) not in stored]
                    if not rows:
                        return stored
        returning = vendor.supports_returning(connection)
        params = [value for row in rows for value in row[:6]]
        if unless_stored:
            params += [rows[0].topic, rows[0].key, rows[0].id]
        with connection.cursor() as cursor:
            try:
                cursor.execute(_insert_sql(connection, len(rows), returning, unless_stored), params)
            except IntegrityError as exc:
                # The JSON check of MariaDB or SQLite refused a payload nested too deeply
                # (a one-row INSERT IGNORE still fails a CHECK constraint). Both undo just
                # the statement, so the caller's transaction goes on.
                reason = check_refusal(connection, exc)
                if reason is not None:
                    raise InvalidMessage(f"the database refused the message: {reason}") from exc
                raise
            if returning:
                inserted = {(r.topic, r.key, r.id): r for r in map(message_row, cursor.fetchall())}
                stored.update(inserted)
                written = len(inserted)
            else:
                written = cursor.rowcount
            if written < len(rows):
                _refuse_dropped_rows(connection, cursor)
        if returning and written == len(rows):
            return stored
        # Rows skipped as duplicates, or not returned (Oracle MySQL has no RETURNING). The
        # stored rows committed before this statement ran (it waited for any that were in
        # flight), so a plain read sees them.
        missing = [row for row in rows if (row.topic, row.key, row.id) not in stored]
        stored.update(self._read_back(connection, missing))
        missing = [row for row in missing if (row.topic, row.key, row.id) not in stored]
        if missing:
            # Unless this transaction reads a snapshot older than their commit (REPEATABLE
            # READ on MySQL). A locking read would see them, but it would share-lock them,
            # and the sequencer passes over locked rows: the key's later messages would be
            # positioned first. A connection of its own sees them and locks nothing.
            stored.update(self._read_back_latest(using, missing))
        return stored

    # ----------------------------------------------------------------- sequencing

    def unsequenced_count(self, cap: int, using: str) -> int:
        """Committed messages still waiting for a position, counted up to ``cap`` (the
        queue_msg_sequencing index): a backlog here means no worker is sequencing."""
        return int(self.using(using).filter(position__isnull=True)[:cap].count())

    def unsequenced_by_topic(self, cap: int, using: str) -> dict[str, tuple[int, int]]:
        """Committed messages still waiting for a position, per topic: (count, oldest
        published_at), from the first ``cap`` in the sequencer's order (the
        queue_msg_sequencing index), so the cost is bounded however large the backlog."""
        waiting: dict[str, tuple[int, int]] = {}
        rows = (self.using(using).filter(position__isnull=True).order_by("offset")
                .values_list("topic", "published_at")[:cap])
        for topic, published_at in rows:
            count, oldest = waiting.get(topic, (0, int(published_at)))
            waiting[topic] = (count + 1, min(oldest, int(published_at)))
        return waiting

    # ----------------------------------------------------------------- reading

    def partition_heads(
        self, after_position: int, up_to_position: int, topics: Sequence[str], using: str,
    ) -> list[tuple[str, str, int]]:
        """(topic, partition, highest position) of the partitions of ``topics`` that got
        messages with a position in (after, up_to]. Reads only the new rows."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        rows = sqlb.fetch_all(
            connection,
            f"SELECT {q('topic')}, {q('partition_key')}, MAX({q('position')}) "  # noqa: S608 - names quoted, values bound
            f"FROM {q('queue_messages')} WHERE {q('position')} > %s AND {q('position')} <= %s "
            f"AND {q('topic')} IN ({sqlb.placeholders(len(topics))}) "
            f"GROUP BY {q('topic')}, {q('partition_key')}",
            [after_position, up_to_position, *topics],
        )
        return [(r[0], r[1], int(r[2])) for r in rows]

    def by_offsets(self, offsets: Sequence[int], using: str) -> dict[int, MessageRow]:
        """Messages by offset (a redelivery needs its payload again)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        result: dict[int, MessageRow] = {}
        for batch in sqlb.chunks(list(offsets), 500):
            for values in sqlb.fetch_all(
                connection,
                f"SELECT {select_columns(connection)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
                f"WHERE {q('offset')} IN ({sqlb.placeholders(len(batch))})",
                list(batch),
            ):
                row = message_row(values)
                result[row.offset] = row
        return result

    def waiting_task(self, topics: Sequence[str], message_id: str, using: str | None = None
                     ) -> MessageRow | None:
        """The keyless message ``message_id`` of one of ``topics`` (a task no worker has
        started; ``get_result`` reads it), found through the idempotency index."""
        if not topics:
            return None
        connection = connections[using or self.db]
        q = sqlb.quoter(connection)
        rows = sqlb.fetch_all(
            connection,
            f"SELECT {select_columns(connection)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('topic')} IN ({sqlb.placeholders(len(topics))}) "
            f"AND {q('message_key')} = '' AND {q('id')} = %s",
            [*topics, message_id],
        )
        return message_row(rows[0]) if rows else None

    def offsets_between(self, topic: str, ranges: dict[str, tuple[int, int]],
                        using: str) -> list[tuple[str, int]]:
        """(partition, offset) of the messages positioned in (low, high] of each partition's
        ``(low, high)``: the ones a watermark just passed. One range read per partition."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        result: list[tuple[str, int]] = []
        for partitions in sqlb.chunks(list(ranges)):
            terms = " OR ".join(
                [f"({q('partition_key')} = %s AND {q('position')} > %s AND {q('position')} <= %s)"]
                * len(partitions)
            )
            params: list[Any] = [topic]
            for partition in partitions:
                params += [partition, *ranges[partition]]
            result += [(r[0], int(r[1])) for r in sqlb.fetch_all(
                connection,
                f"SELECT {q('partition_key')}, {q('offset')} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
                f"WHERE {q('topic')} = %s AND ({terms})",
                params,
            )]
        return result

    def partition_progress(self, partitions: Sequence[tuple[str, str, int]], cap: int,
                           using: str) -> dict[tuple[str, str, int], PartitionProgress]:
        """For each (topic, partition, watermark): the newest position, the messages above
        the watermark (counted up to ``cap``) and when the oldest of them was published.
        Each is a short read of the queue_msg_position index; one query per 200 partitions."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        in_partition = f"{q('topic')} = %s AND {q('partition_key')} = %s"
        branch = (
            f"SELECT %s AS t, %s AS p, %s AS w, "  # noqa: S608 - names quoted, values bound
            f"(SELECT MAX({q('position')}) FROM {q('queue_messages')} WHERE {in_partition}) AS newest, "
            f"(SELECT COUNT(*) FROM (SELECT 1 AS one FROM {q('queue_messages')} WHERE {in_partition} "
            f"AND {q('position')} > %s LIMIT %s) AS capped) AS lag, "
            f"(SELECT {q('published_at')} FROM {q('queue_messages')} WHERE {in_partition} "
            f"AND {q('position')} > %s ORDER BY {q('position')} LIMIT 1) AS oldest"
        )
        result: dict[tuple[str, str, int], PartitionProgress] = {}
        for batch in sqlb.chunks(list(partitions)):
            params: list[Any] = []
            for topic, partition, watermark in batch:
                params += [topic, partition, watermark, topic, partition, topic, partition,
                           watermark, cap,
                           topic, partition, watermark]
            for topic, partition, watermark, newest, lag, oldest in sqlb.fetch_all(
                    connection, sqlb.union_all([branch] * len(batch)), params):
                result[(topic, partition, int(watermark))] = PartitionProgress(
                    None if newest is None else int(newest), int(lag or 0),
                    None if oldest is None else int(oldest))
        return result

    # ----------------------------------------------------------------- dead letters

    def copy_to_dead_letters(self, original: DeadLetterSource, dlq_topic: str, group: str,
                             attempts: int, error: str, using: str) -> int:
        """Append the dead-letter copy of message ``original`` for ``group``; the original
        stays. Returns the rows inserted (0: the copy was already there).

        The copy keeps the original's key (so the dead-letter topic keeps per-key order) and
        its id in ``original_id``; its own id is ``<group>:<offset>``, so each failing group
        gets its own entry and repeating the move after a crash is a no-op. It is copied
        from the log row; should GC have collected that row meanwhile (a group that
        registered while GC ran), it is written from the values the worker delivered, so a
        dead letter never goes missing.
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        now = vendor.now_ms_sql(connection)
        copy_id = f"{group}:{original.offset}"
        columns = ", ".join(q(c) for c in _DEAD_LETTER_COLUMNS)
        prefix, suffix = sqlb.insert_ignore(connection, IDEMPOTENCY_COLUMNS)
        # The copy of a replay that failed again is a plain message of the dead-letter
        # topic: without the replay's group header, which would make every other group
        # consuming that topic pass over it. Its original_id is the id the handler saw
        # (the first original's, not "replay:..."), so replaying it again keeps that id.
        headers = vendor.json_without_sql(connection, q("metadata"), GROUP_HEADER)
        inserted = sqlb.execute(
            connection,
            f"{prefix} {q('queue_messages')} ({columns}) "  # noqa: S608 - names quoted, values bound
            f"SELECT %s, {q('message_key')}, '', %s, {q('payload')}, {headers}, {now}, %s, "
            f"%s, {q('topic')}, {q('offset')}, %s, {now}, {q('published_at')}, {now}, %s "
            f"FROM {q('queue_messages')} WHERE {q('offset')} = %s{suffix}",
            [dlq_topic, copy_id, attempts, storable_error(error), group, original.id,
             original.offset],
        )
        if inserted or self.using(using).filter(
                topic=dlq_topic, message_key=original.key, message_id=copy_id).exists():
            return inserted
        json_param = vendor.json_param_sql(connection)
        return sqlb.execute(
            connection,
            f"{prefix} {q('queue_messages')} ({columns}) VALUES (%s, %s, '', %s, {json_param}, "
            f"{json_param}, {now}, %s, %s, %s, %s, %s, {now}, %s, {now}, %s){suffix}",
            [dlq_topic, original.key, copy_id, original.payload_json,
             _without_replay_group(original.headers_json),
             attempts, storable_error(error), original.topic, original.offset, group,
             original.published_at_ms, original.id],
        )

    def dead_letter_details(self, offsets: Sequence[int], using: str
                            ) -> dict[int, tuple[str, str, int, str, str, int]]:
        """Per offset of a dead-letter copy: (group, original topic, original offset,
        original id, last error, failure count)."""
        result: dict[int, tuple[str, str, int, str, str, int]] = {}
        for batch in sqlb.chunks(list(offsets), 500):
            rows = self.using(using).filter(offset__in=batch).values_list(
                "offset", "consumer_group", "original_topic", "original_offset", "original_id",
                "last_error", "failure_count")
            for offset, group, topic, original_offset, original_id, error, count in rows:
                result[int(offset)] = (group, topic, int(original_offset), original_id,
                                       error, int(count))
        return result

    # ----------------------------------------------------------------- garbage collection

    def collectable_offsets(
        self, topic: str, partition: str, after_position: int, up_to_position: int, limit: int,
        groups: Sequence[str], using: str,
    ) -> list[tuple[int, int]]:
        """(offset, position) of up to ``limit`` messages of the partition positioned in
        (after, up_to], lowest first, that none of ``groups`` has parked and not yet acked
        (a waiting message the watermark passed: see models.waiting)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        waiting, waiting_params = _still_waiting_sql(connection, "m", groups)
        return [(int(r[0]), int(r[1])) for r in sqlb.fetch_all(
            connection,
            f"SELECT m.{q('offset')}, m.{q('position')} FROM {q('queue_messages')} m "  # noqa: S608 - names quoted, values bound
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s "
            f"AND m.{q('position')} > %s AND m.{q('position')} <= %s{waiting} "
            f"ORDER BY m.{q('position')} LIMIT %s",
            [topic, partition, after_position, up_to_position, *waiting_params, limit],
        )]

    def collectable_among(self, topic: str, offsets: Sequence[int], up_to_position: int,
                          groups: Sequence[str], using: str) -> list[int]:
        """Which of ``offsets`` (messages of one partition that were parked) are positioned
        at or below ``up_to_position`` and no longer waiting for any of ``groups``."""
        if not offsets:
            return []
        connection = connections[using]
        q = sqlb.quoter(connection)
        waiting, waiting_params = _still_waiting_sql(connection, "m", groups)
        return [int(r[0]) for r in sqlb.fetch_all(
            connection,
            f"SELECT m.{q('offset')} FROM {q('queue_messages')} m "  # noqa: S608 - names quoted, values bound
            f"WHERE m.{q('offset')} IN ({sqlb.placeholders(len(offsets))}) AND m.{q('topic')} = %s "
            f"AND m.{q('position')} <= %s{waiting}",
            [*offsets, topic, up_to_position, *waiting_params],
        )]

    def delete_offsets(self, offsets: Sequence[int], using: str) -> int:
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"{sqlb.delete_from(connection, 'queue_messages')} WHERE {q('offset')} IN "
            f"({sqlb.placeholders(len(offsets))})",
            list(offsets),
        )

    # ----------------------------------------------------------------- repartitioning

    def sequenced_count(self, topic: str, using: str) -> int:
        return self.using(using).filter(topic=topic, position__isnull=False).count()

    def sequenced_offsets(self, topic: str, after: int, limit: int, using: str,
                          up_to: int | None = None) -> list[int]:
        """Offsets above ``after`` of up to ``limit`` of the topic's sequenced messages
        (positioned at ``up_to`` or below, if given), lowest first.

        Lowest first, so a transaction deleting batch after batch always holds a prefix of
        the topic's rows: a concurrent GC batch (which locks by offset too) waits for it
        instead of holding rows it needs next. ``after`` pages on by offset, which ends even
        where a snapshot still shows rows that GC has deleted meanwhile.
        """
        found = self.using(using).filter(topic=topic, position__isnull=False, offset__gt=after)
        if up_to is not None:
            found = found.filter(position__lte=up_to)
        return [int(offset) for offset in found.order_by("offset")
                .values_list("offset", flat=True)[:limit]]

    def _read_back(
        self, connection: Any, rows: Sequence[NewRow]
    ) -> dict[tuple[str, str, str], MessageRow]:
        """The stored rows with the (topic, key, id) of ``rows``, by those; a plain read."""
        if not rows:
            return {}
        q = sqlb.quoter(connection)
        keys = [(row.topic, row.key, row.id) for row in rows]
        sql = (
            f"SELECT {select_columns(connection)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE ({', '.join(q(c) for c in IDEMPOTENCY_COLUMNS)}) IN "
            f"({sqlb.row_values(len(keys), 3)})"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [v for key in keys for v in key])
            return {(r.topic, r.key, r.id): r for r in map(message_row, cursor.fetchall())}

    def _read_back_latest(
        self, using: str, rows: Sequence[NewRow]
    ) -> dict[tuple[str, str, str], MessageRow]:
        """:meth:`_read_back` on a new connection in autocommit, which sees the latest
        committed rows whatever the snapshot of this thread's transaction."""
        connection = connections.create_connection(using)
        try:
            return self._read_back(connection, rows)
        finally:
            connection.close()


def _still_waiting_sql(connection: Any, alias: str, groups: Sequence[str]) -> tuple[str, list[Any]]:
    """`` AND NOT EXISTS (...)``: the message (``alias``) is not parked and unacked by any of
    ``groups``; one primary-key probe per group."""
    if not groups:
        return "", []
    q = sqlb.quoter(connection)
    return (
        f" AND NOT EXISTS (SELECT 1 FROM {q('queue_delivery_state')} d "  # noqa: S608 - names quoted, values bound
        f"WHERE d.{q('consumer_group')} IN ({sqlb.placeholders(len(groups))}) "
        f"AND d.{q('topic')} = {alias}.{q('topic')} "
        f"AND d.{q('partition_key')} = {alias}.{q('partition_key')} "
        f"AND d.{q('message_offset')} = {alias}.{q('offset')} AND d.{q('parked')} > 0 "
        f"AND d.{q('acked')} = {vendor.false_sql(connection)})",
        list(groups),
    )


def _refuse_dropped_rows(connection: Any, cursor: Any) -> None:
    """Raise InvalidMessage if MySQL's INSERT IGNORE dropped a row for an error.

    Duplicates are skipped with warning 1062 and read back. Any other warning means a row
    the server refused (a payload nested deeper than MariaDB's JSON check allows, say) was
    skipped instead of raising: publishing must not lose it silently.
    """
    if connection.vendor != "mysql" or not connection.connection.warning_count():
        return  # the count comes with the INSERT's reply: no round trip
    cursor.execute("SHOW WARNINGS")
    reasons = [message for _level, code, message in cursor.fetchall()
               if int(code) != _MYSQL_DUPLICATE_KEY]
    if reasons:
        raise InvalidMessage(f"the database refused the message: {'; '.join(reasons)}")


class QueueMessage(models.Model):
    """The immutable message log (the RFC's ``queue_messages``), shared by all consumer groups.

    Beyond the RFC:

    * ``message_key`` is the key as published: the unit of ordering and, with ``id``, of
      idempotency. ``partition_key`` holds the message's *partition* (its number, as text),
      the unit of leasing: many keys share a partition, as in Kafka. It is set by the
      sequencer, with the topic's recorded partition count ('' until then).
    * ``position`` is the order consumers read in. ``offset`` is allocated at INSERT, but a
      publisher's transaction may commit after later offsets were read and acked (the
      commit-order gap); positions are assigned by the sequencer only to committed rows:
      in commit order across sequencing batches, in offset order within one (see
      docs/data-model.md). NULL means "committed recently, not yet sequenced".
    * ``deliver_at`` (epoch ms, database clock) is when a delayed message becomes due;
      immutable, set at publish.
    * ``consumer_group`` and ``original_offset`` are set on dead-letter copies only: which
      group gave up on the message, and which log entry it copies. Each group's failure
      makes its own copy, so one group's DLQ never hides the message from another group.
    """

    offset = models.BigAutoField(primary_key=True, db_column="offset")
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True, default="")
    message_key = models.CharField(max_length=KEY_LENGTH, blank=True, db_default="")
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
    # Dead-letter copies: the id the original was published with (the copy's own id is
    # "<group>:<original offset>", unique per failing group).
    original_id = models.CharField(max_length=ID_LENGTH, blank=True, db_default="")

    objects = QueueMessageManager()

    class Meta:
        db_table = "queue_messages"
        verbose_name = "message"
        verbose_name_plural = "messages"
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "message_key", "message_id"], name="queue_msg_key_idempotency"
            ),
        ]
        indexes = [
            models.Index(fields=["topic", "partition_key", "offset"], name="queue_msg_partition"),
            # Consumers read a partition in position order above their read cursor.
            models.Index(fields=["topic", "partition_key", "position"], name="queue_msg_position"),
            # The sequencer finds unsequenced rows (position IS NULL) in offset order
            # without sorting the backlog.
            models.Index(fields=["position", "offset"], name="queue_msg_sequencing"),
            # The admin's dead letters, newest first: every published message has
            # failed_at = 0, so "failed_at > 0" is a range over the dead-letter copies alone,
            # all of them or those of one original topic or one consumer group.
            models.Index(fields=["failed_at", "offset"], name="queue_msg_dead_letters"),
            models.Index(fields=["original_topic", "failed_at", "offset"],
                         name="queue_msg_dl_topic"),
            models.Index(fields=["consumer_group", "failed_at", "offset"],
                         name="queue_msg_dl_group"),
        ]
        permissions = [
            ("deliver_message", "Can make a waiting message deliverable now"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition_key}/{self.message_key}@{self.offset}"
