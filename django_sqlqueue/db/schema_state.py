"""Whether this app's tables are migrated on a database, said in one line.

The worker, ``manage.py sqlqueue`` and the admin's pages ask :func:`migrate_line` once
before they touch the queue tables, and :func:`is_missing_schema` about a database error
met later (a table dropped, a column a pending migration adds): either way the operator
reads one line naming ``manage.py migrate`` instead of a traceback.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router

from ..conf import queue_database
from ..exceptions import SQLQueueError
from .errors import _codes

APP_LABEL = "django_sqlqueue"
# MySQL/MariaDB: unknown table, unknown column. PostgreSQL SQLSTATEs: undefined table,
# undefined column.
_MYSQL_MISSING = {1146, 1054}
_PG_MISSING = {"42P01", "42703"}
_SQLITE_MISSING = ("no such table", "no such column", "has no column named")


class NotMigrated(SQLQueueError):
    """The queue tables on this database are missing or behind this app's migrations."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def migrate_line(using: str | None = None) -> str | None:
    """None when every migration of this app is applied on ``using``; else one line saying
    how many are not and naming ``manage.py migrate``. Reads the migration files and the
    ``django_migrations`` table once (no queue table is touched)."""
    using = using or queue_database()
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[using]
    executor = MigrationExecutor(connection)
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    plan = executor.migration_plan(targets)
    pending = [migration for migration, backwards in plan
               if not backwards and migration.app_label == APP_LABEL]
    if not pending:
        return None
    return not_migrated_line(using, len(pending))


def not_migrated_line(using: str | None = None, pending: int | None = None) -> str:
    """The one line: ``pending`` unapplied migrations, or (None) tables found missing."""
    using = using or queue_database()
    what = (f"{pending} unapplied migration(s) of {APP_LABEL}" if pending is not None
            else f"the queue tables of {APP_LABEL} are missing or out of date")
    where = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"  # migrate's default
    return (f"database {using!r} is not ready for the queue: {what}; run "
            f"'python manage.py migrate{where}' to apply them")


def check_migrated(using: str | None = None) -> None:
    """Raise :class:`NotMigrated` (its message the one line) unless ``using`` is migrated."""
    using = using or queue_database()
    line = migrate_line(using)
    if line is not None:
        raise NotMigrated(line)


def holds_queue_table(using: str, table: str) -> bool:
    """Whether ``migrate`` puts the app's tables on ``using`` (the routers allow it) and
    ``table`` is there: a ``post_migrate`` receiver leaves another database alone, even
    one holding an old copy of the tables from before the queue moved."""
    return (bool(router.allow_migrate(using, APP_LABEL))
            and table in connections[using].introspection.table_names())


def is_missing_schema(exc: BaseException) -> bool:
    """Whether ``exc`` says a table or column does not exist (a migration not applied)."""
    if not isinstance(exc, DatabaseError):
        return False
    code, sqlstate = _codes(exc)
    if code in _MYSQL_MISSING or sqlstate in _PG_MISSING:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _SQLITE_MISSING)
