"""Which database errors are transient (retry) rather than bugs (raise)."""

from __future__ import annotations

from django.db import DatabaseError, InterfaceError, OperationalError

# MySQL/MariaDB error codes worth retrying: deadlock, lock wait timeout, server gone away,
# lost connection, cannot connect, server shutdown in progress, connection killed.
_MYSQL_TRANSIENT = {1213, 1205, 2006, 2013, 2002, 2003, 1053, 1927, 4031}
# PostgreSQL SQLSTATE classes/codes: serialization failure, deadlock, connection errors,
# admin shutdown, cannot connect now.
_PG_TRANSIENT_PREFIXES = ("08", "40001", "40P01", "57P01", "57P02", "57P03")


def is_transient(exc: BaseException) -> bool:
    """True for deadlocks, lock timeouts, a locked SQLite file and lost connections."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__ or exc
    args = getattr(cause, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_TRANSIENT:
        return True
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(_PG_TRANSIENT_PREFIXES):
        return True
    text = str(exc).lower()
    if "database is locked" in text or "database table is locked" in text:
        return True
    return isinstance(exc, OperationalError) and (
        "connection" in text or "server closed" in text or "terminating" in text
    )
