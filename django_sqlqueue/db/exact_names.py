"""Names compare byte for byte on MariaDB/MySQL, whatever the database's default collation.

The servers' usual defaults are case-insensitive (``utf8mb4_general_ci``) and PAD SPACE, so
``Orders``, ``orders`` and ``orders `` would be one topic, one task result id, one archive
mark and one limit scope. Every CHAR/VARCHAR column of the app's tables therefore gets the
server's binary NO PAD collation; only free text (payloads, error text, definitions) keeps
the default. PostgreSQL and SQLite compare text exactly already.

A migration that adds such a column ends with ``exact_names({"queue_x": ["name", ...]})``
(tests/test_exact_names.py walks ``information_schema`` for a column that missed it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import migrations


def binary_collation(connection: Any) -> str:
    """The collation that compares utf8mb4 text byte for byte, trailing spaces included."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


@dataclass(frozen=True)
class _Column:
    name: str
    column_type: str  # as information_schema spells it: varchar(255)
    nullable: bool
    default: str | None  # MariaDB: an SQL literal; MySQL: the value itself
    generation: str  # the expression of a generated column, '' otherwise
    stored: bool

    def definition(self, connection: Any, schema_editor: Any, collation: str) -> str:
        """The column as it is, with ``collation``: the same type, nullability and default."""
        sql = f"{self.column_type} CHARACTER SET utf8mb4 COLLATE {collation}"
        if self.generation:
            # A generated column takes neither NULL nor DEFAULT on MariaDB.
            return f"{sql} AS ({self.generation}) {'STORED' if self.stored else 'VIRTUAL'}"
        sql += " NULL" if self.nullable else " NOT NULL"
        if self.default is not None:
            value = self.default if connection.mysql_is_mariadb else schema_editor.quote_value(
                self.default)
            sql += f" DEFAULT {value}"
        return sql


def _columns(connection: Any, table: str) -> dict[str, _Column]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, column_type, is_nullable, column_default, "
            "COALESCE(generation_expression, ''), extra FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = %s",
            [table],
        )
        return {
            name: _Column(name, column_type, nullable == "YES", default, generation or "",
                          "STORED" in (extra or "").upper())
            for name, column_type, nullable, default, generation, extra in cursor.fetchall()
        }


def make_exact(schema_editor: Any, tables: Mapping[str, Sequence[str]]) -> None:
    """Give the named columns of each table the binary collation, in one ``ALTER TABLE`` per
    table (each rebuilds the table once), keeping everything else about them."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = binary_collation(connection)
    quote = connection.ops.quote_name
    for table, names in tables.items():
        described = _columns(connection, table)
        changes = [
            f"MODIFY {quote(name)} {described[name].definition(connection, schema_editor, collation)}"
            for name in names
        ]
        if changes:
            schema_editor.execute(f"ALTER TABLE {quote(table)} {', '.join(changes)}")


def _run(apps: Any, schema_editor: Any, tables: Mapping[str, Sequence[str]]) -> None:
    make_exact(schema_editor, tables)


def exact_names(tables: Mapping[str, Sequence[str]]) -> migrations.RunPython:
    """A migration operation giving the named columns the binary collation on MariaDB/MySQL."""
    frozen = {table: tuple(names) for table, names in tables.items()}
    return migrations.RunPython(partial(_run, tables=frozen), migrations.RunPython.noop,
                                elidable=False)
