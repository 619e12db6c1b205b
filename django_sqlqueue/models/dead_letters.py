"""SQL for the dead-letter copies in ``queue_messages``: select, count, replay, discard.

A dead letter is a row of a dead-letter topic (``<topic><DLQ_SUFFIX>``) with a
``consumer_group``: the copy a worker made when that group gave up on the message (see
``QueueMessageManager.copy_to_dead_letters``). Its own offset is its id here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import connections

from ..db import sql as sqlb
from ..db import vendor
from ..replays import DEAD_LETTER_HEADER, GROUP_HEADER, ORIGINAL_ID_HEADER, ORIGINAL_OFFSET_HEADER
from .messages import IDEMPOTENCY_COLUMNS

REPLAY_ID_PREFIX = "replay:"  # a replay's own id: "replay:<dead letter offset>", unique


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


def _where(connection: Any, selection: Selection, topic: str) -> tuple[str, list[Any]]:
    q = sqlb.quoter(connection)
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


def page(selection: Selection, after: tuple[str, str, int] | None, limit: int,
         using: str) -> list[DeadLetterRef]:
    """Up to ``limit`` selected dead letters after ``after`` = (topic, partition, offset),
    in (topic, partition, offset) order: the order of the log's partition index, so each
    page is an index range, not a sort of the whole selection."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    result: list[DeadLetterRef] = []
    for topic in sorted(selection.dead_letter_topics):
        if after is not None and topic < after[0]:
            continue
        where, params = _where(connection, selection, topic)
        if after is not None and topic == after[0]:
            where += (f" AND ({q('partition_key')} > %s OR ({q('partition_key')} = %s "
                      f"AND {q('offset')} > %s))")
            params += [after[1], after[1], after[2]]
        rows = sqlb.fetch_all(
            connection,
            f"SELECT {q('offset')}, {q('topic')}, {q('partition_key')}, {q('consumer_group')}, "  # noqa: S608 - names quoted, values bound
            f"{q('original_topic')}, {q('original_id')} FROM {q('queue_messages')} WHERE {where} "
            f"ORDER BY {q('partition_key')}, {q('offset')} LIMIT %s",
            [*params, limit - len(result)],
        )
        result += [DeadLetterRef(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]
        if len(result) >= limit:
            break
    return result


def count(selection: Selection, using: str, cap: int | None = None) -> int:
    """How many dead letters the selection matches (at most ``cap``)."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    total = 0
    for topic in selection.dead_letter_topics:
        where, params = _where(connection, selection, topic)
        limit = "" if cap is None else " LIMIT %s"
        rows = sqlb.fetch_all(
            connection,
            f"SELECT COUNT(*) FROM (SELECT 1 AS one FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {where}{limit}) AS n",
            params + ([] if cap is None else [cap - total]),
        )
        total += int(rows[0][0])
        if cap is not None and total >= cap:
            return cap
    return total


def counts_by_group(dead_letter_topics: Sequence[str], cap: int, using: str
                    ) -> dict[str, dict[str, int]]:
    """Per dead-letter topic, per consumer group, its dead letters, at most ``cap`` in all
    per topic (the overview). One query per 200 topics."""
    connection = connections[using]
    q = sqlb.quoter(connection)
    branch = (
        f"SELECT t, g, COUNT(*) AS n FROM (SELECT {q('topic')} AS t, {q('consumer_group')} AS g "  # noqa: S608 - names quoted, values bound
        f"FROM {q('queue_messages')} WHERE {q('topic')} = %s AND {q('consumer_group')} <> '' "
        f"LIMIT %s) AS n GROUP BY t, g"
    )
    counts: dict[str, dict[str, int]] = {topic: {} for topic in dead_letter_topics}
    for batch in sqlb.chunks(list(dead_letter_topics)):
        params = [v for topic in batch for v in (topic, cap)]
        for topic, group, n in sqlb.fetch_all(connection, sqlb.union_all([branch] * len(batch)),
                                              params):
            counts[topic][group] = int(n)
    return counts


def insert_replays(offsets: Sequence[int], using: str) -> int:
    """Append a replay of each dead letter to its original topic, built in the database
    from the dead-letter row (the original may be gone): same key, payload and
    ``published_at``, the headers plus the replay headers, due now. Idempotent: a replay
    already there (a repeated run) is skipped. Returns the rows inserted."""
    if not offsets:
        return 0
    connection = connections[using]
    q = sqlb.quoter(connection)
    now = vendor.now_ms_sql(connection)
    headers = vendor.json_with_strings_sql(connection, q("metadata"), {
        GROUP_HEADER: q("consumer_group"),
        ORIGINAL_ID_HEADER: q("original_id"),
        ORIGINAL_OFFSET_HEADER: vendor.text_sql(connection, q("original_offset")),
        DEAD_LETTER_HEADER: vendor.text_sql(connection, q("offset")),
    })
    replay_id = vendor.concat_sql(connection, f"'{REPLAY_ID_PREFIX}'",
                                  vendor.text_sql(connection, q("offset")))
    columns = ("topic", "message_key", "partition_key", "id", "payload", "metadata", "failed_at",
               "failure_count", "last_error", "original_topic", "original_offset",
               "consumer_group", "created_at", "published_at", "deliver_at", "original_id")
    prefix, suffix = sqlb.insert_ignore(connection, IDEMPOTENCY_COLUMNS)
    return sqlb.execute(
        connection,
        f"{prefix} {q('queue_messages')} ({', '.join(q(c) for c in columns)}) "  # noqa: S608 - names quoted, values bound
        f"SELECT {q('original_topic')}, {q('message_key')}, '', {replay_id}, {q('payload')}, "
        f"{headers}, 0, 0, '', '', 0, '', {now}, {q('published_at')}, {now}, '' "
        f"FROM {q('queue_messages')} WHERE {q('offset')} IN ({sqlb.placeholders(len(offsets))}) "
        f"AND {q('consumer_group')} <> ''{suffix}",
        list(offsets),
    )
