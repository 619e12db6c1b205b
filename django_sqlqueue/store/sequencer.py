"""The sequencer: gives committed messages their consumable position and their partition.

One implementation for every caller: the worker (through :mod:`django_sqlqueue.sequencing`,
on its Django connection) and a Spark driver (on a plain DB-API connection, without Django
settings). What differs between them is only where a new topic's partition count comes
from, so that is passed in (``counts_for``).

Any process may sequence; the counter row's lock (taken with SKIP LOCKED) makes one of them
do it at a time and lets the others carry on. A batch, in one transaction:

1. locks the counter row (or returns at once when another process holds it);
2. reads, in one plain (non-locking) statement, the oldest committed messages that have no
   position yet, in offset order, with their topics' recorded partition counts: one
   snapshot of the log;
3. locks those rows by key, skipping any that another transaction holds;
4. numbers the longest prefix of the snapshot that it holds, in offset order, from the
   counter on, and gives each message its partition from its topic's recorded count.

Why a snapshot first and locks second: a snapshot holds a transaction's messages all or
none, whatever commits while it is read. A locking scan does not: InnoDB checks row locks
one row at a time, so ``... WHERE position IS NULL ORDER BY offset FOR UPDATE SKIP LOCKED``
skips the first rows of a transaction that is still open, takes its later rows if it
commits meanwhile, and would number them first. Numbering only a prefix of the snapshot
(stopping at the first row someone else holds) keeps every transaction's messages in
publish order on every backend; docs/data-model.md, "The order consumers see", states the
guarantee exactly.

PostgreSQL takes steps 1 and 2 in one statement, and 3 and 4 with the counter's move in
another (:mod:`.sequencer_statements`): three round trips fewer between a commit and its
handler, with the same prefix rule and a fallback to the steps above when the second
statement cannot number the whole snapshot.

A message of a topic with no partition count (the driver cannot record one: it has no
``SQLQUEUE`` settings) is left unsequenced and its topic is skipped, with a warning; the
other topics go on. Its messages keep their publish order among themselves: none of them
is numbered until the topic has a count.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NamedTuple

from django.db import DatabaseError

from ..partitioning import assign_partition
from . import sequencer_statements as statements
from . import topics
from .connection import Connection
from .sequencer_statements import Waiting

logger = logging.getLogger("django_sqlqueue.sequencer")

SEQUENCE_BATCH = 1000  # rows per sequencing transaction: short row locks, short lag
DEFAULT_SEQUENCER = "default"
WARN_EVERY = 60.0  # seconds between two warnings about one topic that cannot be partitioned

# (connection, topics) -> the partition count of each topic that has one.
CountsFor = Callable[[Connection, Sequence[str]], Mapping[str, int]]

_warned: dict[str, float] = {}  # topic -> time.monotonic() of its last warning


class Batch(NamedTuple):
    """What one sequencing transaction did."""

    positioned: int  # messages given a position
    last_position: int | None  # the log head now; None when another process sequences
    more: bool  # committed messages may still wait (a full batch, or one cut short)
    unpartitioned: frozenset[str]  # topics met without a partition count, left waiting
    # (topic, partition, highest position given) of each partition that got messages
    heads: tuple[tuple[str, str, int], ...] = ()


# ---------------------------------------------------------------------- the counter


def last_position(conn: Connection, name: str = DEFAULT_SEQUENCER) -> int:
    """The highest position handed out: every position up to it belongs to a committed
    message (or to one collected since)."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('last_position')} FROM {q('queue_sequencer')} WHERE {q('name')} = %s",  # noqa: S608 - names quoted, values bound
        [name],
    )
    return int(rows[0][0]) if rows else 0


def lock_counter(conn: Connection, name: str = DEFAULT_SEQUENCER, *,
                 wait: bool = False) -> int | None:
    """Lock the counter row and return its last position; None if another process holds it.

    Must run inside a transaction. SKIP LOCKED makes a busy sequencer someone else's job
    instead of a queue of waiting workers. With ``wait``, waits for that process instead
    (within the session's lock timeout): for a caller with nothing else to do but read
    what is being sequenced.
    """
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('last_position')} FROM {q('queue_sequencer')} WHERE {q('name')} = %s"  # noqa: S608 - names quoted, values bound
        + (conn.for_update_sql() if wait else conn.skip_locked_sql()),
        [name],
    )
    if rows:
        return int(rows[0][0])
    return _unlocked_counter(conn, name)


def _unlocked_counter(conn: Connection, name: str) -> int | None:
    """After a skipping lock found no row: 0 when the row was missing and this call
    inserted it (locked, ours); None when another process holds it."""
    if _committed_last(conn, name) is not None:
        return None
    # Inserted: the new row is ours and locked. Not inserted: it exists and is locked.
    return 0 if create_counter(conn, name) else None


def _committed_last(conn: Connection, name: str) -> int | None:
    """The counter's last committed position, read without locking (an INSERT of an
    existing, locked key would wait for its holder after all); None when it is missing."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('last_position')} FROM {q('queue_sequencer')} WHERE {q('name')} = %s",  # noqa: S608 - names quoted, values bound
        [name],
    )
    return int(rows[0][0]) if rows else None


def wait_for_counter(conn: Connection, name: str = DEFAULT_SEQUENCER) -> int:
    """Wait until no other process holds the counter row, then return its last position.

    Must run in autocommit: the statement's lock ends with the statement, so the caller
    only waits for the holder's commit and never holds the row itself.
    """
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('last_position')} FROM {q('queue_sequencer')} WHERE {q('name')} = %s"  # noqa: S608 - names quoted, values bound
        + conn.for_update_sql(),
        [name],
    )
    return int(rows[0][0]) if rows else 0


def create_counter(conn: Connection, name: str = DEFAULT_SEQUENCER) -> bool:
    """Insert the counter row unless it exists; True when this call inserted it."""
    q = conn.q
    prefix, suffix = conn.insert_ignore(["name"])
    return conn.execute(
        f"{prefix} {q('queue_sequencer')} ({q('name')}, {q('last_position')}, "
        f"{q('sequenced_by')}, {q('sequenced_at')}) VALUES (%s, 0, '', 0){suffix}",
        [name],
    ) == 1


def advance(conn: Connection, last: int, sequenced_by: str,
            name: str = DEFAULT_SEQUENCER) -> None:
    """Move the counter to ``last`` and record who sequenced, when (database clock)."""
    q = conn.q
    conn.execute(
        f"UPDATE {q('queue_sequencer')} SET {q('last_position')} = %s, "  # noqa: S608 - names quoted, values bound
        f"{q('sequenced_by')} = %s, {q('sequenced_at')} = {conn.now_ms_sql()} "
        f"WHERE {q('name')} = %s",
        [last, sequenced_by[:255], name],
    )


def head(conn: Connection, name: str = DEFAULT_SEQUENCER,
         extra_sql: str = "0") -> tuple[int, bool, int, int]:
    """(last position, whether unsequenced messages wait, database time in ms, the value
    of the scalar subquery ``extra_sql``): an idle worker's whole poll, in one query."""
    q = conn.q
    pending = (
        f"(SELECT 1 FROM {q('queue_messages')} WHERE {q('position')} IS NULL "  # noqa: S608 - names quoted, values bound
        f"LIMIT 1)"
    )
    rows = conn.fetch_all(
        f"SELECT (SELECT {q('last_position')} FROM {q('queue_sequencer')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('name')} = %s), {pending}, {conn.now_ms_sql()}, {extra_sql}",
        [name],
    )
    if not rows:  # a SELECT without FROM always returns its one row
        raise DatabaseError("the sequencer's head query returned no row")
    row = rows[0]
    return int(row[0] or 0), row[1] is not None, int(row[2]), int(row[3] or 0)


# ---------------------------------------------------------------------- sequencing


def recorded_counts(conn: Connection, names: Sequence[str]) -> Mapping[str, int]:
    """The recorded partition counts only: what a process without settings can use."""
    return topics.partition_counts(conn, names)


class _Raced(Exception):
    """A one-statement numbering found its snapshot overtaken; it changed nothing."""


class _Busy(NamedTuple):
    """Another process holds the counter; ``before`` is its last committed position."""

    before: int


def sequence_batch(conn: Connection, sequenced_by: str = "", *,
                   counts_for: CountsFor = recorded_counts, limit: int = SEQUENCE_BATCH,
                   skip_topics: Collection[str] = (), wait: bool = False) -> Batch:
    """Position up to ``limit`` committed messages in one transaction (see the module
    docstring); messages of ``skip_topics`` are passed over.

    With ``wait``, a busy sequencer is waited for (see :func:`lock_counter`). On a
    connection in autocommit that wait comes after this transaction, for the holder's
    commit alone: when the holder moved the counter, the batch positions nothing here and
    returns the head the holder left (the holder goes on with what it left); when it moved
    nothing, the batch is taken here. Elsewhere the holder is waited for inside the
    transaction, and what it left is sequenced here.

    On PostgreSQL the batch takes two statements: the counter locked with the messages
    read, then the rows locked and numbered with the counter moved. When a sequencer
    committed between that read's snapshot and its lock, the second statement changes
    nothing and the batch is taken again statement by statement.
    """
    wait_alone = wait and conn.vendor != "sqlite" and conn.autocommits()
    batch = functools.partial(_sequence, conn, sequenced_by, counts_for=counts_for,
                              limit=limit, skip_topics=skip_topics,
                              wait_inside=wait and not wait_alone)
    try:
        done = batch(fast=conn.vendor == "postgresql")
    except _Raced:
        done = batch(fast=False)
    if not isinstance(done, _Busy):
        return done
    if not wait_alone:
        return Batch(0, None, True, frozenset())
    after = wait_for_counter(conn)
    if after != done.before:  # the holder sequenced: its head is what this caller wanted
        return Batch(0, after, False, frozenset())
    # The holder moved nothing (an operator's repartition, say): sequence here after all.
    return sequence_batch(conn, sequenced_by, counts_for=counts_for, limit=limit,
                          skip_topics=skip_topics)


def _open(conn: Connection, limit: int, skip_topics: Collection[str], *, fast: bool,
          wait_inside: bool) -> tuple[int, list[Waiting]] | _Busy:
    """Lock the counter and read what waits, or say who holds the counter."""
    if fast and not wait_inside:
        if opened := statements.lock_and_read(conn, DEFAULT_SEQUENCER, limit, skip_topics):
            return opened
        # Held by another process, or missing: one plain read tells which.
        if (committed := _committed_last(conn, DEFAULT_SEQUENCER)) is not None:
            return _Busy(committed)
        if not create_counter(conn):
            return _Busy(0)  # created meanwhile, and held, by another process
        return 0, statements.committed_unsequenced(conn, limit, skip_topics)
    last = lock_counter(conn, wait=wait_inside)
    if last is None:
        return _Busy(last_position(conn))
    return last, statements.committed_unsequenced(conn, limit, skip_topics)


def _sequence(conn: Connection, sequenced_by: str, *, counts_for: CountsFor, limit: int,
              skip_topics: Collection[str], fast: bool, wait_inside: bool) -> Batch | _Busy:
    with conn.atomic():
        opened = _open(conn, limit, skip_topics, fast=fast, wait_inside=wait_inside)
        if isinstance(opened, _Busy):
            return opened
        last, waiting = opened
        if not waiting:
            return Batch(0, last, False, frozenset())
        # Recorded counts came with the rows: only a topic met for the first time asks.
        counts = {row.topic: row.partitions for row in waiting if row.partitions is not None}
        unrecorded = sorted({row.topic for row in waiting if row.partitions is None})
        if unrecorded:
            counts.update(counts_for(conn, unrecorded))
        unpartitioned = frozenset(row.topic for row in waiting if row.topic not in counts)
        wanted = [row for row in waiting if row.topic in counts]
        if fast:
            assignments = _numbered(wanted, {row.offset for row in wanted}, last, counts)
            if assignments and not statements.number_and_advance(conn, assignments, last, sequenced_by,
                                                       DEFAULT_SEQUENCER):
                raise _Raced
        else:
            held = statements.lock_rows(conn, [row.offset for row in wanted])
            assignments = _numbered(wanted, held, last, counts)
            if assignments:
                statements.assign_positions(conn, assignments)
                advance(conn, last + len(assignments), sequenced_by)
    _warn_unpartitioned(unpartitioned)
    more = len(waiting) == limit or len(assignments) < len(wanted)
    heads: dict[tuple[str, str], int] = {}
    for row, (_, position, partition) in zip(wanted, assignments, strict=False):
        heads[(row.topic, partition)] = position  # ascending: the last one is the highest
    return Batch(len(assignments), last + len(assignments), more, unpartitioned,
                 tuple((topic, partition, position)
                       for (topic, partition), position in heads.items()))


def _numbered(wanted: Sequence[Waiting], held: Collection[int], last: int,
              counts: Mapping[str, int]) -> list[tuple[int, int, str]]:
    """(offset, position, partition) for the longest prefix of ``wanted`` that is held."""
    assignments: list[tuple[int, int, str]] = []
    for row in wanted:
        if row.offset not in held:
            # Another transaction holds it (briefly: publishers never lock a committed
            # message). Numbering what follows would put it after later messages of
            # its own transaction: stop here, the next batch goes on from it.
            break
        assignments.append((row.offset, last + 1 + len(assignments),
                            assign_partition(row.key, row.offset, counts[row.topic])))
    return assignments


def sequence_all(conn: Connection, sequenced_by: str = "", *,
                 counts_for: CountsFor = recorded_counts,
                 max_batches: int | None = None) -> Batch:
    """Sequence until nothing that can be positioned waits (at most ``max_batches``
    batches); return the totals, with every topic left waiting for a partition count.

    Stops early when a batch can position nothing (its first message is held by another
    transaction): the next call goes on from there.
    """
    positioned = 0
    skipped: frozenset[str] = frozenset()
    batches = 0
    while True:
        batch = sequence_batch(conn, sequenced_by, counts_for=counts_for, skip_topics=skipped)
        batches += 1
        positioned += batch.positioned
        skipped |= batch.unpartitioned
        stalled = batch.positioned == 0 and not batch.unpartitioned
        if (batch.last_position is None or not batch.more or stalled
                or (max_batches is not None and batches >= max_batches)):
            return Batch(positioned, batch.last_position, batch.more, skipped)


def _warn_unpartitioned(names: frozenset[str]) -> None:
    now = time.monotonic()
    for topic in sorted(names):
        if now - _warned.get(topic, -WARN_EVERY) >= WARN_EVERY:
            _warned[topic] = now
            logger.warning(
                "messages of topic=%s wait unsequenced: it has no recorded partition count "
                "(name it in SQLQUEUE['TOPICS'] and run migrate, or start a runqueueworker "
                "once); other topics are sequenced meanwhile", topic)
