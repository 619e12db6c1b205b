"""Small builders for the SQL shapes the table modules share.

Every identifier goes through :func:`quoter`: the RFC's column names include ``offset``,
a reserved word on PostgreSQL and SQLite, so unquoted SQL would not even parse there.
Values are always bound parameters, never formatted into the text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from . import vendor
from .vendor import Vendored

# SQLite refuses compound SELECTs with more than 500 terms; stay well below.
MAX_UNION_BRANCHES = 200


def quoter(connection: Vendored) -> Callable[[str], str]:
    """A ``q(name)`` function quoting identifiers for this connection."""
    return lambda name: vendor.quote(connection, name)


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def union_all(branches: Sequence[str], connection: Vendored | None = None) -> str:
    """Join per-partition SELECTs, each wrapped so it may carry its own ORDER BY/LIMIT.

    MySQL wants parentheses around such SELECTs and SQLite refuses them; a derived table
    per branch is accepted by all three. Given a MySQL ``connection``, the branches are
    parenthesized instead: MariaDB materializes each derived table, on disk when it has a
    TEXT column (a payload), which made the worker's read of new messages three times
    slower.
    """
    if connection is not None and connection.vendor == "mysql":
        return " UNION ALL ".join(f"({branch})" for branch in branches)
    return " UNION ALL ".join(
        f"SELECT * FROM ({branch}) AS b{index}"  # noqa: S608 - branches are the callers' SQL
        for index, branch in enumerate(branches)
    )


def locked_table(connection: Vendored, table: str, index: str | None = None) -> str:
    """``table`` for an UPDATE or a locking SELECT that must read only the rows it names
    (see :func:`vendor.force_index_sql`)."""
    return vendor.quote(connection, table) + vendor.force_index_sql(connection, index)


def delete_from(connection: Vendored, table: str, index: str | None = None) -> str:
    """``DELETE FROM table`` reading only the rows it names: MySQL takes index hints only
    in its multi-table form, ``DELETE t FROM t FORCE INDEX (...)``."""
    name = vendor.quote(connection, table)
    if connection.vendor == "mysql":
        return f"DELETE {name} FROM {locked_table(connection, table, index)}"
    return f"DELETE FROM {name}"  # noqa: S608 - names quoted, values bound


def chunks(items: Sequence[Any], size: int = MAX_UNION_BRANCHES) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def fetch_all(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def execute(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def on_conflict_update(
    connection: Vendored, table: str, conflict_columns: Sequence[str],
    assignments: Mapping[str, str],
) -> str:
    """The tail of an ``INSERT`` that updates the existing row on a key conflict.

    ``assignments`` maps a column to an expression in which ``{old}`` is the stored value
    and ``{new}`` the value the INSERT tried to write, e.g. ``{"n": "{old} + 1"}``.
    """
    q = quoter(connection)
    if connection.vendor == "mysql":
        sets = ", ".join(
            f"{q(column)} = " + expr.format(old=q(column), new=f"VALUES({q(column)})")
            for column, expr in assignments.items()
        )
        return f" ON DUPLICATE KEY UPDATE {sets}"
    sets = ", ".join(
        f"{q(column)} = " + expr.format(old=f"{q(table)}.{q(column)}", new=f"EXCLUDED.{q(column)}")
        for column, expr in assignments.items()
    )
    return f" ON CONFLICT ({', '.join(q(c) for c in conflict_columns)}) DO UPDATE SET {sets}"


def insert_ignore(connection: Vendored, conflict_columns: Sequence[str]) -> tuple[str, str]:
    """(prefix, suffix) for an INSERT that silently skips rows whose key already exists.

    On MySQL this is ``INSERT IGNORE``, which also turns data errors (a value too long for
    its column) into warnings: use it only for rows whose values cannot be out of range.
    """
    if connection.vendor == "mysql":
        return "INSERT IGNORE INTO", ""
    q = quoter(connection)
    return "INSERT INTO", f" ON CONFLICT ({', '.join(q(c) for c in conflict_columns)}) DO NOTHING"


def insert_missing_partitions(
    connection: BaseDatabaseWrapper, table: str, group: str, topic: str, partitions: Sequence[str],
    defaults: dict[str, str],
) -> None:
    """Insert a (consumer_group, topic, partition_key) row per partition unless it exists.

    ``defaults`` maps the table's other columns to the SQL for their initial value.
    """
    q = quoter(connection)
    prefix, suffix = insert_ignore(connection, ("consumer_group", "topic", "partition_key"))
    columns = ", ".join(q(c) for c in ("consumer_group", "topic", "partition_key", *defaults))
    row = "(%s, %s, %s, " + ", ".join(defaults.values()) + ")"
    for batch in chunks(list(partitions), 500):
        execute(
            connection,
            f"{prefix} {q(table)} ({columns}) VALUES {', '.join([row] * len(batch))}{suffix}",
            [v for partition in batch for v in (group, topic, partition)],
        )


def row_values(rows: int, width: int) -> str:
    """``(%s, %s), (%s, %s)`` for a row-value IN list."""
    one = "(" + placeholders(width) + ")"
    return ", ".join([one] * rows)
