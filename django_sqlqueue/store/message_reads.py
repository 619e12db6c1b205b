"""The worker's and the operator's reads of the log (``queue_messages``): which partitions
got messages, messages by offset or by id, what a watermark passed, each partition's
progress.

Reads that join a group's delivery rows live with that table
(:mod:`django_sqlqueue.models.delivery_reads`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..db import arrays
from ..db import sql as sqlb
from ..db import vendor as db_vendor
from .connection import Connection
from .messages import MessageRow, message_row, select_columns


class PartitionProgress(NamedTuple):
    """What the log holds for one partition, seen from one watermark."""

    newest: int | None  # the highest position in the partition
    lag: int  # messages positioned above the watermark (counted up to a cap)
    oldest_pending: int | None  # published_at (epoch ms) of the first of them


def partition_heads(conn: Connection, after_position: int, up_to_position: int,
                    topics: Sequence[str]) -> list[tuple[str, str, int]]:
    """(topic, partition, highest position) of the partitions of ``topics`` that got
    messages with a position in (after, up_to]. Reads only the new rows."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('topic')}, {q('partition_key')}, MAX({q('position')}) "  # noqa: S608 - names quoted, values bound
        f"FROM {q('queue_messages')} WHERE {q('position')} > %s AND {q('position')} <= %s "
        f"AND {q('topic')} IN ({sqlb.placeholders(len(topics))}) "
        f"GROUP BY {q('topic')}, {q('partition_key')}",
        [after_position, up_to_position, *topics],
    )
    return [(r[0], r[1], int(r[2])) for r in rows]


def topics(conn: Connection, cap: int) -> list[str]:
    """The topics that have messages in the log (dead-letter topics included), in name
    order, up to ``cap``: one seek of the queue_msg_partition index per topic."""
    sql = db_vendor.distinct_leading_sql(conn, "queue_messages", "topic")
    return [str(row[0]) for row in conn.fetch_all(sql, [cap])]


def by_offsets(conn: Connection, offsets: Sequence[int]) -> dict[int, MessageRow]:
    """Messages by offset (a redelivery needs its payload again)."""
    q = conn.q
    result: dict[int, MessageRow] = {}
    for batch in sqlb.chunks(list(offsets), 500):
        for values in conn.fetch_all(
            f"SELECT {select_columns(conn)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('offset')} IN ({sqlb.placeholders(len(batch))})",
            list(batch),
        ):
            row = message_row(values)
            result[row.offset] = row
    return result


def waiting_task(conn: Connection, topics: Sequence[str], message_id: str) -> MessageRow | None:
    """The keyless message ``message_id`` of one of ``topics`` (a task no worker has
    started; ``get_result`` reads it), found through the idempotency index."""
    if not topics:
        return None
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {select_columns(conn)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} IN ({sqlb.placeholders(len(topics))}) "
        f"AND {q('message_key')} = '' AND {q('id')} = %s",
        [*topics, message_id],
    )
    return message_row(rows[0]) if rows else None


def offsets_between(conn: Connection, topic: str,
                    ranges: dict[str, tuple[int, int]]) -> list[tuple[str, int]]:
    """(partition, offset) of the messages positioned in (low, high] of each partition's
    ``(low, high)``: the ones a watermark just passed. One range read per partition.

    On PostgreSQL the ranges come as arrays, each a lateral range read of
    ``queue_msg_position``. Not a disjunction of ranges: with statistics taken while the
    log was small (a queue just deployed, or just drained), the planner read it as every
    message of those partitions, so a watermark's move cost as much as the backlog.
    Every piece of the lateral read keeps that plan whatever the statistics say: ``OFFSET
    0`` keeps it a subquery, so the ranges stay the outer side; the range is written as a
    row comparison, which only ``queue_msg_position`` can serve (the narrower
    ``queue_msg_sequencing`` would otherwise look as cheap); ``ORDER BY`` makes the other
    indexes on ``(topic, partition_key)`` cost a sort. MariaDB, MySQL and SQLite plan
    the OR-ed ranges as ranges of the index."""
    q = conn.q
    if conn.vendor == "postgresql":
        names = list(ranges)
        return [(r[0], int(r[1])) for r in conn.fetch_all(
            f"SELECT r.p, m.{q('offset')} FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) "  # noqa: S608 - names quoted, values bound
            f"AS r(p, low, high) CROSS JOIN LATERAL (SELECT {q('offset')} "
            f"FROM {q('queue_messages')} WHERE {q('topic')} = %s AND {q('partition_key')} = r.p "
            f"AND ({q('partition_key')}, {q('position')}) > (r.p, r.low) "
            f"AND ({q('partition_key')}, {q('position')}) <= (r.p, r.high) "
            f"ORDER BY {q('position')} OFFSET 0) AS m",
            [arrays.text_array(names), arrays.int_array([ranges[p][0] for p in names]),
             arrays.int_array([ranges[p][1] for p in names]), topic],
        )]
    result: list[tuple[str, int]] = []
    for partitions in sqlb.chunks(list(ranges)):
        terms = " OR ".join(
            [f"({q('partition_key')} = %s AND {q('position')} > %s AND {q('position')} <= %s)"]
            * len(partitions)
        )
        params: list[Any] = [topic]
        for partition in partitions:
            params += [partition, *ranges[partition]]
        result += [(r[0], int(r[1])) for r in conn.fetch_all(
            f"SELECT {q('partition_key')}, {q('offset')} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('topic')} = %s AND ({terms})",
            params,
        )]
    return result


def partition_progress(conn: Connection, partitions: Sequence[tuple[str, str, int]], cap: int
                       ) -> dict[tuple[str, str, int], PartitionProgress]:
    """For each (topic, partition, watermark): the newest position, the messages above
    the watermark (counted up to ``cap``) and when the oldest of them was published.
    Each is a short read of the queue_msg_position index; one query per 200 partitions."""
    q = conn.q
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
        for topic, partition, watermark, newest, lag, oldest in conn.fetch_all(
                sqlb.union_all([branch] * len(batch)), params):
            result[(topic, partition, int(watermark))] = PartitionProgress(
                None if newest is None else int(newest), int(lag or 0),
                None if oldest is None else int(oldest))
    return result
