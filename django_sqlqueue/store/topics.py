"""SQL for ``queue_topics`` on a plain connection: recorded partition counts."""

from __future__ import annotations

from collections.abc import Sequence

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


def record(conn: Connection, topic: str, partitions: int) -> int:
    """Record ``partitions`` for ``topic`` unless it has a count; return the recorded one.

    An existing record wins, as it does for the worker (see
    :meth:`django_sqlqueue.models.topics.TopicManager.record`).
    """
    q = conn.q
    now = conn.now_ms_sql()
    prefix, suffix = conn.insert_ignore(["topic"])
    conn.execute(
        f"{prefix} {q('queue_topics')} ({q('topic')}, {q('partitions')}, {q('created_at')}, "
        f"{q('updated_at')}) VALUES (%s, %s, {now}, {now}){suffix}",
        [topic, partitions],
    )
    return partition_counts(conn, [topic])[topic]


def recorded_topics(conn: Connection) -> list[str]:
    """Every topic with a recorded partition count."""
    q = conn.q
    return sorted(str(r[0]) for r in conn.fetch_all(
        f"SELECT {q('topic')} FROM {q('queue_topics')}"))  # noqa: S608 - names quoted

