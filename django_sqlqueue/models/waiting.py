"""SQL for the *parked* rows of ``queue_delivery_state``: waiting messages the watermark passed.

A message that has to wait (delayed, backing off before a retry, or in strict mode queued
behind an earlier message of its key that waits) is not kept in its owner's memory and
does not hold the group's watermark back: its delivery row is marked parked, with the
message's key and position. The owner finds a PARKED_DUE row again by its due time
(``invisible_until``); a PARKED_BEHIND row waits for its key and is promoted to PARKED_DUE
when the key's earlier message is done. A row stays parked until the group acks it; GC
keeps the message while any counted group has it parked and unacked, then collects the
message and the acked parked rows (see :mod:`django_sqlqueue.worker.collector`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from django.db import connections

from ..db import sql as sqlb
from ..db import vendor
from .delivery_rows import NEVER_DELIVERED, DeliveryRow, MessageRef, ReadRow, refs_sql
from .messages import message_row, select_columns

NOT_PARKED = 0  # in its owner's window (or acked there)
PARKED_DUE = 1  # deliverable from invisible_until
PARKED_BEHIND = 2  # strict mode: waits until its key's earlier messages are done

_PK = ("consumer_group", "topic", "partition_key", "message_offset")


class Park(NamedTuple):
    """A waiting message to park: its row, its key and position, and until when it waits."""

    partition: str
    offset: int
    key: str
    position: int
    until: int  # epoch ms, database clock
    state: int  # PARKED_DUE or PARKED_BEHIND


class KeyHead(NamedTuple):
    """The first (lowest position) unacked parked message of a key."""

    partition: str
    key: str
    offset: int
    state: int
    until: int


def park(group: str, topic: str, parks: Sequence[Park], using: str) -> None:
    """Mark rows parked (writing them if the message had none yet), one statement per 500.

    An existing row keeps its attempts and last error; its due time becomes ``until``.
    """
    # One row once (the last decision stands): PostgreSQL refuses an upsert that changes a
    # row twice.
    parks = list({(p.partition, p.offset): p for p in parks}.values())
    if not parks:
        return
    connection = connections[using]
    q = sqlb.quoter(connection)
    false = vendor.false_sql(connection)
    columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count",
                                       "last_error", "parked", "message_key", "message_position"))
    tail = sqlb.on_conflict_update(connection, "queue_delivery_state", _PK, {
        "parked": "{new}", "message_key": "{new}", "message_position": "{new}",
        "invisible_until": "{new}",
    })
    for batch in sqlb.chunks(list(parks), 500):
        values = ", ".join([f"(%s, %s, %s, %s, {false}, %s, {NEVER_DELIVERED}, '', %s, %s, %s)"]
                           * len(batch))
        params: list[object] = []
        for p in batch:
            params += [group, topic, p.partition, p.offset, p.until, p.state, p.key, p.position]
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_delivery_state')} ({columns}) VALUES {values}{tail}",  # noqa: S608 - names quoted, values bound
            params,
        )


def due(group: str, topic: str, limits: Mapping[str, int], using: str) -> list[ReadRow]:
    """Per partition ``{partition: limit}``, its first ``limit`` PARKED_DUE messages by due
    time (due now or not: the first one not due says when to look again), with the log
    row. One index range per partition, 200 partitions to a query."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    branch = (
        f"SELECT d.{q('partition_key')} AS part, {select_columns(connection, 'm')}, "  # noqa: S608 - names quoted, values bound
        f"d.{q('retry_count')} AS d_retries, d.{q('invisible_until')} AS d_due, "
        f"d.{q('last_error')} AS d_error "
        f"FROM {q('queue_delivery_state')} d JOIN {q('queue_messages')} m "
        f"ON m.{q('offset')} = d.{q('message_offset')} "
        f"WHERE d.{q('consumer_group')} = %s AND d.{q('topic')} = %s "
        f"AND d.{q('partition_key')} = %s AND d.{q('parked')} = {PARKED_DUE} "
        f"AND d.{q('acked')} = {vendor.false_sql(connection)} "
        f"ORDER BY d.{q('invisible_until')} LIMIT %s"
    )
    result: list[ReadRow] = []
    for partitions in sqlb.chunks(list(limits)):
        params: list[Any] = []
        for partition in partitions:
            params += [group, topic, partition, limits[partition]]
        for values in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(partitions), connection),
                                     params):
            partition, *message, retries, due_ms, error = values
            result.append(ReadRow(partition, message_row(message),
                                  DeliveryRow(False, int(retries), int(due_ms), error or "")))
    result.sort(key=lambda row: row.delivery.invisible_until if row.delivery else 0)
    return result


def keys_parked(group: str, topic: str, keys: Sequence[tuple[str, str]],
                using: str) -> set[tuple[str, str]]:
    """Which of the (partition, key) pairs have an unacked parked message."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    branch = (
        f"SELECT {q('partition_key')}, {q('message_key')} FROM {q('queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('message_key')} = %s "
        f"AND {q('partition_key')} = %s AND {q('parked')} > 0 "
        f"AND {q('acked')} = {vendor.false_sql(connection)} LIMIT 1"
    )
    found: set[tuple[str, str]] = set()
    for batch in sqlb.chunks(list(keys)):
        params = [v for partition, key in batch for v in (group, topic, key, partition)]
        found.update((r[0], r[1]) for r in sqlb.fetch_all(
            connection, sqlb.union_all([branch] * len(batch), connection), params))
    return found


def key_heads(group: str, topic: str, keys: Sequence[tuple[str, str]],
              using: str) -> dict[tuple[str, str], KeyHead]:
    """Per (partition, key), its first unacked parked message in log order, if any."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    branch = (
        f"SELECT {q('partition_key')}, {q('message_key')}, {q('message_offset')}, "  # noqa: S608 - names quoted, values bound
        f"{q('parked')}, {q('invisible_until')} FROM {q('queue_delivery_state')} "
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('message_key')} = %s "
        f"AND {q('partition_key')} = %s AND {q('parked')} > 0 "
        f"AND {q('acked')} = {vendor.false_sql(connection)} "
        f"ORDER BY {q('message_position')} LIMIT 1"
    )
    heads: dict[tuple[str, str], KeyHead] = {}
    for batch in sqlb.chunks(list(keys)):
        params = [v for partition, key in batch for v in (group, topic, key, partition)]
        for partition, key, offset, state, until in sqlb.fetch_all(
                connection, sqlb.union_all([branch] * len(batch), connection), params):
            heads[(partition, key)] = KeyHead(partition, key, int(offset), int(state), int(until))
    return heads


def promote(group: str, topic: str, refs: Sequence[MessageRef], using: str) -> int:
    """Make PARKED_BEHIND rows PARKED_DUE: their key's earlier messages are done."""
    if not refs:
        return 0
    connection = connections[using]
    q = sqlb.quoter(connection)
    where, params = refs_sql(connection, refs)
    return sqlb.execute(
        connection,
        f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
        f"SET {q('parked')} = {PARKED_DUE} WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
        f"AND {where} AND {q('parked')} = {PARKED_BEHIND}",
        [group, topic, *params],
    )


def any_keyed(group: str, topic: str, partition: str, using: str) -> bool:
    """Whether the partition has an unacked parked message with a key."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    false = vendor.false_sql(connection)
    rows = sqlb.fetch_all(
        connection,
        f"SELECT 1 FROM {q('queue_delivery_state')} WHERE {q('consumer_group')} = %s "  # noqa: S608 - names quoted, values bound
        f"AND {q('topic')} = %s AND {q('partition_key')} = %s AND {q('parked')} IN (%s, %s) "
        f"AND {q('acked')} = {false} AND {q('message_key')} <> '' LIMIT 1",
        [group, topic, partition, PARKED_DUE, PARKED_BEHIND],
    )
    return bool(rows)


def next_retry(group: str, topic: str, partitions: Sequence[str], before_ms: int,
               using: str) -> int | None:
    """The earliest due time, up to ``before_ms``, of a parked message of ``partitions``
    that was delivered before (a retry waiting out its backoff); None when there is none.
    A range of the parked-row index per partition, up to ``before_ms``."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    earliest: int | None = None
    for batch in sqlb.chunks(list(partitions), 500):
        rows = sqlb.fetch_all(
            connection,
            f"SELECT MIN({q('invisible_until')}) FROM {q('queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('parked')} = {PARKED_DUE} AND {q('consumer_group')} = %s "
            f"AND {q('topic')} = %s AND {q('partition_key')} IN ({sqlb.placeholders(len(batch))}) "
            f"AND {q('acked')} = {vendor.false_sql(connection)} "
            f"AND {q('invisible_until')} <= %s AND {q('retry_count')} <> {NEVER_DELIVERED}",
            [group, topic, *batch, before_ms],
        )
        if rows and rows[0][0] is not None:
            due = int(rows[0][0])
            earliest = due if earliest is None else min(earliest, due)
    return earliest


def count_parked(group: str, topic: str, partitions: Sequence[str], cap: int,
                 using: str) -> int:
    """Unacked parked messages of ``partitions`` (delayed, or backing off), up to ``cap``."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    total = 0
    for batch in sqlb.chunks(list(partitions), 500):
        rows = sqlb.fetch_all(
            connection,
            f"SELECT COUNT(*) FROM (SELECT 1 AS one FROM {q('queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('parked')} IN ({PARKED_DUE}, {PARKED_BEHIND}) "
            f"AND {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} IN ({sqlb.placeholders(len(batch))}) "
            f"AND {q('acked')} = {vendor.false_sql(connection)} LIMIT %s) AS capped",
            [group, topic, *batch, cap - total],
        )
        total += int(rows[0][0])
        if total >= cap:
            break
    return total


# ----------------------------------------------------------------- garbage collection

def settled(topic: str, groups: Sequence[str], partitions: Sequence[str], limit: int,
            using: str) -> list[MessageRef]:
    """Parked messages some of ``groups`` has acked since: their log rows may now be
    collectable. Up to ``limit`` per group and partition."""
    if not groups or not partitions:
        return []
    connection = connections[using]
    q = sqlb.quoter(connection)
    branch = (
        f"SELECT {q('partition_key')}, {q('message_offset')} FROM {q('queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s "
        f"AND {q('parked')} = {PARKED_DUE} AND {q('acked')} = {vendor.true_sql(connection)} "
        f"LIMIT %s"
    )
    pairs = [(group, partition) for group in groups for partition in partitions]
    found: set[MessageRef] = set()
    for batch in sqlb.chunks(pairs):
        params = [v for group, partition in batch for v in (group, topic, partition, limit)]
        found.update(MessageRef(r[0], int(r[1])) for r in sqlb.fetch_all(
            connection, sqlb.union_all([branch] * len(batch), connection), params))
    return sorted(found)


def forget_settled(topic: str, groups: Sequence[str], refs: Sequence[MessageRef],
                   using: str) -> int:
    """Delete the acked parked rows of ``refs`` (their messages are gone from the log)."""
    if not groups or not refs:
        return 0
    connection = connections[using]
    q = sqlb.quoter(connection)
    deleted = 0
    for batch in sqlb.chunks(list(refs), 500):
        where, params = refs_sql(connection, batch)
        deleted += sqlb.execute(
            connection,
            f"{sqlb.delete_from(connection, 'queue_delivery_state')} "
            f"WHERE {q('consumer_group')} IN ({sqlb.placeholders(len(groups))}) "
            f"AND {q('topic')} = %s AND {where} AND {q('parked')} > 0 "
            f"AND {q('acked')} = {vendor.true_sql(connection)}",
            [*groups, topic, *params],
        )
    return deleted
