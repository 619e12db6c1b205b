"""The statements of a sequencing batch that read and number messages
(``queue_messages``); the counter's are in :mod:`.sequencer`, which runs the batch.

Two ways to number: statement by statement on every backend (read what waits, lock those
rows skipping held ones, number them), and on PostgreSQL in two statements, the counter
locked with the read and the rows locked and numbered with the counter moved. The two
take three statements fewer between a commit and its handler; the statement-by-statement way
stays for what the two-statement way cannot prove (see :func:`number_and_advance`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from ..db import arrays
from .connection import Connection


class Waiting(NamedTuple):
    """A committed message without a position, with its topic's recorded count."""

    offset: int
    topic: str
    key: str
    partitions: int | None  # the topic's recorded partition count, None when unrecorded


def committed_unsequenced(conn: Connection, limit: int,
                           skip_topics: Collection[str]) -> list[Waiting]:
    """The oldest committed messages without a position, in offset order, each with its
    topic's recorded partition count: one plain read, so one snapshot (the
    queue_msg_sequencing index, no sort; the count is a primary-key lookup per row, a
    subquery rather than a join so that it cannot change how the log is read)."""
    skip, params = _skip_sql(conn, skip_topics)
    rows = conn.fetch_all(_waiting_sql(conn, skip), [*params, limit])
    return [Waiting(int(r[0]), r[1], r[2], None if r[3] is None else int(r[3])) for r in rows]


def _skip_sql(conn: Connection, skip_topics: Collection[str]) -> tuple[str, list[Any]]:
    if not skip_topics:
        return "", []
    return (f" AND m.{conn.q('topic')} NOT IN ({', '.join(['%s'] * len(skip_topics))})",
            sorted(skip_topics))


def _waiting_sql(conn: Connection, skip: str) -> str:
    q = conn.q
    return (
        f"SELECT m.{q('offset')}, m.{q('topic')}, m.{q('message_key')}, "  # noqa: S608 - names quoted, values bound
        f"(SELECT t.{q('partitions')} FROM {q('queue_topics')} t WHERE t.{q('topic')} = m.{q('topic')}) "
        f"AS {q('partitions')} FROM {q('queue_messages')} m "
        f"WHERE m.{q('position')} IS NULL{skip} ORDER BY m.{q('offset')} LIMIT %s"
    )


def lock_and_read(conn: Connection, name: str, limit: int,
                   skip_topics: Collection[str]) -> tuple[int, list[Waiting]] | None:
    """PostgreSQL: lock the counter (skipping it when held) and read the unsequenced
    messages in one statement; None when the counter row was skipped or is missing.

    The messages are read in the statement's snapshot, which can be older than the
    counter's lock: a sequencer that committed in between leaves its rows looking
    unsequenced here. :func:`number_and_advance` finds that out and changes nothing."""
    q = conn.q
    skip, params = _skip_sql(conn, skip_topics)
    rows = conn.fetch_all(
        f"SELECT s.{q('last_position')}, w.* FROM (SELECT {q('last_position')} "  # noqa: S608 - names quoted, values bound
        f"FROM {q('queue_sequencer')} WHERE {q('name')} = %s{conn.skip_locked_sql()}) s "
        f"LEFT JOIN LATERAL ({_waiting_sql(conn, skip)}) w ON TRUE ORDER BY w.{q('offset')}",
        [name, *params, limit],
    )
    if not rows:
        return None
    return int(rows[0][0]), [Waiting(int(r[1]), r[2], r[3], None if r[4] is None else int(r[4]))
                             for r in rows if r[1] is not None]


def number_and_advance(conn: Connection, assignments: Sequence[tuple[int, int, str]],
                        last: int, sequenced_by: str, name: str) -> bool:
    """PostgreSQL: lock the rows, number them and move the counter, in one statement.

    False unless every row was still unsequenced and free (see :func:`lock_and_read`):
    the counter did not move, but rows it could lock were numbered, so the caller rolls
    the transaction back and numbers the careful way."""
    q = conn.q
    offsets = arrays.int_array([a[0] for a in assignments])
    # The numbers come as arrays joined by offset: a CASE with a branch per row would be
    # searched row by row, quadratic in the batch (30 ms for 1,000 rows).
    rows = conn.fetch_all(
        f"WITH given AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) "  # noqa: S608 - names quoted, values bound
        f"AS g(o, p, k)), "
        f"held AS (SELECT {q('offset')} FROM {q('queue_messages')} "
        f"WHERE {q('offset')} = ANY(%s::bigint[]) "
        f"AND {q('position')} IS NULL{conn.skip_locked_sql()}), "
        f"numbered AS (UPDATE {q('queue_messages')} m "
        f"SET {q('position')} = given.p, {q('partition_key')} = given.k "
        f"FROM held JOIN given ON given.o = held.{q('offset')} "
        f"WHERE m.{q('offset')} = held.{q('offset')} RETURNING 1) "
        f"UPDATE {q('queue_sequencer')} SET {q('last_position')} = %s, "
        f"{q('sequenced_by')} = %s, {q('sequenced_at')} = {conn.now_ms_sql()} "
        f"WHERE {q('name')} = %s AND (SELECT COUNT(*) FROM numbered) = %s RETURNING 1",
        [offsets, arrays.int_array([a[1] for a in assignments]),
         arrays.text_array([a[2] for a in assignments]), offsets,
         last + len(assignments), sequenced_by[:255], name, len(assignments)],
    )
    return bool(rows)


def lock_rows(conn: Connection, offsets: Sequence[int]) -> set[int]:
    """Lock the rows ``offsets`` by key, skipping those another transaction holds; return
    the offsets locked. SQLite has no row locks: its single writer (this transaction)
    holds them all."""
    if not offsets or not conn.skip_locked_sql():
        return set(offsets)
    q = conn.q
    table = q("queue_messages") + (" FORCE INDEX (PRIMARY)" if conn.vendor == "mysql" else "")
    rows = conn.fetch_all(
        f"SELECT {q('offset')} FROM {table} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('offset')} IN ({', '.join(['%s'] * len(offsets))}) "
        f"AND {q('position')} IS NULL" + conn.skip_locked_sql(),
        list(offsets),
    )
    return {int(r[0]) for r in rows}


def assign_positions(conn: Connection, assignments: Sequence[tuple[int, int, str]]) -> None:
    """Set (offset, position, partition) of sequenced rows in one statement."""
    q = conn.q
    if conn.vendor == "mysql" and conn.has_json_table:
        # The numbers as one JSON parameter joined by offset: a CASE with a branch per row
        # is searched row by row, and cost twice as much for a batch of 1,000. The join
        # reads the numbers first and each row by its key (STRAIGHT_JOIN, the primary
        # key): a multi-table UPDATE that scanned the log would wait for the lock of every
        # uncommitted row it passed, a publisher's open transaction included.
        conn.execute(
            f"UPDATE JSON_TABLE(%s, '$[*]' COLUMNS (o BIGINT PATH '$[0]', "  # noqa: S608 - names quoted, values bound
            f"p BIGINT PATH '$[1]', k VARCHAR(255) PATH '$[2]')) AS g "
            f"STRAIGHT_JOIN {q('queue_messages')} m FORCE INDEX (PRIMARY) "
            f"ON m.{q('offset')} = g.o SET m.{q('position')} = g.p, m.{q('partition_key')} = g.k",
            [json.dumps([list(a) for a in assignments], ensure_ascii=False)],
        )
        return
    cases = " ".join(["WHEN %s THEN %s"] * len(assignments))
    positions: list[Any] = []
    partitions: list[Any] = []
    for offset, position, partition in assignments:
        positions += [offset, position]
        partitions += [offset, partition]
    offsets = [a[0] for a in assignments]
    # MySQL: pinned to the primary key, so the UPDATE locks only the rows it names.
    table = q("queue_messages") + (" FORCE INDEX (PRIMARY)" if conn.vendor == "mysql" else "")
    conn.execute(
        f"UPDATE {table} SET {q('position')} = CASE {q('offset')} {cases} END, "  # noqa: S608 - names quoted, values bound
        f"{q('partition_key')} = CASE {q('offset')} {cases} END "
        f"WHERE {q('offset')} IN ({', '.join(['%s'] * len(offsets))})",
        positions + partitions + offsets,
    )
