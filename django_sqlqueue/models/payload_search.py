"""Searching the log by a payload field (``customer_id=42``), and the indexes that make it fast.

A field named in ``SQLQUEUE["SEARCH_FIELDS"]`` gets an index on its value, created after
``migrate`` (:func:`ensure_search_indexes`): an expression index on PostgreSQL and SQLite,
an indexed virtual column ``sqlqueue_s_<field>`` on MariaDB/MySQL (MariaDB 10.11 has no
expression indexes, and its optimizer only uses such an index when the query names the
column). An exact match on such a field reads that index; any other field has none, so
callers bound that search to recent rows themselves.

Only top-level fields of an object payload are searched, by their value as text: 42 and
"42" both match ``customer_id=42``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models.expressions import RawSQL
from django.db.models.lookups import Exact, In, Lookup

from ..conf import queue_database
from ..db import sql as sqlb
from ..db.exact_names import binary_collation
from ..db.schema_state import holds_queue_table

FIELD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")  # what a search field may be called
VALUE_LENGTH = 255  # characters of a value an index keeps (MariaDB's virtual column)


def column_name(field: str) -> str:
    return f"sqlqueue_s_{field.lower()}"


def index_name(field: str) -> str:
    return f"queue_msg_s_{field.lower()}"


def _check(field: str) -> None:
    if not FIELD_RE.fullmatch(field):
        raise ValueError(f"{field!r} is not a payload field name (letters, digits and '_', "
                         "not starting with a digit, at most 40)")


def _extract_sql(connection: Any, field: str, column: str) -> str:
    """SQL for the field's value as text. ``field`` is checked against FIELD_RE, so it can
    be written into the statement (an index is matched on its exact expression)."""
    if connection.vendor == "postgresql":
        return f"({column} ->> '{field}')"
    if connection.vendor == "mysql":
        return f"LEFT(JSON_UNQUOTE(JSON_EXTRACT({column}, '$.\"{field}\"')), {VALUE_LENGTH})"
    return f"json_extract({column}, '$.\"{field}\"')"


def indexed_column(connection: Any, field: str) -> str | None:
    """MariaDB/MySQL: the virtual column of a declared field, if ``migrate`` made it."""
    q = sqlb.quoter(connection)
    rows = sqlb.fetch_all(
        connection,
        "SELECT 1 FROM information_schema.columns WHERE table_schema = DATABASE() "
        "AND table_name = %s AND column_name = %s",
        ["queue_messages", column_name(field)],
    )
    return q(column_name(field)) if rows else None


def match_lookup(connection: Any, field: str, value: str, indexed: bool,
                 table: str = "queue_messages") -> Lookup[Any]:
    """A lookup for ``QuerySet.filter()`` matching rows whose payload ``field`` is ``value``.

    ``indexed``: the field is declared, so the term is written as its index is (on
    MariaDB/MySQL, the virtual column, which must exist). A lookup, not a boolean RawSQL:
    Django 5.2 compares a boolean expression with TRUE on MariaDB/MySQL
    (``(col = '42') = 1``), which no index serves.
    """
    expression, values = _match(connection, field, value, indexed, table)
    lhs = RawSQL(expression, [], output_field=models.Field())  # noqa: S611 - checked name, no input
    if len(values) > 1:
        return In(lhs, values)
    return Exact(lhs, values[0])


def _match(connection: Any, field: str, value: str, indexed: bool,
           table: str) -> tuple[str, list[Any]]:
    _check(field)
    q = sqlb.quoter(connection)
    column = f"{q(table)}.{q('payload')}"
    expression = _extract_sql(connection, field, column)
    if indexed and connection.vendor == "mysql":
        expression = f"{q(table)}.{q(column_name(field))}"
    if connection.vendor == "sqlite":
        # json_extract gives a JSON number as a number, which is never equal to text.
        values: list[Any] = [value]
        if re.fullmatch(r"-?\d{1,18}", value):
            values.append(int(value))
        elif re.fullmatch(r"-?\d+\.\d+", value):
            values.append(float(value))
        return expression, values
    return expression, [value[:VALUE_LENGTH]]


def ensure_search_indexes(fields: Sequence[str], using: str | None = None) -> list[str]:
    """Create the index of each field that has none yet; return the fields indexed now.

    Indexes of fields no longer declared are left alone (drop them by name:
    ``queue_msg_s_<field>``, and on MariaDB/MySQL the column ``sqlqueue_s_<field>``).
    """
    connection = connections[using or queue_database()]
    q = sqlb.quoter(connection)
    created = []
    for field in fields:
        _check(field)
        name = index_name(field)
        if connection.vendor == "mysql":
            if indexed_column(connection, field) is not None:
                continue
            expression = _extract_sql(connection, field, q("payload"))
            # A value matches exactly, as on PostgreSQL and SQLite (see db/exact_names.py).
            sqlb.execute(
                connection,
                f"ALTER TABLE {q('queue_messages')} ADD COLUMN {q(column_name(field))} "
                f"VARCHAR({VALUE_LENGTH}) CHARACTER SET utf8mb4 "
                f"COLLATE {binary_collation(connection)} AS ({expression}) VIRTUAL, "
                f"ADD INDEX {q(name)} ({q(column_name(field))})",
                [],
            )
        else:
            with connection.cursor() as cursor:
                introspected = connection.introspection.get_constraints(cursor, "queue_messages")
            if name in introspected:
                continue
            expression = _extract_sql(connection, field, q("payload"))
            sqlb.execute(connection,
                         f"CREATE INDEX {q(name)} ON {q('queue_messages')} ({expression})", [])
        created.append(field)
    return created


def create_search_indexes(using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """``post_migrate`` receiver: index the declared ``SEARCH_FIELDS`` once the table exists."""
    from ..conf import get_settings

    fields = list(get_settings().search_fields or [])
    if fields and holds_queue_table(using, "queue_messages"):
        ensure_search_indexes(fields, using)
