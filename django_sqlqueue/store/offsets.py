"""SQL for ``queue_offsets`` on a plain connection: a Spark stream's consumer group."""

from __future__ import annotations

from collections.abc import Sequence

from .connection import Connection


def ensure(conn: Connection, group: str, topic: str, partitions: Sequence[str],
           at: int = 0) -> None:
    """Register ``group`` for ``topic``: a watermark at ``at`` for partitions without one.

    From then on GC waits for the group, as it waits for a subscriber's (see
    :meth:`django_sqlqueue.models.offsets.ConsumerOffsetManager.ensure`).
    """
    q = conn.q
    prefix, suffix = conn.insert_ignore(("consumer_group", "topic", "partition_key"))
    now = conn.now_ms_sql()
    for start in range(0, len(partitions), 500):
        batch = partitions[start:start + 500]
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


def advance(conn: Connection, group: str, topic: str, marks: dict[str, int]) -> int:
    """Move the group's watermarks (and read cursors) forward to ``marks``, never back."""
    if not marks:
        return 0
    q = conn.q
    cases = " ".join(["WHEN %s THEN %s"] * len(marks))
    case = f"CASE {q('partition_key')} {cases} END"
    params: list[object] = [v for item in marks.items() for v in item]
    return conn.execute(
        f"UPDATE {q('queue_offsets')} SET "  # noqa: S608 - names quoted, values bound
        f"{q('offset_acked')} = CASE WHEN {q('offset_acked')} < {case} THEN {case} "
        f"ELSE {q('offset_acked')} END, "
        f"{q('offset_fetched')} = CASE WHEN {q('offset_fetched')} < {case} THEN {case} "
        f"ELSE {q('offset_fetched')} END, "
        f"{q('updated_at')} = {conn.now_ms_sql()} "
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
        f"AND {q('partition_key')} IN ({', '.join(['%s'] * len(marks))})",
        [*params, *params, *params, *params, group, topic, *marks],
    )


def touch(conn: Connection, group: str, topic: str) -> None:
    """Mark the group as alive for GROUP_RETENTION without moving a watermark."""
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_offsets')} SET {q('updated_at')} = {conn.now_ms_sql()} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s",
        [group, topic],
    )


def gc_horizons(conn: Connection, topic: str) -> dict[str, int]:
    """Per partition of ``topic``, the lowest watermark of its registered groups: GC may
    delete every message of the partition at or below it."""
    q = conn.q
    groups = int(conn.fetch_all(
        f"SELECT COUNT(DISTINCT {q('consumer_group')}) FROM {q('queue_offsets')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} = %s", [topic])[0][0])
    if not groups:
        return {}
    rows = conn.fetch_all(
        f"SELECT {q('partition_key')}, MIN({q('offset_acked')}), COUNT(*) FROM {q('queue_offsets')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} = %s GROUP BY {q('partition_key')}",
        [topic],
    )
    return {str(r[0]): int(r[1]) for r in rows if int(r[2]) == groups}
