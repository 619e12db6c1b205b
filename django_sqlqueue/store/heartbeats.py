"""SQL for ``queue_subscriber_heartbeats`` on a plain connection: a stream's sign of life."""

from __future__ import annotations

from .connection import Connection


def beat(conn: Connection, group: str, topic: str, name: str) -> None:
    """Insert or refresh the heartbeat of subscriber ``name`` of ``group`` on ``topic``."""
    q = conn.q
    now = conn.now_ms_sql()
    columns = (f"{q('consumer_group')}, {q('topic')}, {q('subscriber_name')}, "
               f"{q('heartbeat_at')}, {q('deregistered_at')}")
    if conn.vendor == "mysql":
        tail = f" ON DUPLICATE KEY UPDATE {q('heartbeat_at')} = {now}, {q('deregistered_at')} = 0"
    else:
        tail = (f" ON CONFLICT ({q('consumer_group')}, {q('topic')}, {q('subscriber_name')}) "
                f"DO UPDATE SET {q('heartbeat_at')} = EXCLUDED.{q('heartbeat_at')}, "
                f"{q('deregistered_at')} = 0")
    conn.execute(
        f"INSERT INTO {q('queue_subscriber_heartbeats')} ({columns}) "  # noqa: S608 - names quoted, values bound
        f"VALUES (%s, %s, %s, {now}, 0){tail}",
        [group, topic, name[:255]],
    )


def deregister(conn: Connection, group: str, name: str) -> None:
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_subscriber_heartbeats')} SET {q('deregistered_at')} = {conn.now_ms_sql()} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('subscriber_name')} = %s",
        [group, name[:255]],
    )


def live_others(conn: Connection, group: str, topic: str, prefix: str, alive_ms: int) -> list[str]:
    """Names of live subscribers of ``group`` on ``topic`` whose name does not start with
    ``prefix``: runqueueworker processes, which must not share a group with a stream."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('subscriber_name')} FROM {q('queue_subscriber_heartbeats')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('deregistered_at')} = 0 "
        f"AND {q('heartbeat_at')} > {conn.now_ms_sql()} - %s",
        [group, topic, alive_ms],
    )
    return [r[0] for r in rows if not str(r[0]).startswith(prefix)]
