"""SQL for ``queue_offsets``: a consumer group's watermark and read cursor per partition.

The worker runs it on its Django connection (through
:class:`django_sqlqueue.models.ConsumerOffset`), a Spark stream on a plain one: a stream's
group registers and advances here exactly as a subscriber's does, so GC waits for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..db import sql as sqlb
from .connection import Connection


def ensure(conn: Connection, group: str, topic: str, partitions: Sequence[str],
           at: int = 0) -> None:
    """Register ``group`` for ``topic``: a watermark at ``at`` for partitions without one.

    From then on GC waits for the group's watermarks to pass a message.
    """
    q = conn.q
    prefix, suffix = conn.insert_ignore(("consumer_group", "topic", "partition_key"))
    now = conn.now_ms_sql()
    for batch in sqlb.chunks(list(partitions), 500):
        conn.execute(
            f"{prefix} {q('queue_offsets')} ({q('consumer_group')}, {q('topic')}, "
            f"{q('partition_key')}, {q('offset_acked')}, {q('offset_fetched')}, {q('updated_at')}) "
            f"VALUES {', '.join([f'(%s, %s, %s, %s, %s, {now})'] * len(batch))}{suffix}",
            [v for partition in batch for v in (group, topic, partition, at, at)],
        )


def watermarks(conn: Connection, group: str, topic: str) -> dict[str, int]:
    """The group's watermark (a position) per partition of ``topic``."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('partition_key')}, {q('offset_acked')} FROM {q('queue_offsets')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s",
        [group, topic],
    )
    return {str(r[0]): int(r[1]) for r in rows}


def save_progress(conn: Connection, group: str, topic: str,
                  progress: Mapping[str, tuple[int, int]], now_ms: int | None = None) -> int:
    """Move each partition's (watermark, read cursor) forward to ``progress``, never back,
    in one statement; ``updated_at`` is ``now_ms`` (the database clock when not given)."""
    if not progress:
        return 0
    q = conn.q
    cases = " ".join(["WHEN %s THEN %s"] * len(progress))
    case = f"CASE {q('partition_key')} {cases} END"
    acked: list[object] = [v for p, (mark, _) in progress.items() for v in (p, mark)]
    fetched: list[object] = [v for p, (_, cursor) in progress.items() for v in (p, cursor)]
    now, now_params = (conn.now_ms_sql(), []) if now_ms is None else ("%s", [now_ms])
    return conn.execute(
        f"UPDATE {sqlb.locked_table(conn, 'queue_offsets')} SET "  # noqa: S608 - names quoted, values bound
        f"{q('offset_acked')} = CASE WHEN {q('offset_acked')} < {case} THEN {case} "
        f"ELSE {q('offset_acked')} END, "
        f"{q('offset_fetched')} = CASE WHEN {q('offset_fetched')} < {case} THEN {case} "
        f"ELSE {q('offset_fetched')} END, "
        f"{q('updated_at')} = {now} WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
        f"AND {q('partition_key')} IN ({sqlb.placeholders(len(progress))})",
        [*acked, *acked, *fetched, *fetched, *now_params, group, topic, *progress],
    )


def advance(conn: Connection, group: str, topic: str, marks: Mapping[str, int]) -> int:
    """Move the group's watermarks and read cursors forward to ``marks``, never back: a
    stream has read exactly what it has committed."""
    return save_progress(conn, group, topic, {p: (mark, mark) for p, mark in marks.items()})


def touch(conn: Connection, group: str, topic: str) -> None:
    """Mark the group as alive for GROUP_RETENTION without moving a watermark."""
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_offsets')} SET {q('updated_at')} = {conn.now_ms_sql()} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s",
        [group, topic],
    )


def registered(conn: Connection, topic: str) -> list[str]:
    """The consumer groups with watermarks of ``topic``."""
    q = conn.q
    return sorted(str(r[0]) for r in conn.fetch_all(
        f"SELECT DISTINCT {q('consumer_group')} FROM {q('queue_offsets')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} = %s", [topic]))


def gc_horizons(conn: Connection, topic: str,
                groups: Sequence[str] | None = None) -> dict[str, int]:
    """Per partition of ``topic``, the lowest watermark over ``groups`` (every registered
    group when None): GC may delete the partition's messages at or below it. Partitions
    some group has no watermark for, or whose lowest watermark is 0, are left out."""
    if groups is None:
        groups = registered(conn, topic)
    if not groups:
        return {}
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('partition_key')}, MIN({q('offset_acked')}), COUNT(*) FROM {q('queue_offsets')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} = %s AND {q('consumer_group')} IN ({sqlb.placeholders(len(groups))}) "
        f"GROUP BY {q('partition_key')}",
        [topic, *groups],
    )
    return {str(r[0]): int(r[1]) for r in rows if int(r[2]) == len(groups) and int(r[1]) > 0}


def marks(conn: Connection, where: Mapping[str, str]) -> list[tuple[Any, ...]]:
    """(topic, group, partition, watermark) of every watermark row, or of those whose
    columns have the values of ``where`` (``topic``, ``consumer_group``)."""
    q = conn.q
    conditions = " AND ".join(f"{q(column)} = %s" for column in where)
    return conn.fetch_all(
        f"SELECT {q('topic')}, {q('consumer_group')}, {q('partition_key')}, {q('offset_acked')} "  # noqa: S608 - names quoted, values bound
        f"FROM {q('queue_offsets')}{' WHERE ' + conditions if conditions else ''}",
        list(where.values()),
    )
