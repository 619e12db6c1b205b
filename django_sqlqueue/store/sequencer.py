"""The sequencer on a plain connection: the worker's sequencing, for a Spark driver.

A stream positions what it reads: a topic that only Spark reads has no worker to do it.
It is :func:`django_sqlqueue.sequencing.sequence_batch` step for step (the counter row
locked with SKIP LOCKED, committed rows in offset order, partitions from the recorded
counts), with one difference: it has no ``SQLQUEUE`` settings to record a new topic's
count from, so it stops before the first message of a topic with no recorded count and
leaves the rest to a worker (or to a later call, once the topic is recorded).
"""

from __future__ import annotations

from ..partitioning import assign_partition
from . import messages, topics
from .connection import Connection

SEQUENCE_BATCH = 1000  # rows per sequencing transaction, as the worker's
DEFAULT_SEQUENCER = "default"


def last_position(conn: Connection) -> int:
    """The highest position handed out: every position up to it belongs to a committed
    message (or to one collected since)."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('last_position')} FROM {q('queue_sequencer')} WHERE {q('name')} = %s",  # noqa: S608 - names quoted, values bound
        [DEFAULT_SEQUENCER],
    )
    return int(rows[0][0]) if rows else 0


def _lock_counter(conn: Connection) -> int | None:
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('last_position')} FROM {q('queue_sequencer')} WHERE {q('name')} = %s"  # noqa: S608 - names quoted, values bound
        + conn.skip_locked_sql(),
        [DEFAULT_SEQUENCER],
    )
    if rows:
        return int(rows[0][0])
    if conn.fetch_all(f"SELECT 1 FROM {q('queue_sequencer')} WHERE {q('name')} = %s",  # noqa: S608 - names quoted, values bound
                      [DEFAULT_SEQUENCER]):
        return None  # a worker is sequencing right now
    prefix, suffix = conn.insert_ignore(["name"])
    inserted = conn.execute(
        f"{prefix} {q('queue_sequencer')} ({q('name')}, {q('last_position')}, "
        f"{q('sequenced_by')}, {q('sequenced_at')}) VALUES (%s, 0, '', 0){suffix}",
        [DEFAULT_SEQUENCER],
    )
    return 0 if inserted == 1 else None


def sequence_batch(conn: Connection, sequenced_by: str,
                   limit: int = SEQUENCE_BATCH) -> tuple[int, set[str]]:
    """Position up to ``limit`` committed messages in one transaction.

    Returns (how many, the topics met that have no recorded partition count and so were
    left unsequenced). 0 when a worker holds the sequencer or nothing waits.
    """
    with conn.atomic():
        last = _lock_counter(conn)
        if last is None:
            return 0, set()
        rows = messages.unsequenced(conn, limit)
        if not rows:
            return 0, set()
        counts = topics.partition_counts(conn, sorted({topic for _, topic, _ in rows}))
        unknown = {topic for _, topic, _ in rows if topic not in counts}
        assignments: list[tuple[int, int, str]] = []
        for offset, topic, key in rows:
            if topic not in counts:
                break  # positions follow offset order: nothing after this row either
            assignments.append(
                (offset, last + 1 + len(assignments), assign_partition(key, offset, counts[topic])))
        if not assignments:
            return 0, unknown
        messages.assign_positions(conn, assignments)
        q = conn.q
        conn.execute(
            f"UPDATE {q('queue_sequencer')} SET {q('last_position')} = %s, "  # noqa: S608 - names quoted, values bound
            f"{q('sequenced_by')} = %s, {q('sequenced_at')} = {conn.now_ms_sql()} "
            f"WHERE {q('name')} = %s",
            [last + len(assignments), sequenced_by[:255], DEFAULT_SEQUENCER],
        )
    return len(assignments), unknown


def sequence_all(conn: Connection, sequenced_by: str, max_batches: int = 100) -> set[str]:
    """Sequence until nothing (sequenceable) is left, at most ``max_batches`` batches;
    return the unrecorded topics met."""
    unknown: set[str] = set()
    for _ in range(max_batches):
        count, missing = sequence_batch(conn, sequenced_by)
        unknown |= missing
        if count < SEQUENCE_BATCH:
            break
    return unknown
