"""How far behind the log a consumer group is: the reads behind the operator's lag figures.

Each joins a group's watermarks (``queue_offsets``) to the log above them, and counts the
messages the group parked below them (``queue_delivery_state``): the overview, the metrics
and repartitioning read them through :class:`django_sqlqueue.models.ConsumerOffset`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..db import sql as sqlb
from ..db import vendor
from . import offsets
from .connection import Connection


class LagFigures(NamedTuple):
    """A group's backlog on one topic, summed over its partitions (the overview)."""

    partitions: int  # watermark rows
    lag: int  # messages above the watermarks: exact, or an estimate when ``estimated``
    estimated: bool
    oldest_due: int | None  # epoch ms: the earliest deliver_at of each partition's next message


def lag_figures(conn: Connection, sample: int, *, topic: str | None = None,
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
    where: dict[str, str] = {}
    if topic is not None:
        where["topic"] = topic
    if group is not None:
        where["consumer_group"] = group
    if vendor.correlated_ranges(conn):
        rows = _lag_rows_correlated(conn, sample, where)
    else:
        rows = _lag_rows_by_partition(conn, sample, where)
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
    for t, g, parked, due in _parked_figures(conn, marks, sample, now_ms):
        seen = figures.get((t, g), LagFigures(0, 0, False, None))
        oldest = seen.oldest_due
        if due is not None:
            oldest = due if oldest is None else min(oldest, due)
        figures[(t, g)] = seen._replace(lag=seen.lag + parked, oldest_due=oldest,
                                        estimated=seen.estimated or parked >= sample)
    return figures


def _lag_rows_correlated(conn: Connection, sample: int,
                         where: Mapping[str, str]) -> list[tuple[Any, ...]]:
    """(topic, group, sample-th position above the watermark, messages above it up to
    ``sample``, first position above it, newest position, first one's deliver_at) per
    watermark row: subqueries correlated with the watermark, which PostgreSQL and SQLite
    run as index ranges starting at it."""
    q = conn.q
    above = (f"FROM {q('queue_messages')} m WHERE m.{q('topic')} = o.{q('topic')} "
             f"AND m.{q('partition_key')} = o.{q('partition_key')} "
             f"AND m.{q('position')} > o.{q('offset_acked')}")
    nth = (f"(SELECT m.{q('position')} {above} ORDER BY m.{q('position')} "
           f"LIMIT 1 OFFSET {int(sample) - 1})")
    conditions = " AND ".join(f"o.{q(column)} = %s" for column in where)
    return conn.fetch_all(
        f"SELECT o.{q('topic')}, o.{q('consumer_group')}, o.{q('partition_key')}, {nth}, "  # noqa: S608 - names quoted, values bound
        f"(SELECT COUNT(*) {above} AND m.{q('position')} <= COALESCE({nth}, %s)), "
        f"(SELECT MIN(m.{q('position')}) {above}), "
        f"(SELECT MAX(m.{q('position')}) FROM {q('queue_messages')} m "
        f"WHERE m.{q('topic')} = o.{q('topic')} AND m.{q('partition_key')} = o.{q('partition_key')}), "
        f"(SELECT m.{q('deliver_at')} {above} ORDER BY m.{q('position')} LIMIT 1) "
        f"FROM {q('queue_offsets')} o{' WHERE ' + conditions if conditions else ''}",
        [2**62, *where.values()],
    )


def _lag_rows_by_partition(conn: Connection, sample: int,
                           where: Mapping[str, str]) -> list[tuple[Any, ...]]:
    """The same rows from one branch per watermark, the watermark bound as a value:
    MariaDB/MySQL read a correlated ``position > o.offset_acked`` as an index lookup on
    (topic, partition) filtered row by row, a walk over every message of the partition
    still in the log, where a bound value makes it a range starting at the watermark."""
    marks = offsets.marks(conn, where)
    q = conn.q
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
        rows += conn.fetch_all(sqlb.union_all([branch] * len(batch)), params)
    return rows


def _parked_figures(conn: Connection, marks: Sequence[tuple[str, str, str]], cap: int,
                    now_ms: int | None) -> list[tuple[str, str, int, int | None]]:
    """Per (topic, group, partition) of ``marks``: the group's
    unacked parked messages counted up to ``cap``, and with ``now_ms`` the earliest due
    time (at most ``now_ms``) of those waiting for nothing but a worker. Ranges of the
    parked-row index, one query per 400 partitions (SQLite takes 500 terms)."""
    q = conn.q
    false = vendor.false_sql(conn)
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
        for topic, group, n, first_due in conn.fetch_all(
                sqlb.union_all([branch] * len(batch)), params):
            if int(n) or first_due is not None:
                figures.append((topic, group, int(n), None if first_due is None else int(first_due)))
    return figures


def unconsumed_counts(conn: Connection, topic: str, groups: Sequence[str]) -> dict[str, int]:
    """Per group, how many of the topic's sequenced messages lie above the group's
    watermark of their partition (0 where it has no watermark yet), or wait parked
    below it (delayed, or backing off before a retry)."""
    q = conn.q
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
        f"AND {q('acked')} = {vendor.false_sql(conn)}"
    )
    return {group: int(conn.fetch_all(sql, [group, topic])[0][0])
            + int(conn.fetch_all(parked, [group, topic])[0][0])
            for group in groups}
