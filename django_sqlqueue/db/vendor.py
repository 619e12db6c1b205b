"""Everything that differs between MySQL/MariaDB, PostgreSQL and SQLite.

Table modules ask this module for SQL fragments (the database clock, locking clauses,
upserts) instead of testing ``connection.vendor`` themselves. The fragments need only the
connection's ``vendor`` (:class:`Vendored`), so a Django connection and a plain DB-API
:class:`django_sqlqueue.store.connection.Connection` (a Spark driver's) get the same SQL.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper


class Vendored(Protocol):
    """A connection as far as SQL text is concerned: which database it talks to."""

    @property
    def vendor(self) -> str: ...


def quote(connection: Vendored, name: str) -> str:
    """An identifier quoted as Django's ``quote_name`` quotes it on each backend."""
    if connection.vendor == "mysql":
        return f"`{name}`"
    return f'"{name}"'


def now_ms_sql(connection: Vendored) -> str:
    """SQL for the database server's current time in epoch milliseconds.

    All queue timing (visibility, leases, delays) uses the server's clock so that a
    worker whose own clock is wrong still behaves correctly.
    """
    if connection.vendor == "mysql":
        # TIMESTAMPDIFF against UTC_TIMESTAMP is independent of the session time zone
        # (UNIX_TIMESTAMP(NOW()) is ambiguous during a DST change).
        return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    if connection.vendor == "postgresql":
        # statement_timestamp(): not now(), which is frozen at the start of the transaction,
        # nor clock_timestamp(), which can differ between two columns of one row.
        return "(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::bigint)"
    if connection.vendor == "sqlite":
        return "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))"
    raise NotImplementedError(f"django-sqlqueue does not support the {connection.vendor!r} backend")


def database_now_ms(connection: BaseDatabaseWrapper) -> int:
    """The database server's current time in epoch milliseconds (one query)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_ms_sql(connection)}")
        return int(cursor.fetchone()[0])


def supports_returning(connection: BaseDatabaseWrapper) -> bool:
    """INSERT … RETURNING: PostgreSQL, SQLite >= 3.35 and MariaDB >= 10.5 (not Oracle MySQL)."""
    if connection.vendor == "mysql":
        return bool(connection.mysql_is_mariadb) and connection.mysql_version >= (10, 5)  # type: ignore[attr-defined]
    return True


def has_json_table(connection: BaseDatabaseWrapper) -> bool:
    """Whether a statement can read rows from ``JSON_TABLE``: MariaDB 10.6 and later (MySQL
    8 has it too, but the statements using it are tested on MariaDB only)."""
    return (connection.vendor == "mysql" and bool(connection.mysql_is_mariadb)  # type: ignore[attr-defined]
            and connection.mysql_version >= (10, 6))  # type: ignore[attr-defined]


def duplicate_check_locks(connection: Vendored) -> bool:
    """Whether an INSERT that skips duplicates locks the stored row it collides with.

    InnoDB's duplicate-key check takes a shared lock on the stored row's unique-index
    entry and holds it until the transaction ends: measured on MariaDB 10.11 at READ
    COMMITTED, an ``INSERT IGNORE`` of a duplicate left open made a ``DELETE`` of the
    stored row wait (the sequencer's locks, on other indexes, do not conflict with it).
    PostgreSQL's ``ON CONFLICT DO NOTHING`` locks and writes nothing for a committed
    duplicate; SQLite has no row locks.
    """
    return connection.vendor == "mysql"


def insert_select_reads_unlocked(connection: BaseDatabaseWrapper) -> bool:
    """Whether the SELECT of an ``INSERT … SELECT`` is a plain read, locking nothing.

    InnoDB reads it so at READ COMMITTED (Django's default for MySQL, from the alias's
    ``OPTIONS["isolation_level"]``); at REPEATABLE READ it share-locks the rows and gaps it
    reads, which makes concurrent inserts wait for each other. PostgreSQL and SQLite never
    lock what a SELECT reads.
    """
    if connection.vendor != "mysql":
        return True
    level = connection.settings_dict.get("OPTIONS", {}).get("isolation_level", "read committed")
    return level is not None and str(level).lower() in {"read committed", "read uncommitted"}


def skip_locked_sql(connection: Vendored) -> str:
    """Lock the selected rows but pass over rows other transactions hold.

    SQLite has no row locks: its writers are serialized by the database lock, which the
    worker takes up front (``transaction_mode = IMMEDIATE``).
    """
    if connection.vendor == "sqlite":
        return ""
    return " FOR UPDATE SKIP LOCKED"


def for_update_sql(connection: Vendored) -> str:
    """An exclusive row lock, waited for (SQLite: the transaction's database lock)."""
    return "" if connection.vendor == "sqlite" else " FOR UPDATE"


def for_share_sql(connection: Vendored, skip_locked: bool = False) -> str:
    """A shared row lock that blocks writers (used to fence lease ownership); with
    ``skip_locked``, rows another transaction holds are passed over instead of waited for."""
    if connection.vendor == "sqlite":
        return ""
    skip = " SKIP LOCKED" if skip_locked else ""
    if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
        return " LOCK IN SHARE MODE" + skip  # MariaDB has no FOR SHARE
    return " FOR SHARE" + skip


def has_row_locks(connection: Vendored) -> bool:
    """Whether transactions lock rows (MySQL/MariaDB, PostgreSQL), so that one row held
    elsewhere holds up only the statements that touch it. SQLite locks the whole
    database: there, a wait concerns every statement alike."""
    return connection.vendor != "sqlite"


def lock_timeout_sql(connection: BaseDatabaseWrapper, seconds: float | None) -> list[str]:
    """Statements making this session's statements give up on a lock after ``seconds``
    (None: the server's default again). SQLite has a busy timeout instead (the alias's
    ``OPTIONS["timeout"]``), set when it connects.

    MariaDB/MySQL count row-lock waits in whole seconds (``innodb_lock_wait_timeout``)
    and waits for a table's metadata lock (an ``ALTER TABLE``) separately
    (``lock_wait_timeout``); PostgreSQL's ``lock_timeout`` covers every lock.
    """
    if connection.vendor == "postgresql":
        value = "DEFAULT" if seconds is None else f"{max(1, round(seconds * 1000))}"
        return [f"SET lock_timeout = {value}"]
    if connection.vendor == "mysql":
        value = "DEFAULT" if seconds is None else f"{max(1, math.ceil(seconds))}"
        return [f"SET SESSION innodb_lock_wait_timeout = {value}",
                f"SET SESSION lock_wait_timeout = {value}"]
    return []


def force_index_sql(connection: Vendored, index: str | None = None) -> str:
    """An index hint pinning a locking statement to ``index`` (default: the primary key).

    InnoDB locks every row a locking statement reads, not only the rows it changes. On the
    small tables a queue keeps (a few hundred delivery rows, one lease and one offsets row
    per partition) MariaDB's optimizer prefers a full scan to a few hundred primary-key
    lookups, and that scan locks the rows of partitions other workers own: their
    transactions then wait for ours, or deadlock with it. Measured before the hint: every
    delete of acked delivery rows scanned the table, and two workers deadlocked about 7
    times per 20,000 messages. PostgreSQL and SQLite lock only the rows a statement
    changes, so they need no hint.
    """
    if connection.vendor != "mysql":
        return ""
    return f" FORCE INDEX ({quote(connection, index) if index else 'PRIMARY'})"


def true_sql(connection: Vendored) -> str:
    return "TRUE" if connection.vendor == "postgresql" else "1"


def false_sql(connection: Vendored) -> str:
    return "FALSE" if connection.vendor == "postgresql" else "0"


def json_param_sql(connection: Vendored) -> str:
    """A placeholder for a JSON text parameter, cast where the column type needs it."""
    return "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"


def json_text_sql(connection: Vendored, column: str) -> str:
    """A JSON column read as the JSON text stored: psycopg decodes ``jsonb`` into Python
    values, MySQL and SQLite return the text as it is."""
    return f"{column}::text" if connection.vendor == "postgresql" else column


def text_sql(connection: Vendored, expression: str) -> str:
    """``expression`` (a number, say) as text."""
    if connection.vendor == "mysql":
        return f"CAST({expression} AS CHAR)"
    return f"CAST({expression} AS TEXT)"


def concat_sql(connection: Vendored, *parts: str) -> str:
    """SQL joining text expressions (MySQL's ``||`` is a logical OR)."""
    if connection.vendor == "mysql":
        return f"CONCAT({', '.join(parts)})"
    return "(" + " || ".join(parts) + ")"


def json_with_strings_sql(connection: Vendored, document: str,
                          values: dict[str, str]) -> str:
    """SQL for the JSON object ``document`` with string members set: ``values`` maps a
    member name (a constant without quotes) to a text SQL expression."""
    if connection.vendor == "postgresql":
        pairs = ", ".join(f"'{name}', {expr}" for name, expr in values.items())
        return f"({document} || jsonb_build_object({pairs}))"
    function = "JSON_SET" if connection.vendor == "mysql" else "json_set"
    pairs = ", ".join(f"'$.\"{name}\"', {expr}" for name, expr in values.items())
    return f"{function}({document}, {pairs})"


def json_without_sql(connection: Vendored, document: str, name: str) -> str:
    """SQL for the JSON object ``document`` without its member ``name`` (a constant
    without quotes); the document unchanged when it has no such member."""
    if connection.vendor == "postgresql":
        return f"({document} - '{name}')"
    function = "JSON_REMOVE" if connection.vendor == "mysql" else "json_remove"
    return f"{function}({document}, '$.\"{name}\"')"


def correlated_ranges(connection: Vendored) -> bool:
    """Whether a subquery's bound on an index column that comes from the outer row
    (``m.position > o.offset_acked``) is read as an index range from that value. MariaDB
    and MySQL read it as a lookup on the columns before it, filtered row by row."""
    return connection.vendor != "mysql"


def distinct_leading_sql(connection: Vendored, table: str, column: str) -> str:
    """SQL for the distinct values of ``column``, the leading column of an index of
    ``table``, in order, up to a LIMIT given as its one parameter: one index seek per
    value, however many rows share each. MariaDB/MySQL do that for DISTINCT (a loose index
    scan); PostgreSQL and SQLite would read the whole index, so they step from one value to
    the next with a recursive query."""
    q = quote(connection, table)
    c = quote(connection, column)
    if connection.vendor == "mysql":
        return f"SELECT DISTINCT {c} FROM {q} ORDER BY {c} LIMIT %s"  # noqa: S608 - names quoted
    # ORDER BY ... LIMIT 1, not MIN(): SQLite seeks for MIN() only in a query of its own.
    return (
        f"WITH RECURSIVE distinct_values (v) AS ("  # noqa: S608 - names quoted
        f"SELECT (SELECT {c} FROM {q} ORDER BY {c} LIMIT 1) "
        f"UNION ALL SELECT (SELECT {c} FROM {q} WHERE {c} > d.v ORDER BY {c} LIMIT 1) "
        f"FROM distinct_values d WHERE d.v IS NOT NULL) "
        f"SELECT v FROM distinct_values WHERE v IS NOT NULL LIMIT %s"
    )


@contextmanager
def without_jit(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Run the block's statements without PostgreSQL's JIT compiler (a no-op elsewhere).

    A statement of many small index reads (the overview's) passes ``jit_above_cost`` by its
    estimated cost alone, and then compiles for about 200 ms to run for a few. The session's
    setting is restored afterwards; should the block's transaction fail, the change is
    rolled back with it.
    """
    if connection.vendor != "postgresql":
        yield
        return
    if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        # Behind a transaction pooler: only for the block's transaction, never the session.
        if connection.in_atomic_block:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('jit', 'off', true)")
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('jit'), set_config('jit', 'off', false)")
        before = cursor.fetchone()[0]
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('jit', %s, false)", [before])
        except DatabaseError:
            pass  # the transaction failed (its SET with it) or the connection is gone
