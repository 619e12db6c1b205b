"""The reads of ``queue_delivery_state``: a group's view of the log (new messages with any
delivery rows they have, the unacked window a new owner takes over), and the counts the
overview shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .delivery_rows import CancelView, DeliveryRow, MessageRef, ReadRow
from .messages import message_row, select_columns


class DeliveryReads(models.Manager[Any]):
    """The reads of :class:`django_sqlqueue.models.delivery.DeliveryStateManager`."""

    def read_new(
        self, group: str, topic: str, ranges: Mapping[str, tuple[int, int]], using: str,
    ) -> list[ReadRow]:
        """Per partition ``{partition: (cursor, limit)}``, the first ``limit`` messages
        positioned above the cursor, in position order, with the group's delivery state.

        Above a partition's read cursor a group normally has no delivery rows; where it
        has (parked messages read again after a restart, state migrated from an earlier
        schema, or an operator made a delayed message due), they are honoured, not
        overwritten. They are joined by primary key in the same statement. On PostgreSQL
        the join is LATERAL, and its LIMIT keeps the planner from flattening it, which pins
        it to one primary-key lookup per message read: a plain join, with stale statistics,
        read every row of the partition (parked ones included) per message.
        """
        connection = connections[using]
        q = sqlb.quoter(connection)
        delivery_columns = (
            f", d.{q('acked')}, d.{q('retry_count')}, d.{q('invisible_until')}, "
            f"d.{q('last_error')} ")
        match = (f"d.{q('consumer_group')} = %s AND d.{q('topic')} = m.{q('topic')} "
                 f"AND d.{q('partition_key')} = m.{q('partition_key')} "
                 f"AND d.{q('message_offset')} = m.{q('offset')}")
        if connection.vendor == "postgresql":
            delivery_join = (
                f"LEFT JOIN LATERAL (SELECT d.{q('acked')}, d.{q('retry_count')}, "  # noqa: S608 - names quoted, values bound
                f"d.{q('invisible_until')}, d.{q('last_error')} "
                f"FROM {q('queue_delivery_state')} d WHERE {match} LIMIT 1) d ON TRUE ")
        else:
            delivery_join = f"LEFT JOIN {q('queue_delivery_state')} d ON {match} "
        branch = (
            f"SELECT m.{q('partition_key')} AS part, {select_columns(connection, 'm')}"  # noqa: S608 - names quoted, values bound
            f"{delivery_columns}FROM {q('queue_messages')} m {delivery_join}"
            f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s AND m.{q('position')} > %s "
            f"ORDER BY m.{q('position')} LIMIT %s"
        )
        result: list[ReadRow] = []
        for partitions in sqlb.chunks(list(ranges)):
            params: list[Any] = []
            for partition in partitions:
                cursor, limit = ranges[partition]
                params += [group, topic, partition, cursor, limit]
            for values in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(partitions), connection),
                                         params):
                partition, *message, acked, retries, invisible, error = values
                delivery = None if acked is None else DeliveryRow(
                    bool(acked), int(retries), int(invisible), error or "")
                result.append(ReadRow(partition, message_row(message), delivery))
        result.sort(key=lambda row: row.message.position or 0)
        return result

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
            f"d.{q('last_error')} AS d_error, d.{q('in_flight')} AS d_in_flight "
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
            for values in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(partitions), connection),
                                         params):
                partition, *message, retries, invisible, error, in_flight = values
                result.append(ReadRow(partition, message_row(message),
                                      DeliveryRow(False, int(retries), int(invisible), error or "",
                                                  bool(in_flight))))
        result.sort(key=lambda row: row.message.position or 0)
        return result

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
                    connection, sqlb.union_all([acked, in_flight] * len(batch), connection), params):
                counts[(group, topic)][int(kind)] = int(n)
        return {pair: (n[0], n[1]) for pair, n in counts.items()}

    def cancel_view(self, group: str, topic: str, ref: MessageRef, using: str
                    ) -> CancelView | None:
        """The group's delivery row of one message, as a cancellation judges it."""
        row = (self.using(using)
               .filter(consumer_group=group, topic=topic, partition_key=ref.partition,
                       message_offset=ref.offset)
               .values_list("acked", "retry_count", "invisible_until", "last_error",
                            "in_flight", "parked").first())
        if row is None:
            return None
        acked, retries, invisible, error, in_flight, parked = row
        return CancelView(bool(acked), int(retries), int(invisible), error or "",
                          bool(in_flight), int(parked))

    def key_in_window(self, group: str, topic: str, partition: str, key: str,
                      using: str) -> bool:
        """Whether the group keeps an unacked message of ``key`` in its window (a row not
        parked): in strict mode the key's parked messages wait for it."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return bool(sqlb.fetch_all(
            connection,
            f"SELECT 1 FROM {q('queue_delivery_state')} d JOIN {q('queue_messages')} m "  # noqa: S608 - names quoted, values bound
            f"ON m.{q('offset')} = d.{q('message_offset')} "
            f"WHERE d.{q('consumer_group')} = %s AND d.{q('topic')} = %s "
            f"AND d.{q('partition_key')} = %s AND d.{q('acked')} = {vendor.false_sql(connection)} "
            f"AND d.{q('parked')} = 0 AND m.{q('message_key')} = %s LIMIT 1",
            [group, topic, partition, key],
        ))

    def groups_of(self, topic: str, using: str) -> list[str]:
        """The groups with delivery rows of ``topic``."""
        return sorted(set(self.using(using).filter(topic=topic)
                          .values_list("consumer_group", flat=True).distinct()))
