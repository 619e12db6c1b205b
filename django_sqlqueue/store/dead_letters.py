"""SQL for the dead-letter copies in ``queue_messages``: copy, select, count, replay, discard.

A dead letter is a row of a dead-letter topic (``<topic><DLQ_SUFFIX>``) with a
``consumer_group``: the copy a worker made (:func:`copy`) when that group gave up on the
message. Its own offset is its id here. The worker, the operations and the Spark archive
job all read and write dead letters through this module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..db import sql as sqlb
from ..db import vendor
from ..limits import storable_error
from ..replays import DEAD_LETTER_HEADER, GROUP_HEADER, ORIGINAL_ID_HEADER, ORIGINAL_OFFSET_HEADER
from .connection import Connection
from .messages import IDEMPOTENCY_COLUMNS, INSERT_COLUMNS

REPLAY_ID_PREFIX = "replay:"  # a replay's own id: "replay:<dead letter offset>", unique
DEAD_LETTER_COLUMNS = (*INSERT_COLUMNS, "original_id")  # written by a copy and by a replay


@dataclass(frozen=True)
class Selection:
    """Which dead letters, in SQL terms: every condition must hold."""

    dead_letter_topics: tuple[str, ...]
    offsets: tuple[int, ...] = ()  # empty: any
    group: str | None = None
    failed_before_ms: int | None = None
    error_contains: str | None = None


class DeadLetterRef(NamedTuple):
    offset: int
    topic: str  # the dead-letter topic
    partition: str
    group: str  # the consumer group that gave up on it
    original_topic: str
    original_id: str  # the id the original was published with


def _where(conn: Connection, selection: Selection, topic: str) -> tuple[str, list[Any]]:
    q = conn.q
    terms = [f"{q('topic')} = %s", f"{q('consumer_group')} <> ''"]
    params: list[Any] = [topic]
    if selection.offsets:
        terms.append(f"{q('offset')} IN ({sqlb.placeholders(len(selection.offsets))})")
        params += list(selection.offsets)
    if selection.group is not None:
        terms.append(f"{q('consumer_group')} = %s")
        params.append(selection.group)
    if selection.failed_before_ms is not None:
        terms.append(f"{q('failed_at')} < %s")
        params.append(selection.failed_before_ms)
    if selection.error_contains:
        # '!' escapes LIKE's wildcards: the one escape character every backend reads the
        # same way (a backslash means different things in MySQL and PostgreSQL literals).
        pattern = "%" + "".join("!" + c if c in "!%_" else c
                                for c in selection.error_contains.lower()) + "%"
        terms.append(f"LOWER({q('last_error')}) LIKE %s ESCAPE '!'")
        params.append(pattern)
    return " AND ".join(terms), params


def page(conn: Connection, selection: Selection, after: tuple[str, str, int] | None,
         limit: int) -> list[DeadLetterRef]:
    """Up to ``limit`` selected dead letters after ``after`` = (topic, partition, offset),
    in (topic, partition, offset) order: the order of the log's partition index, so each
    page is an index range, not a sort of the whole selection."""
    q = conn.q
    result: list[DeadLetterRef] = []
    for topic in sorted(selection.dead_letter_topics):
        if after is not None and topic < after[0]:
            continue
        where, params = _where(conn, selection, topic)
        if after is not None and topic == after[0]:
            where += (f" AND ({q('partition_key')} > %s OR ({q('partition_key')} = %s "
                      f"AND {q('offset')} > %s))")
            params += [after[1], after[1], after[2]]
        rows = conn.fetch_all(
            f"SELECT {q('offset')}, {q('topic')}, {q('partition_key')}, {q('consumer_group')}, "  # noqa: S608 - names quoted, values bound
            f"{q('original_topic')}, {q('original_id')} FROM {q('queue_messages')} WHERE {where} "
            f"ORDER BY {q('partition_key')}, {q('offset')} LIMIT %s",
            [*params, limit - len(result)],
        )
        result += [DeadLetterRef(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]
        if len(result) >= limit:
            break
    return result


def count(conn: Connection, selection: Selection, cap: int | None = None) -> int:
    """How many dead letters the selection matches (at most ``cap``)."""
    q = conn.q
    total = 0
    for topic in selection.dead_letter_topics:
        where, params = _where(conn, selection, topic)
        limit = "" if cap is None else " LIMIT %s"
        rows = conn.fetch_all(
            f"SELECT COUNT(*) FROM (SELECT 1 AS one FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {where}{limit}) AS n",
            params + ([] if cap is None else [cap - total]),
        )
        total += int(rows[0][0])
        if cap is not None and total >= cap:
            return cap
    return total


def counts_by_group(conn: Connection, dead_letter_topics: Sequence[str], cap: int
                    ) -> dict[str, dict[str, int]]:
    """Per dead-letter topic, per consumer group, its dead letters, at most ``cap`` in all
    per topic (the overview). One query per 200 topics."""
    q = conn.q
    branch = (
        f"SELECT t, g, COUNT(*) AS n FROM (SELECT {q('topic')} AS t, {q('consumer_group')} AS g "  # noqa: S608 - names quoted, values bound
        f"FROM {q('queue_messages')} WHERE {q('topic')} = %s AND {q('consumer_group')} <> '' "
        f"LIMIT %s) AS n GROUP BY t, g"
    )
    counts: dict[str, dict[str, int]] = {topic: {} for topic in dead_letter_topics}
    for batch in sqlb.chunks(list(dead_letter_topics)):
        params = [v for topic in batch for v in (topic, cap)]
        for topic, group, n in conn.fetch_all(sqlb.union_all([branch] * len(batch)),
                                              params):
            counts[topic][group] = int(n)
    return counts


def insert_replays(conn: Connection, offsets: Sequence[int]) -> int:
    """Append a replay of each dead letter to its original topic, built in the database
    from the dead-letter row (the original may be gone): same key, payload and
    ``published_at``, the headers plus the replay headers, due now. Idempotent: a replay
    already there (a repeated run) is skipped. Returns the rows inserted."""
    if not offsets:
        return 0
    q = conn.q
    now = conn.now_ms_sql()
    headers = vendor.json_with_strings_sql(conn, q("metadata"), {
        GROUP_HEADER: q("consumer_group"),
        ORIGINAL_ID_HEADER: q("original_id"),
        ORIGINAL_OFFSET_HEADER: vendor.text_sql(conn, q("original_offset")),
        DEAD_LETTER_HEADER: vendor.text_sql(conn, q("offset")),
    })
    replay_id = vendor.concat_sql(conn, f"'{REPLAY_ID_PREFIX}'",
                                  vendor.text_sql(conn, q("offset")))
    prefix, suffix = conn.insert_ignore(IDEMPOTENCY_COLUMNS)
    return conn.execute(
        f"{prefix} {q('queue_messages')} ({', '.join(q(c) for c in DEAD_LETTER_COLUMNS)}) "  # noqa: S608 - names quoted, values bound
        f"SELECT {q('original_topic')}, {q('message_key')}, '', {replay_id}, {q('payload')}, "
        f"{headers}, 0, 0, '', '', 0, '', {now}, {q('published_at')}, {now}, '' "
        f"FROM {q('queue_messages')} WHERE {q('offset')} IN ({sqlb.placeholders(len(offsets))}) "
        f"AND {q('consumer_group')} <> ''{suffix}",
        list(offsets),
    )


# ---------------------------------------------------------------------- the copy


class DeadLetterSource(NamedTuple):
    """The message being dead-lettered, as its worker delivered it."""

    offset: int
    topic: str
    key: str
    id: str
    payload_json: str
    headers_json: str
    published_at_ms: int


def _without_replay_group(headers_json: str) -> str:
    headers = json.loads(headers_json)
    if isinstance(headers, dict) and GROUP_HEADER in headers:
        del headers[GROUP_HEADER]
        return json.dumps(headers)
    return headers_json


def copy(conn: Connection, original: DeadLetterSource, dlq_topic: str, group: str,
         attempts: int, error: str) -> int:
    """Append the dead-letter copy of message ``original`` for ``group``; the original
    stays. Returns the rows inserted (0: the copy was already there).

    The copy keeps the original's key (so the dead-letter topic keeps per-key order) and
    its id in ``original_id``; its own id is ``<group>:<offset>``, so each failing group
    gets its own entry and repeating the move after a crash is a no-op. It is copied
    from the log row; should GC have collected that row meanwhile (a group that
    registered while GC ran), it is written from the values the worker delivered, so a
    dead letter never goes missing.
    """
    q = conn.q
    now = conn.now_ms_sql()
    copy_id = f"{group}:{original.offset}"
    columns = ", ".join(q(c) for c in DEAD_LETTER_COLUMNS)
    prefix, suffix = conn.insert_ignore(IDEMPOTENCY_COLUMNS)
    # The copy of a replay that failed again is a plain message of the dead-letter
    # topic: without the replay's group header, which would make every other group
    # consuming that topic pass over it. Its original_id is the id the handler saw
    # (the first original's, not "replay:..."), so replaying it again keeps that id.
    headers = vendor.json_without_sql(conn, q("metadata"), GROUP_HEADER)
    inserted = conn.execute(
        f"{prefix} {q('queue_messages')} ({columns}) "  # noqa: S608 - names quoted, values bound
        f"SELECT %s, {q('message_key')}, '', %s, {q('payload')}, {headers}, {now}, %s, "
        f"%s, {q('topic')}, {q('offset')}, %s, {now}, {q('published_at')}, {now}, %s "
        f"FROM {q('queue_messages')} WHERE {q('offset')} = %s{suffix}",
        [dlq_topic, copy_id, attempts, storable_error(error), group, original.id,
         original.offset],
    )
    if inserted or conn.fetch_all(
            f"SELECT 1 FROM {q('queue_messages')} WHERE {q('topic')} = %s "  # noqa: S608 - names quoted, values bound
            f"AND {q('message_key')} = %s AND {q('id')} = %s",
            [dlq_topic, original.key, copy_id]):
        return inserted
    json_param = conn.json_param_sql()
    return conn.execute(
        f"{prefix} {q('queue_messages')} ({columns}) VALUES (%s, %s, '', %s, {json_param}, "
        f"{json_param}, {now}, %s, %s, %s, %s, %s, {now}, %s, {now}, %s){suffix}",
        [dlq_topic, original.key, copy_id, original.payload_json,
         _without_replay_group(original.headers_json),
         attempts, storable_error(error), original.topic, original.offset, group,
         original.published_at_ms, original.id],
    )


class Failure(NamedTuple):
    """A message being dead-lettered with how it failed: its copy's failure count and error."""

    original: DeadLetterSource
    attempts: int
    error: str


def copy_many(conn: Connection, failures: Sequence[Failure], dlq_topic: str, group: str
              ) -> int:
    """:func:`copy` for several messages of one topic in one statement (the copies are
    built in the database from the log rows, each with its own failure count, error and
    original id). Only where a log row is gone (GC collected it meanwhile) is that copy
    written on its own, from the values the worker delivered. Returns the rows inserted."""
    if len(failures) < 2:
        return sum(copy(conn, f.original, dlq_topic, group, f.attempts, f.error)
                   for f in failures)
    q = conn.q
    now = conn.now_ms_sql()
    columns = ", ".join(q(c) for c in DEAD_LETTER_COLUMNS)
    prefix, suffix = conn.insert_ignore(IDEMPOTENCY_COLUMNS)
    headers = vendor.json_without_sql(conn, q("metadata"), GROUP_HEADER)
    copy_id = vendor.concat_sql(conn, "%s", vendor.text_sql(conn, q("offset")))
    # PostgreSQL types a bare parameter in a CASE as text, which an integer column refuses.
    number = "CAST(%s AS INTEGER)" if conn.vendor == "postgresql" else "%s"
    attempts_sql = f"CASE {q('offset')} {' '.join([f'WHEN %s THEN {number}'] * len(failures))} END"
    cases = f"CASE {q('offset')} {' '.join(['WHEN %s THEN %s'] * len(failures))} END"
    params: list[Any] = [dlq_topic, f"{group}:"]
    for f in failures:
        params += [f.original.offset, f.attempts]
    for f in failures:
        params += [f.original.offset, storable_error(f.error)]
    params.append(group)
    for f in failures:
        params += [f.original.offset, f.original.id]
    offsets = [f.original.offset for f in failures]
    inserted = conn.execute(
        f"{prefix} {q('queue_messages')} ({columns}) "  # noqa: S608 - names quoted, values bound
        f"SELECT %s, {q('message_key')}, '', {copy_id}, {q('payload')}, {headers}, {now}, "
        f"{attempts_sql}, {cases}, {q('topic')}, {q('offset')}, %s, {now}, "
        f"{q('published_at')}, {now}, {cases} "
        f"FROM {q('queue_messages')} WHERE {q('offset')} IN ({sqlb.placeholders(len(offsets))})"
        f"{suffix}",
        [*params, *offsets],
    )
    if inserted == len(failures):
        return inserted
    # Some copies were there already (a repeated cycle) or their log row is gone: find
    # which are missing and write those one by one.
    present = {str(row[0]) for row in conn.fetch_all(
        f"SELECT {q('id')} FROM {q('queue_messages')} WHERE {q('topic')} = %s AND ("  # noqa: S608 - names quoted, values bound
        + " OR ".join([f"({q('message_key')} = %s AND {q('id')} = %s)"] * len(failures)) + ")",
        [dlq_topic, *(v for f in failures for v in (f.original.key, f"{group}:{f.original.offset}"))],
    )}
    return inserted + sum(copy(conn, f.original, dlq_topic, group, f.attempts, f.error)
                          for f in failures if f"{group}:{f.original.offset}" not in present)


def by_group(conn: Connection, topic: str) -> dict[str, int]:
    """How many dead-letter copies of ``topic``'s messages each group made (in the log now)."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('consumer_group')}, COUNT(*) FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('original_topic')} = %s AND {q('consumer_group')} <> '' "
        f"GROUP BY {q('consumer_group')}",
        [topic],
    )
    return {str(r[0]): int(r[1]) for r in rows}
