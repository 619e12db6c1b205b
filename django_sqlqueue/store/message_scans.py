"""The Spark data source's reads of the log (``queue_messages``): pages of an offset or a
position range, the bounds of those ranges, and how far a stream may read.

Rows come as :data:`READ_COLUMNS`, payload and headers as the JSON text stored, so the
data source hands them on without decoding them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..db import vendor
from .connection import Connection

# What a read returns, in order; payload and headers as JSON text.
READ_COLUMNS = (
    "offset", "position", "topic", "partition", "key", "id", "payload", "headers",
    "published_at", "deliver_at", "consumer_group", "original_topic", "original_offset",
    "original_id", "failure_count", "last_error", "failed_at",
)


def _json_text(conn: Connection, column: str) -> str:
    # The data source hands JSON text on, as stored.
    return vendor.json_text_sql(conn, conn.q(column))


def _select_list(conn: Connection) -> str:
    q = conn.q
    return ", ".join([
        q("offset"), q("position"), q("topic"), q("partition_key"), q("message_key"), q("id"),
        _json_text(conn, "payload"), _json_text(conn, "metadata"), q("published_at"),
        q("deliver_at"), q("consumer_group"), q("original_topic"), q("original_offset"),
        q("original_id"), q("failure_count"), q("last_error"), q("failed_at"),
    ])


def read_page(conn: Connection, topics: Sequence[str], after_offset: int, up_to_offset: int,
              limit: int, *, positions: tuple[int, int] | None = None,
              dead_letters: bool = False) -> list[tuple[Any, ...]]:
    """Up to ``limit`` rows of ``topics`` with an offset in (after, up_to], lowest first,
    as :data:`READ_COLUMNS` (``partition`` None until sequenced).

    ``positions`` keeps only sequenced rows with a position in (low, high]; ``dead_letters``
    reads the dead-letter copies of messages of ``topics`` instead.
    """
    q = conn.q
    where = [f"{q('offset')} > %s", f"{q('offset')} <= %s"]
    params: list[Any] = [after_offset, up_to_offset]
    topic_column = "original_topic" if dead_letters else "topic"
    if topics:
        where.append(f"{q(topic_column)} IN ({', '.join(['%s'] * len(topics))})")
        params += list(topics)
    if dead_letters:
        where.append(f"{q('consumer_group')} <> ''")
    if positions is not None:
        where.append(f"{q('position')} > %s AND {q('position')} <= %s")
        params += list(positions)
    rows = conn.fetch_all(
        f"SELECT {_select_list(conn)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {' AND '.join(where)} ORDER BY {q('offset')} LIMIT %s",
        [*params, limit],
    )
    return _read_rows(rows)


def read_positions(conn: Connection, topics: Sequence[str], after_position: int,
                   up_to_position: int, limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` sequenced rows of ``topics`` with a position in (after, up_to],
    lowest position first, as :data:`READ_COLUMNS`: what a stream reads."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {_select_list(conn)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('position')} > %s AND {q('position')} <= %s "
        f"AND {q('topic')} IN ({', '.join(['%s'] * len(topics))}) "
        f"ORDER BY {q('position')} LIMIT %s",
        [after_position, up_to_position, *topics, limit],
    )
    return _read_rows(rows)


def _read_rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """JSON columns as text: Oracle MySQL returns them as bytes (MariaDB as text)."""
    if rows and isinstance(rows[0][6], bytes | bytearray):
        return [(*row[:6], bytes(row[6]).decode("utf-8"), bytes(row[7]).decode("utf-8"), *row[8:])
                for row in rows]
    return rows


def offset_bounds(conn: Connection, topics: Sequence[str], *,
                  dead_letters: bool = False) -> tuple[int, int] | None:
    """(lowest, highest) offset of the messages of ``topics`` (any topic when empty);
    None when there are none."""
    q = conn.q
    column = "original_topic" if dead_letters else "topic"
    where = []
    params: list[Any] = []
    if topics:
        where.append(f"{q(column)} IN ({', '.join(['%s'] * len(topics))})")
        params += list(topics)
    if dead_letters:
        where.append(f"{q('consumer_group')} <> ''")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    row = conn.fetch_all(
        f"SELECT MIN({q('offset')}), MAX({q('offset')}) FROM {q('queue_messages')}{clause}",  # noqa: S608 - names quoted, values bound
        params,
    )[0]
    if row[0] is None:
        return None
    return int(row[0]), int(row[1])


def nth_position(conn: Connection, topics: Sequence[str], after_position: int,
                 up_to_position: int, count: int) -> int | None:
    """The position of the ``count``-th sequenced message of ``topics`` above
    ``after_position`` (at most ``up_to_position``); None when there are fewer."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('position')} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('position')} > %s AND {q('position')} <= %s "
        f"AND {q('topic')} IN ({', '.join(['%s'] * len(topics))}) "
        f"ORDER BY {q('position')} LIMIT 1 OFFSET %s",
        [after_position, up_to_position, *topics, count - 1],
    )
    return int(rows[0][0]) if rows else None


def lowest_position(conn: Connection, topics: Sequence[str]) -> int | None:
    """The lowest position of a message of ``topics`` still in the log."""
    q = conn.q
    row = conn.fetch_all(
        f"SELECT MIN({q('position')}) FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('topic')} IN ({', '.join(['%s'] * len(topics))})",
        list(topics),
    )[0]
    return None if row[0] is None else int(row[0])


def nearest_above(conn: Connection, topic: str, marks: dict[str, int], *,
                  up_to: int | None = None) -> dict[str, int]:
    """Per partition in ``marks``, the position of its first message above its mark, or
    with ``up_to`` of its last message in (mark, up_to]; a partition without one is left out.

    One index seek per partition (queue_msg_position), whatever the backlog: each is its
    own query with constant bounds, so that MariaDB seeks instead of scanning the
    partition from its start (as it does for a bound taken from a joined row).
    """
    q = conn.q
    bound = "" if up_to is None else f" AND {q('position')} <= %s"
    order = "ASC" if up_to is None else "DESC"
    part = (f"SELECT {q('partition_key')}, {q('position')} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('topic')} = %s AND {q('partition_key')} = %s AND {q('position')} > %s"
            f"{bound} ORDER BY {q('position')} {order} LIMIT 1")
    found: dict[str, int] = {}
    items = list(marks.items())
    for start in range(0, len(items), 200):
        chunk = items[start:start + 200]
        sql = " UNION ALL ".join(f"SELECT * FROM ({part}) n{i}" for i in range(len(chunk)))  # noqa: S608 - names quoted, values bound
        params: list[Any] = []
        for partition, mark in chunk:
            params += [topic, partition, mark] + ([] if up_to is None else [up_to])
        found.update({str(r[0]): int(r[1]) for r in conn.fetch_all(sql, params)})
    return found


def count_positions(conn: Connection, after_position: int, up_to_position: int) -> int:
    """How many messages (of any topic) hold a position in (after, up_to]: positions are
    handed out without gaps, so fewer than the range's width means some were collected."""
    q = conn.q
    return int(conn.fetch_all(
        f"SELECT COUNT(*) FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('position')} > %s AND {q('position')} <= %s",
        [after_position, up_to_position],
    )[0][0])
