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
