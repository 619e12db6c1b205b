"""SQL for ``queue_archive``: the archive job's progress (written by the Spark job, read by
its next run and by the worker's GC, through :class:`django_sqlqueue.models.ArchiveMark`)."""

from __future__ import annotations

from .connection import Connection


def marks(conn: Connection, topic: str) -> dict[str, int]:
    """Per partition of ``topic``, the position its messages are archived up to."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('partition_key')}, {q('archived_position')} FROM {q('queue_archive')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} = %s",
        [topic],
    )
    return {str(r[0]): int(r[1]) for r in rows}


def pending_runs(conn: Connection) -> list[str]:
    """Exports whose files were being moved into place when their job stopped."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT DISTINCT {q('pending_run')} FROM {q('queue_archive')} WHERE {q('pending_run')} <> ''"  # noqa: S608 - names quoted, values bound
    )
    return sorted(str(r[0]) for r in rows)


def set_pending(conn: Connection, topic: str, ends: dict[str, int], run: str) -> None:
    """Note that ``run`` is moving the files of each partition up to ``ends`` into place."""
    q = conn.q
    now = conn.now_ms_sql()
    prefix, suffix = conn.insert_ignore(("topic", "partition_key"))
    for partition, end in ends.items():
        conn.execute(
            f"{prefix} {q('queue_archive')} ({q('topic')}, {q('partition_key')}, "
            f"{q('archived_position')}, {q('pending_position')}, {q('pending_run')}, "
            f"{q('updated_at')}) VALUES (%s, %s, 0, 0, '', {now}){suffix}",
            [topic, partition],
        )
        conn.execute(
            f"UPDATE {q('queue_archive')} SET {q('pending_position')} = %s, "  # noqa: S608 - names quoted, values bound
            f"{q('pending_run')} = %s, {q('updated_at')} = {now} "
            f"WHERE {q('topic')} = %s AND {q('partition_key')} = %s",
            [end, run, topic, partition],
        )


def finish(conn: Connection, run: str) -> None:
    """``run``'s files are all in place: its partitions are archived up to their ends."""
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_archive')} SET {q('archived_position')} = {q('pending_position')}, "  # noqa: S608 - names quoted, values bound
        f"{q('pending_run')} = '', {q('updated_at')} = {conn.now_ms_sql()} "
        f"WHERE {q('pending_run')} = %s",
        [run],
    )


def abandon(conn: Connection, run: str) -> None:
    """Forget ``run``'s pending ends (its files were removed)."""
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_archive')} SET {q('pending_position')} = 0, {q('pending_run')} = '' "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('pending_run')} = %s",
        [run],
    )

