"""Server-side bounds on the worker's own database session.

The poll cycle share-locks the worker's lease rows for the length of its transaction, and
other workers skip locked lease rows when they look for partitions to take. A worker
frozen inside that transaction (SIGSTOP, a VM paused, a network partition) would keep
every one of its partitions from the others until the server dropped the connection. So
the worker asks the server to end any transaction of its session that stays idle for
longer than a lease: by then the lease may be taken over anyway, and ending the session
releases the locks. MariaDB (``idle_transaction_timeout``) and PostgreSQL
(``idle_in_transaction_session_timeout``) can; MySQL and SQLite cannot, see
docs/consuming.md.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from django.db import connections


class SessionBounds:
    """Applies the bounds to the worker thread's connection, again after each reconnect."""

    def __init__(self, using: str, idle_transaction_seconds: float) -> None:
        self.using = using
        self.seconds = max(1, math.ceil(idle_transaction_seconds))
        self._applied_to: Any = None  # the DB-API connection the bounds were set on

    def ensure(self) -> None:
        """Set the bounds if this thread's connection is new since the last call."""
        connection = connections[self.using]
        connection.ensure_connection()
        raw = connection.connection
        if raw is self._applied_to:
            return
        sql = self._statement(connection)
        if sql:
            with connection.cursor() as cursor:
                cursor.execute(sql)
        self._applied_to = raw

    def release(self) -> None:
        """Put the session's defaults back (a worker run in-process shares its thread's
        connection with the code that called it)."""
        connection = connections[self.using]
        if connection.connection is None or connection.connection is not self._applied_to:
            return
        sql = self._statement(connection, "DEFAULT")
        if sql:
            with contextlib.suppress(Exception), connection.cursor() as cursor:
                cursor.execute(sql)
        self._applied_to = None

    def _statement(self, connection: Any, value: str | None = None) -> str:
        if connection.vendor == "postgresql":
            return ("SET idle_in_transaction_session_timeout = "
                    f"{value or self.seconds * 1000}")
        if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
            return f"SET SESSION idle_transaction_timeout = {value or self.seconds}"
        return ""
