"""SQL for ``queue_topics``: record partition counts, read them, change one.

The worker runs it on its Django connection (through :class:`django_sqlqueue.models.Topic`),
a Spark driver on a plain one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..db import vendor as db_vendor
from .connection import Connection


def partition_counts(conn: Connection, topics: Sequence[str]) -> dict[str, int]:
    """The recorded partition count of each of ``topics`` that has one."""
    if not topics:
        return {}
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('topic')}, {q('partitions')} FROM {q('queue_topics')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} IN ({', '.join(['%s'] * len(topics))})",
        list(topics),
    )
    return {r[0]: int(r[1]) for r in rows}


def lock(conn: Connection, topic: str, *, shared: bool) -> bool:
    """Lock the topic's row until the transaction ends (shared or exclusive); False when
    it has none. Cancelling a message for all groups takes it exclusively, a group
    registering for the topic shares it, so one of them sees the other's work."""
    q = conn.q
    tail = db_vendor.for_share_sql(conn) if shared else db_vendor.for_update_sql(conn)
    return bool(conn.fetch_all(
        f"SELECT 1 FROM {q('queue_topics')} WHERE {q('topic')} = %s{tail}",  # noqa: S608 - names quoted, values bound
        [topic],
    ))


def unrecorded(conn: Connection, topics: Sequence[str]) -> list[str]:
    """Those of ``topics`` with no recorded partition count, sorted: the sequencer cannot
    position their messages (it leaves them waiting and goes on with other topics)."""
    counts = partition_counts(conn, topics)
    return sorted(set(topics) - set(counts))


def unrecorded_error(topics: Sequence[str]) -> str:
    """One line saying that ``topics`` have no partition count, and how to give them one."""
    names = ", ".join(repr(t) for t in topics)
    return (f"topic(s) {names} have no recorded partition count, so their messages cannot be "
            "sequenced: name them in SQLQUEUE['TOPICS'] and run migrate, start a "
            "runqueueworker for them once, or write to them with .option(\"partitions\", N)")


def record(conn: Connection, configured: Mapping[str, int]) -> dict[str, int]:
    """Record ``configured`` counts for topics that have none yet; return every one of
    those topics' recorded count.

    An existing record wins over the caller's count: changing a topic's count is a
    deliberate step (see :func:`django_sqlqueue.repartition.repartition`).
    """
    recorded = partition_counts(conn, list(configured))
    missing = {topic: count for topic, count in configured.items() if topic not in recorded}
    if missing:
        q = conn.q
        now = conn.now_ms_sql()
        prefix, suffix = conn.insert_ignore(["topic"])
        rows = ", ".join([f"(%s, %s, {now}, {now})"] * len(missing))
        conn.execute(
            f"{prefix} {q('queue_topics')} ({q('topic')}, {q('partitions')}, "
            f"{q('created_at')}, {q('updated_at')}) VALUES {rows}{suffix}",
            [v for item in sorted(missing.items()) for v in item],
        )
        recorded.update(partition_counts(conn, list(missing)))
    return recorded


def set_partitions(conn: Connection, topic: str, partitions: int) -> None:
    """Change ``topic``'s recorded count (repartitioning, under the sequencer's lock)."""
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_topics')} SET {q('partitions')} = %s, "  # noqa: S608 - names quoted, values bound
        f"{q('updated_at')} = {conn.now_ms_sql()} WHERE {q('topic')} = %s",
        [partitions, topic],
    )


def recorded_topics(conn: Connection) -> list[str]:
    """Every topic with a recorded partition count."""
    q = conn.q
    return sorted(str(r[0]) for r in conn.fetch_all(
        f"SELECT {q('topic')} FROM {q('queue_topics')}"))  # noqa: S608 - names quoted

