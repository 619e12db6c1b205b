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

The other way round, the worker waits for a lock another transaction holds (an operator's
``repartition`` or ``forget``, a forgotten transaction) at most a quarter of a lease
(never more than LOCK_WAIT): the cycle then fails for the partitions it touched, is
retried without them, and the lease renewals never stop meanwhile.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from django.db import connections

from ..db import pooling, vendor

LOCK_WAIT = 2.0  # seconds, the longest wait for a lock of the worker's poll loop


class SessionBounds:
    """Applies the bounds to the worker thread's connection, again after each reconnect."""

    def __init__(self, using: str, idle_transaction_seconds: float) -> None:
        self.using = using
        self.seconds = max(1, math.ceil(idle_transaction_seconds))
        self.lock_wait = min(LOCK_WAIT, idle_transaction_seconds / 4)
        self._applied_to: Any = None  # the DB-API connection the bounds were set on

    def ensure(self) -> None:
        """Set the bounds if this thread's connection is new since the last call."""
        connection = connections[self.using]
        connection.ensure_connection()
        raw = connection.connection
        if raw is self._applied_to:
            return
        with connection.cursor() as cursor:
            for sql in self._statements(connection):
                cursor.execute(sql)
        self._applied_to = raw

    def release(self) -> None:
        """Put the session's defaults back (a worker run in-process shares its thread's
        connection with the code that called it)."""
        connection = connections[self.using]
        if connection.connection is None or connection.connection is not self._applied_to:
            return
        with contextlib.suppress(Exception), connection.cursor() as cursor:
            for sql in self._statements(connection, default=True):
                cursor.execute(sql)
        self._applied_to = None

    def _statements(self, connection: Any, default: bool = False) -> list[str]:
        if pooling.pooled(self.using):
            # A SET would stay with whichever server session ran it. Behind a transaction
            # pooler its own idle_transaction_timeout bounds an idle transaction instead
            # (docs/operating.md), and lock waits are not bounded.
            return []
        statements = vendor.lock_timeout_sql(connection, None if default else self.lock_wait)
        if connection.vendor == "postgresql":
            statements.append("SET idle_in_transaction_session_timeout = "
                              f"{'DEFAULT' if default else self.seconds * 1000}")
        elif connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
            statements.append("SET SESSION idle_transaction_timeout = "
                              f"{'DEFAULT' if default else self.seconds}")
        return statements
