"""Small builders for the SQL shapes the table modules share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from . import vendor

# SQLite refuses compound SELECTs with more than 500 terms; stay well below.
MAX_UNION_BRANCHES = 200


def quoter(connection: BaseDatabaseWrapper) -> Callable[[str], str]:
    """A ``q(name)`` function quoting identifiers for this connection."""
    return lambda name: vendor.quote(connection, name)


def union_all(branches: Sequence[str]) -> str:
    """Join per-partition SELECTs, each wrapped so it may carry its own ORDER BY/LIMIT.

    MySQL wants parentheses around such SELECTs and SQLite refuses them; a derived table
    per branch is accepted by all three.
    """
    return " UNION ALL ".join(
        f"SELECT * FROM ({branch}) AS b{index}" for index, branch in enumerate(branches)
    )


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


def insert_missing_partitions(
    connection: BaseDatabaseWrapper, table: str, group: str, topic: str, keys: Sequence[str],
    defaults: dict[str, str],
) -> None:
    """Insert a (consumer_group, topic, partition_key) row per key unless it exists.

    ``defaults`` maps the table's other columns to the SQL for their initial value.
    """
    q = quoter(connection)
    prefix, suffix = vendor.insert_ignore_sql(connection, ("consumer_group", "topic", "partition_key"))
    columns = ", ".join(q(c) for c in ("consumer_group", "topic", "partition_key", *defaults))
    row = "(%s, %s, %s, " + ", ".join(defaults.values()) + ")"
    for batch in chunks(list(keys), 500):
        execute(
            connection,
            f"{prefix} {q(table)} ({columns}) VALUES {', '.join([row] * len(batch))}{suffix}",
            [v for key in batch for v in (group, topic, key)],
        )
