from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH, storable_error
from .messages import MessageRow, message_row, select_columns

_PK = ("consumer_group", "topic", "partition_key", "message_offset")
# retry_count of a row written for a message that was read but not yet delivered (delayed,
# or waiting behind an earlier message of its key): the first delivery makes it 0.
NEVER_DELIVERED = -1


class MessageRef(NamedTuple):
    partition: str
    offset: int


class DeliveryRow(NamedTuple):
    """A group's delivery state for one message."""

    acked: bool
    retry_count: int  # NEVER_DELIVERED, or redeliveries so far (attempt = retry_count + 1)
    invisible_until: int  # epoch ms, database clock
    last_error: str


class ReadRow(NamedTuple):
    """A message read for a group: the log row and, if it has one, its delivery state."""

    partition: str
    message: MessageRow
    delivery: DeliveryRow | None


class Hold(NamedTuple):
    """A message read but not delivered yet, kept invisible until ``until`` (epoch ms)."""

    partition: str
    offset: int
    until: int


def _refs_sql(q: Callable[[str], str], refs: Sequence[MessageRef]) -> tuple[str, list[object]]:
    """``partition_key IN (...) AND ((partition_key = ? AND message_offset IN (...)) OR ...)``.

    A row-value list ``(partition_key, message_offset) IN ((..), ..)`` would be shorter, but
    MariaDB plans a long one as a scan of the whole group. Even this form is planned as a
    scan on a small table, which is why every statement using it also pins the primary key
    (:func:`vendor.force_index_sql`): a scan locks rows of partitions other workers own.
    """
    by_partition: dict[str, list[int]] = {}
    for partition, offset in refs:
        by_partition.setdefault(partition, []).append(offset)
    terms, params = [], []
    for partition, offsets in by_partition.items():
        terms.append(
            f"({q('partition_key')} = %s AND {q('message_offset')} IN "
            f"({sqlb.placeholders(len(offsets))}))"
        )
        params += [partition, *offsets]
    partitions = list(by_partition)
    return (
        f"{q('partition_key')} IN ({sqlb.placeholders(len(partitions))}) AND ("
        + " OR ".join(terms) + ")",
        [*partitions, *params],
    )


class DeliveryStateManager(models.Manager["DeliveryState"]):
    """SQL for ``queue_delivery_state``: read a group's view of the log, deliver, hold, ack,
    nack, extend, clean up.

    The worker calls these inside its poll transaction, after it has share-locked its own
    lease rows: that lock is the fence that keeps a worker which lost a partition from
    writing on its behalf.
    """

    # ----------------------------------------------------------------- reads

    def read_new(
        self, group: str, topic: str, ranges: Mapping[str, tuple[int, int]], using: str,
    ) -> list[ReadRow]:
        """Per partition ``{partition: (cursor, limit)}``, the first ``limit`` messages
        positioned above the cursor, in position order, with the group's delivery state.

        Above a partition's read cursor a group normally has no delivery rows; where it
        has (state migrated from an earlier schema, or an operator made a delayed message
        due), they are honoured, not overwritten. They are read by primary key in a second
        statement: joined in the first, PostgreSQL with stale statistics read every row of
        the partition (parked ones included) per message.
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        branch = (
            f"SELECT m.{q('partition_key')} AS part, {select_columns(connection, 'm')} "  # noqa: S608 - names quoted, values bound
            f"FROM {q('queue_messages')} m "
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s AND m.{q('position')} > %s "
            f"ORDER BY m.{q('position')} LIMIT %s"
        )
        read: list[tuple[str, MessageRow]] = []
        for partitions in sqlb.chunks(list(ranges)):
            params: list[Any] = []
            for partition in partitions:
                cursor, limit = ranges[partition]
                params += [topic, partition, cursor, limit]
            for values in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(partitions)),
                                         params):
                partition, *message = values
                read.append((partition, message_row(message)))
        states = self._states(connection, group, topic,
                              [MessageRef(partition, m.offset) for partition, m in read])
        result = [ReadRow(partition, m, states.get(MessageRef(partition, m.offset)))
                  for partition, m in read]
        result.sort(key=lambda row: row.message.position or 0)
        return result

    def _states(self, connection: Any, group: str, topic: str, refs: Sequence[MessageRef]
                ) -> dict[MessageRef, DeliveryRow]:
        """The group's delivery rows of ``refs``, by primary key."""
        q = sqlb.quoter(connection)
        states: dict[MessageRef, DeliveryRow] = {}
        for batch in sqlb.chunks(list(refs), 500):
            where, params = _refs_sql(q, batch)
            for partition, offset, acked, retries, invisible, error in sqlb.fetch_all(
                connection,
                f"SELECT {q('partition_key')}, {q('message_offset')}, {q('acked')}, "  # noqa: S608 - names quoted, values bound
                f"{q('retry_count')}, {q('invisible_until')}, {q('last_error')} "
                f"FROM {q('queue_delivery_state')} WHERE {q('consumer_group')} = %s "
                f"AND {q('topic')} = %s AND {where}",
                [group, topic, *params],
            ):
                states[MessageRef(partition, int(offset))] = DeliveryRow(
                    bool(acked), int(retries), int(invisible), error or "")
        return states

    def unacked_window(
        self, group: str, topic: str, windows: Mapping[str, tuple[int, int]], using: str,
    ) -> list[ReadRow]:
        """Per partition ``{partition: (watermark, cursor)}``, every message in
        (watermark, cursor] the group has not acked, with its delivery state: what a worker
        that takes over a partition must know. Bounded by the unacked messages, not by the
        acked ones behind a slow head; one query per 200 partitions, like :meth:`read_new`."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        branch = (
            f"SELECT d.{q('partition_key')} AS part, {select_columns(connection, 'm')}, "  # noqa: S608 - names quoted, values bound
            f"d.{q('retry_count')} AS d_retries, d.{q('invisible_until')} AS d_invisible, "
            f"d.{q('last_error')} AS d_error "
            f"FROM {q('queue_delivery_state')} d JOIN {q('queue_messages')} m "
            f"ON m.{q('offset')} = d.{q('message_offset')} "
            f"WHERE d.{q('consumer_group')} = %s AND d.{q('topic')} = %s "
            f"AND d.{q('partition_key')} = %s AND d.{q('acked')} = {vendor.false_sql(connection)} "
            f"AND d.{q('parked')} = 0 AND m.{q('position')} > %s AND m.{q('position')} <= %s"
        )
        open_windows = [p for p, (watermark, cursor) in windows.items() if cursor > watermark]
        result: list[ReadRow] = []
        for partitions in sqlb.chunks(open_windows):
            params: list[Any] = []
            for partition in partitions:
                params += [group, topic, partition, *windows[partition]]
            for values in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(partitions)),
                                         params):
                partition, *message, retries, invisible, error = values
                result.append(ReadRow(partition, message_row(message),
                                      DeliveryRow(False, int(retries), int(invisible), error or "")))
        result.sort(key=lambda row: row.message.position or 0)
        return result

    # ----------------------------------------------------------------- writes

    def mark_delivered(
        self, group: str, topic: str, refs: Sequence[MessageRef], invisible_until: int,
        using: str,
    ) -> None:
        """Make messages invisible until ``invisible_until``; a redelivery bumps retry_count."""
        # One row per message: PostgreSQL refuses an upsert that reaches one row twice
        # ("ON CONFLICT DO UPDATE command cannot affect row a second time"), and MariaDB
        # and SQLite would count the redelivery twice.
        refs = list(dict.fromkeys(MessageRef(*ref) for ref in refs))
        if not refs:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        false = vendor.false_sql(connection)
        columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count", "last_error"))
        values = ", ".join([f"(%s, %s, %s, %s, {false}, %s, 0, '')"] * len(refs))
        tail = sqlb.on_conflict_update(connection, "queue_delivery_state", _PK, {
            "retry_count": "{old} + 1", "invisible_until": "{new}",
        })
        params: list[object] = []
        for partition, offset in refs:
            params += [group, topic, partition, offset, invisible_until]
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_delivery_state')} ({columns}) VALUES {values}{tail}",  # noqa: S608 - names quoted, values bound
            params,
        )

    def hold(self, group: str, topic: str, holds: Sequence[Hold], using: str) -> None:
        """Record messages read but not delivered yet (delayed, or behind their key), so a
        worker that takes the partition over finds them without re-reading the log."""
        holds = list({(hold.partition, hold.offset): hold for hold in holds}.values())
        if not holds:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        false = vendor.false_sql(connection)
        prefix, suffix = sqlb.insert_ignore(connection, _PK)
        columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count", "last_error"))
        for batch in sqlb.chunks(list(holds), 500):
            values = ", ".join([f"(%s, %s, %s, %s, {false}, %s, {NEVER_DELIVERED}, '')"] * len(batch))
            params: list[object] = []
            for partition, offset, until in batch:
                params += [group, topic, partition, offset, until]
            sqlb.execute(
                connection,
                f"{prefix} {q('queue_delivery_state')} ({columns}) VALUES {values}{suffix}",
                params,
            )

    def ack(self, group: str, topic: str, refs: Sequence[MessageRef], using: str,
            error: str = "") -> int:
        """Mark messages done for the group (``error`` is kept when dead-lettering)."""
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        set_error = f", {q('last_error')} = %s" if error else ""
        where, params = _refs_sql(q, refs)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('acked')} = {vendor.true_sql(connection)}"
            f"{set_error} WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where}",
            ([storable_error(error)] if error else []) + [group, topic, *params],
        )

    def nack(self, group: str, topic: str, ref: MessageRef, invisible_until: int, error: str,
             using: str) -> int:
        """Make an unacked message visible again at ``invisible_until`` (non-blocking retry)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s, "  # noqa: S608 - names quoted, values bound
            f"{q('last_error')} = %s WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('message_offset')} = %s "
            f"AND {q('acked')} = {vendor.false_sql(connection)}",
            [invisible_until, storable_error(error), group, topic, *ref],
        )

    def undeliver(self, group: str, topic: str, ref: MessageRef, now_ms: int,
                  using: str) -> int:
        """Undo the latest delivery of an unacked message whose handler never started:
        visible again at ``now_ms``, and that delivery no longer counts as an attempt."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s, "  # noqa: S608 - names quoted, values bound
            f"{q('retry_count')} = {q('retry_count')} - 1 "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('message_offset')} = %s "
            f"AND {q('acked')} = {vendor.false_sql(connection)} "
            f"AND {q('retry_count')} > {NEVER_DELIVERED}",
            [now_ms, group, topic, *ref],
        )

    def extend(self, group: str, topic: str, refs: Sequence[MessageRef], invisible_until: int,
               using: str, fence: tuple[str, str, int] | None = None,
               connection: Any = None) -> int:
        """Push back the visibility timeout of in-flight messages, without counting a retry.

        ``fence`` = (worker name, worker token, lease generation) makes the statement check
        ownership itself, for callers outside the worker's fenced poll (a handler's own
        extension). ``connection`` overrides the alias's connection of this thread.
        """
        if not refs:
            return 0
        connection = connection or connections[using]
        q = sqlb.quoter(connection)
        table = q("queue_delivery_state")
        fence_sql, fence_params = "", []
        if fence is not None:
            fence_sql = (
                f" AND EXISTS (SELECT 1 FROM {q('queue_partition_leases')} l "  # noqa: S608 - names quoted, values bound
                f"WHERE l.{q('consumer_group')} = {table}.{q('consumer_group')} "
                f"AND l.{q('topic')} = {table}.{q('topic')} "
                f"AND l.{q('partition_key')} = {table}.{q('partition_key')} "
                f"AND l.{q('leased_by')} = %s AND l.{q('lease_token')} = %s "
                f"AND l.{q('generation')} = %s)"
            )
            fence_params = list(fence)
        where, params = _refs_sql(q, refs)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('invisible_until')} = %s "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where} "
            f"AND {q('acked')} = {vendor.false_sql(connection)}{fence_sql}",
            [invisible_until, group, topic, *params, *fence_params],
        )

    def delete_acked(self, group: str, topic: str, refs: Sequence[MessageRef], using: str) -> int:
        """Drop acked rows the watermark has passed; they are never read again."""
        return self._delete(group, topic, refs, using, acked_only=True)

    def delete_refs(self, group: str, topic: str, refs: Sequence[MessageRef], using: str) -> int:
        """Drop the group's rows of messages that were deleted from the log (a discarded
        or replayed dead letter), acked or not."""
        return self._delete(group, topic, refs, using, acked_only=False)

    def _delete(self, group: str, topic: str, refs: Sequence[MessageRef], using: str,
                acked_only: bool) -> int:
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        acked_sql = f" AND {q('acked')} = {vendor.true_sql(connection)}" if acked_only else ""
        deleted = 0
        for batch in sqlb.chunks(list(refs), 500):
            where, params = _refs_sql(q, batch)
            deleted += sqlb.execute(
                connection,
                f"{sqlb.delete_from(connection, 'queue_delivery_state')} "
                f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where}{acked_sql}",
                [group, topic, *params],
            )
        return deleted

    def window_counts(self, pairs: Sequence[tuple[str, str]], now_ms: int, cap: int,
                      using: str) -> dict[tuple[str, str], tuple[int, int]]:
        """Per (group, topic): (acked, in flight) among its delivery rows, each counted up
        to ``cap``. Rows exist only for read, unpassed messages, so acked ones lie above a
        watermark (acked out of order, or dead-lettered), and in-flight ones were delivered
        and are still invisible. One query per 100 pairs."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        mine = (f"FROM {q('queue_delivery_state')} WHERE {q('consumer_group')} = %s "
                f"AND {q('topic')} = %s AND ")
        acked = (f"SELECT %s AS g, %s AS t, 0 AS k, COUNT(*) AS n FROM (SELECT 1 AS one {mine}"  # noqa: S608 - names quoted, values bound
                 f"{q('acked')} = {vendor.true_sql(connection)} AND {q('parked')} = 0 LIMIT %s) AS s")
        in_flight = (f"SELECT %s AS g, %s AS t, 1 AS k, COUNT(*) AS n FROM (SELECT 1 AS one {mine}"  # noqa: S608 - names quoted, values bound
                     f"{q('acked')} = {vendor.false_sql(connection)} AND {q('retry_count')} >= 0 "
                     f"AND {q('invisible_until')} > %s LIMIT %s) AS s")
        counts = {pair: [0, 0] for pair in pairs}
        for batch in sqlb.chunks(list(pairs), sqlb.MAX_UNION_BRANCHES // 2):
            params: list[object] = []
            for group, topic in batch:
                params += [group, topic, group, topic, cap, group, topic, group, topic, now_ms, cap]
            for group, topic, kind, n in sqlb.fetch_all(
                    connection, sqlb.union_all([acked, in_flight] * len(batch)), params):
                counts[(group, topic)][int(kind)] = int(n)
        return {pair: (n[0], n[1]) for pair, n in counts.items()}

    def make_due(self, group: str, topic: str, ref: MessageRef, now_ms: int,
                 using: str) -> int:
        """Make a message that waits out a delay, a backoff or its key's head deliverable
        now; a message delivered and not failed (running) is left alone."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s "
            f"AND {q('message_offset')} = %s AND {q('acked')} = {vendor.false_sql(connection)} "
            f"AND {q('invisible_until')} > %s "
            f"AND ({q('retry_count')} = {NEVER_DELIVERED} OR {q('last_error')} <> '')",
            [now_ms, group, topic, *ref, now_ms],
        )

    def groups_of(self, topic: str, using: str) -> list[str]:
        """The groups with delivery rows of ``topic``."""
        return sorted(set(self.using(using).filter(topic=topic)
                          .values_list("consumer_group", flat=True).distinct()))

    def delete_messages(self, groups: Sequence[str], topic: str, offsets: Sequence[int],
                        using: str) -> int:
        """Delete the groups' rows of these messages of ``topic`` (being deleted from the
        log), a group at a time: each DELETE is then a primary-key range, not a scan of
        other topics'."""
        return sum(self.using(using).filter(consumer_group=group, topic=topic,
                                            message_offset__in=offsets).delete()[0]
                   for group in groups)


class DeliveryState(models.Model):
    """One consumer group's delivery of one message (the RFC's ``queue_delivery_state``).

    Beyond the RFC: ``last_error`` keeps the handler's most recent failure so the DLQ copy
    (and an operator) can see why a message is being retried; ``retry_count`` is -1 for a
    message the group's worker has read but not delivered yet (delayed, or waiting behind
    an earlier message of its key in strict mode).
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    message_offset = models.BigIntegerField()
    acked = models.BooleanField(default=False)
    # Epoch ms (database clock); only meaningful while acked is false.
    invisible_until = models.BigIntegerField(default=0)
    # Redeliveries so far: the attempt number is retry_count + 1 (-1: not delivered yet).
    retry_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Waiting messages the watermark has passed (see django_sqlqueue.models.waiting):
    # NOT_PARKED, PARKED_DUE or PARKED_BEHIND. A parked row also names its message's key and
    # position, so a key's next parked message is found without reading the log.
    parked = models.SmallIntegerField(db_default=0)
    message_key = models.CharField(max_length=KEY_LENGTH, blank=True, db_default="")
    message_position = models.BigIntegerField(db_default=0)

    objects = DeliveryStateManager()

    class Meta:
        db_table = "queue_delivery_state"
        verbose_name = "delivery state"
        verbose_name_plural = "delivery states"
        # Both lead with a column the joins on this table (message → delivery row) never
        # name, so no planner takes them for the primary key: PostgreSQL with stale
        # statistics once read a whole group's rows per message through such a prefix.
        indexes = [
            # A partition's parked messages by due time (and, acked, those GC may collect).
            models.Index(fields=["parked", "consumer_group", "topic", "partition_key", "acked",
                                 "invisible_until"], name="queue_delivery_parked"),
            # A key's parked messages in log order (strict mode); the partition is left out
            # to fit MySQL's index size limit (a key lives in one partition).
            models.Index(fields=["message_key", "consumer_group", "topic", "message_position"],
                         name="queue_delivery_parked_key"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key}@{self.message_offset}"
