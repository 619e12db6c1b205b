from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import connections, models

from ..db import sql as sqlb
from ..db import vendor
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH

_PK = ("consumer_group", "topic", "partition_key", "message_offset")
ERROR_LENGTH = 10_000  # characters of a handler's error kept (MySQL TEXT holds 64 KiB)

# (partition_key, message_offset)
MessageRef = tuple[str, int]


def _refs_sql(q: Callable[[str], str], refs: Sequence[MessageRef]) -> tuple[str, list[object]]:
    """``partition_key IN (...) AND ((partition_key = ? AND message_offset IN (...)) OR ...)``.

    A row-value list ``(partition_key, message_offset) IN ((..), ..)`` would be shorter, but
    MariaDB turns a long one into a scan of the whole group, and a long OR of per-partition
    terms can end the same way. Either scan locks rows of partitions another worker owns, so
    two workers deadlock. The leading ``partition_key IN`` keeps every plan inside this
    worker's own partitions.
    """
    by_key: dict[str, list[int]] = {}
    for key, offset in refs:
        by_key.setdefault(key, []).append(offset)
    terms, params = [], []
    for key, offsets in by_key.items():
        terms.append(
            f"({q('partition_key')} = %s AND {q('message_offset')} IN "
            f"({vendor.placeholders(len(offsets))}))"
        )
        params += [key, *offsets]
    keys = list(by_key)
    return (
        f"{q('partition_key')} IN ({vendor.placeholders(len(keys))}) AND ("
        + " OR ".join(terms) + ")",
        [*keys, *params],
    )


class DeliveryStateManager(models.Manager["DeliveryState"]):
    """SQL for ``queue_delivery_state``: deliver, ack, nack, extend, clean up.

    The worker calls these inside its tick transaction, after it has share-locked its own
    lease rows: that lock is the fence that keeps a worker which lost a partition from
    writing on its behalf.
    """

    def mark_delivered(
        self, group: str, topic: str, refs: Sequence[MessageRef], invisible_until: int,
        using: str,
    ) -> None:
        """Make messages invisible until ``invisible_until``; a redelivery bumps retry_count."""
        if not refs:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        false = vendor.false_sql(connection)
        columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count", "last_error"))
        values = ", ".join([f"(%s, %s, %s, %s, {false}, %s, 0, '')"] * len(refs))
        if connection.vendor == "mysql":
            tail = (
                f" ON DUPLICATE KEY UPDATE {q('retry_count')} = {q('retry_count')} + 1, "
                f"{q('invisible_until')} = VALUES({q('invisible_until')})"
            )
        else:
            table = q("queue_delivery_state")
            tail = (
                f" ON CONFLICT ({', '.join(q(c) for c in _PK)}) DO UPDATE SET "
                f"{q('retry_count')} = {table}.{q('retry_count')} + 1, "
                f"{q('invisible_until')} = EXCLUDED.{q('invisible_until')}"
            )
        params: list[object] = []
        for key, offset in refs:
            params += [group, topic, key, offset, invisible_until]
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_delivery_state')} ({columns}) VALUES {values}{tail}",
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
            f"UPDATE {q('queue_delivery_state')} SET {q('acked')} = {vendor.true_sql(connection)}"
            f"{set_error} WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where}",
            ([error[:ERROR_LENGTH]] if error else []) + [group, topic, *params],
        )

    def nack(self, group: str, topic: str, ref: MessageRef, invisible_until: int, error: str,
             using: str) -> int:
        """Make an unacked message visible again at ``invisible_until`` (non-blocking retry)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s, "
            f"{q('last_error')} = %s WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('message_offset')} = %s "
            f"AND {q('acked')} = {vendor.false_sql(connection)}",
            [invisible_until, error[:ERROR_LENGTH], group, topic, *ref],
        )

    def extend(self, group: str, topic: str, refs: Sequence[MessageRef], invisible_until: int,
               using: str, fence: tuple[str, int] | None = None) -> int:
        """Push back the visibility timeout of in-flight messages, without counting a retry.

        ``fence`` = (worker name, lease generation) makes the statement check ownership
        itself, for callers outside the worker's fenced tick (a handler's own extension).
        """
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        table = q("queue_delivery_state")
        fence_sql, fence_params = "", []
        if fence is not None:
            fence_sql = (
                f" AND EXISTS (SELECT 1 FROM {q('queue_partition_leases')} l "
                f"WHERE l.{q('consumer_group')} = {table}.{q('consumer_group')} "
                f"AND l.{q('topic')} = {table}.{q('topic')} "
                f"AND l.{q('partition_key')} = {table}.{q('partition_key')} "
                f"AND l.{q('leased_by')} = %s AND l.{q('generation')} = %s)"
            )
            fence_params = list(fence)
        where, params = _refs_sql(q, refs)
        return sqlb.execute(
            connection,
            f"UPDATE {table} SET {q('invisible_until')} = %s "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where} "
            f"AND {q('acked')} = {vendor.false_sql(connection)}{fence_sql}",
            [invisible_until, group, topic, *params, *fence_params],
        )

    def delete_acked(self, group: str, topic: str, refs: Sequence[MessageRef], using: str) -> int:
        """Drop acked rows the watermark has passed; they are never read again."""
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        where, params = _refs_sql(q, refs)
        return sqlb.execute(
            connection,
            f"DELETE FROM {q('queue_delivery_state')} WHERE {q('consumer_group')} = %s "
            f"AND {q('topic')} = %s AND {where} AND {q('acked')} = {vendor.true_sql(connection)}",
            [group, topic, *params],
        )


class DeliveryState(models.Model):
    """One consumer group's delivery of one message (the RFC's ``queue_delivery_state``).

    Beyond the RFC: ``last_error`` keeps the handler's most recent failure so the DLQ copy
    (and an operator) can see why a message is being retried.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    message_offset = models.BigIntegerField()
    acked = models.BooleanField(default=False)
    # Epoch ms (database clock); only meaningful while acked is false.
    invisible_until = models.BigIntegerField(default=0)
    # Redeliveries so far: the attempt number is retry_count + 1.
    retry_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    objects = DeliveryStateManager()

    class Meta:
        db_table = "queue_delivery_state"
        verbose_name = "delivery state"
        verbose_name_plural = "delivery states"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key}@{self.message_offset}"
