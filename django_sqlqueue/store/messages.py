"""SQL for ``queue_messages``, the log: its rows' columns, and appending them.

One INSERT for every writer: ``publish()`` (through
:class:`django_sqlqueue.models.QueueMessage`) and a Spark write. The partition stays ''
until the sequencer positions the message, times come from the database clock, and a
stored (topic, key, id) is skipped, never rewritten. The log's reads are in
:mod:`.message_reads` (the worker's) and :mod:`.message_scans` (the Spark data
source's); its dead-letter copies in :mod:`.dead_letters`; what GC deletes in
:mod:`.message_gc`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..db import sql as sqlb
from ..db.vendor import Vendored, quote
from ..encoding import NewRow
from ..exceptions import InvalidMessage
from .connection import Connection

# Columns written by publish and by dead-lettering.
INSERT_COLUMNS = (
    "topic", "message_key", "partition_key", "id", "payload", "metadata",
    "failed_at", "failure_count", "last_error", "original_topic", "original_offset",
    "consumer_group", "created_at", "published_at", "deliver_at",
)
IDEMPOTENCY_COLUMNS = ("topic", "message_key", "id")
_MYSQL_DUPLICATE_KEY = 1062  # the warning INSERT IGNORE gives for a skipped duplicate
# The columns of a MessageRow, in order; ``id`` and ``message_key`` keep their SQL names.
MESSAGE_COLUMNS = ("offset", "position", "topic", "message_key", "id", "payload", "metadata",
                   "published_at", "deliver_at")


class MessageRow(NamedTuple):
    """A message as read from the log (``position`` is None until it is sequenced)."""

    offset: int
    position: int | None
    topic: str
    key: str
    id: str
    payload: Any  # JSON text or decoded, as the backend returns it
    metadata: Any
    published_at: int
    deliver_at: int


def message_row(values: Sequence[Any]) -> MessageRow:
    offset, position, topic, key, message_id, payload, metadata, published_at, deliver_at = values
    return MessageRow(int(offset), None if position is None else int(position), topic, key,
                      message_id, payload, metadata, int(published_at), int(deliver_at))


def select_columns(connection: Vendored, alias: str = "") -> str:
    """The columns of a :class:`MessageRow`, for a SELECT (of table ``alias``)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + quote(connection, c) for c in MESSAGE_COLUMNS)


def insert_sql(conn: Connection, rows: int, returning: bool, unless_stored: bool = False,
               notify_channel: str | None = None) -> str:
    """The INSERT appending ``rows`` rows, built once per backend and shape.

    ``unless_stored`` (one row): an ``INSERT … SELECT`` whose SELECT finds no row with the
    row's (topic, key, id) first; its parameters are the row's, then those three again.
    ``notify_channel`` (PostgreSQL, with ``returning``): each new row also sends
    ``pg_notify(channel, topic)`` in the same statement, one more column returned.
    """
    key = (conn.vendor, rows, returning, unless_stored, notify_channel)
    sql = _INSERT_SQL_CACHE.get(key)
    if sql is None:
        q = conn.q
        now = conn.now_ms_sql()
        json_param = conn.json_param_sql()
        # partition_key stays '' until the sequencer gives the message its position and,
        # with the topic's recorded partition count, its partition.
        row_sql = (
            f"%s, %s, '', %s, {json_param}, {json_param}, 0, 0, '', '', 0, '', {now}, {now}, "
            f"{now} + %s"
        )
        if unless_stored:
            stored = " AND ".join(f"{q(column)} = %s" for column in IDEMPOTENCY_COLUMNS)
            values = (f"SELECT {row_sql} FROM DUAL WHERE NOT EXISTS "  # noqa: S608 - names quoted, values bound
                      f"(SELECT 1 FROM {q('queue_messages')} WHERE {stored})")
        else:
            values = "VALUES " + ", ".join([f"({row_sql})"] * rows)
        # A duplicate (topic, key, id) is skipped, not updated: an upsert's no-op UPDATE
        # would lock the stored row (and on PostgreSQL write a new version of it), and the
        # sequencer, which skips locked rows, would then position later messages of its
        # key first. Skipped rows are not returned; the caller reads them back. On MySQL
        # this is INSERT IGNORE, which also turns data errors into warnings: publishing
        # validates every value first, and insert() refuses a row the server dropped.
        prefix, suffix = conn.insert_ignore(IDEMPOTENCY_COLUMNS)
        sql = (
            f"{prefix} {q('queue_messages')} ({', '.join(q(c) for c in INSERT_COLUMNS)}) "
            f"{values}{suffix}"
        )
        if returning:
            sql += f" RETURNING {select_columns(conn)}"
            if notify_channel:
                # A notification in the INSERT itself: an autocommit publish() commits it
                # with the message, at no extra round trip. The server folds repeats.
                sql += f", pg_notify('{notify_channel}', {q('topic')})"
        if len(_INSERT_SQL_CACHE) < 64:  # a few batch sizes per backend; never unbounded
            _INSERT_SQL_CACHE[key] = sql
    return sql


_INSERT_SQL_CACHE: dict[tuple[str, int, bool, bool, str | None], str] = {}


def insert(conn: Connection, rows: Sequence[NewRow], *, returning: bool = False,
           unless_stored: bool = False,
           notify_channel: str | None = None) -> tuple[int, list[MessageRow]]:
    """Append ``rows`` in one statement, skipping any (topic, key, id) stored already;
    return how many were new and, with ``returning`` (not on Oracle MySQL), those rows.
    ``unless_stored`` and ``notify_channel``: see :func:`insert_sql`. The caller commits.

    MySQL's INSERT IGNORE turns a refused value into a warning: any warning but a skipped
    duplicate raises InvalidMessage, so no row is dropped silently.
    """
    if not rows:
        return 0, []
    sql = insert_sql(conn, len(rows), returning, unless_stored,
                     notify_channel if returning else None)
    params = [value for row in rows for value in row[:6]]
    if unless_stored:
        params += [rows[0].topic, rows[0].key, rows[0].id]
    inserted: list[MessageRow] = []
    if returning:
        width = len(MESSAGE_COLUMNS)  # without pg_notify()'s empty column
        inserted = [message_row(values[:width]) for values in conn.fetch_all(sql, params)]
        written = len(inserted)
    else:
        written = conn.execute(sql, params)
    if written < len(rows):
        # The warning count comes with the INSERT's reply: asking costs no round trip.
        refused = [message for code, message in conn.warnings() if code != _MYSQL_DUPLICATE_KEY]
        if refused:
            raise InvalidMessage(f"the database refused the message: {'; '.join(refused)}")
    return written, inserted


def insert_rows(conn: Connection, rows: Sequence[NewRow]) -> int:
    """Append ``rows`` in one multi-row INSERT, skipping any (topic, key, id) stored
    already; return how many were new (a Spark write). The caller commits."""
    return insert(conn, rows)[0]


def read_back(conn: Connection, keys: Sequence[tuple[str, str, str]]
              ) -> dict[tuple[str, str, str], MessageRow]:
    """The stored rows with the (topic, key, id) of ``keys``, by those; a plain read."""
    if not keys:
        return {}
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {select_columns(conn)} FROM {q('queue_messages')} "  # noqa: S608 - names quoted, values bound
        f"WHERE ({', '.join(q(c) for c in IDEMPOTENCY_COLUMNS)}) IN "
        f"({sqlb.row_values(len(keys), 3)})",
        [v for key in keys for v in key],
    )
    return {(r.topic, r.key, r.id): r for r in map(message_row, rows)}
