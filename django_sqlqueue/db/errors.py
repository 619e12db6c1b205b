"""Which database errors are transient (retry) rather than bugs (raise), and which failures
to reach a database are worth waiting out."""

from __future__ import annotations

import re
from typing import Any

from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError

# MySQL/MariaDB error codes of a lost or refused connection: server gone away, lost
# connection, cannot connect, server shutdown in progress, connection killed.
_MYSQL_DISCONNECT = {2006, 2013, 2002, 2003, 1053, 1927, 4031}
# ... and of contention, worth retrying on the same connection: deadlock, lock wait timeout.
_MYSQL_CONTENTION = {1213, 1205}
# PostgreSQL SQLSTATEs: connection errors, admin shutdown, cannot connect now ...
_PG_DISCONNECT_PREFIXES = ("08", "57P01", "57P02", "57P03")
# ... and serialization failure, deadlock, lock not available (a lock_timeout ran out).
_PG_CONTENTION = ("40001", "40P01", "55P03")
_MYSQL_CHECK_FAILED = 4025  # a CHECK constraint refused a row (MariaDB)
# Refusals no retry cures. MySQL/MariaDB: access denied to a database, access denied for a
# user, unknown database. PostgreSQL: wrong password, not authorized (no such role, no
# pg_hba.conf entry), unknown database; psycopg gives no SQLSTATE for a failed connection
# attempt, so the server's message is read too.
_MYSQL_REFUSED = {1044, 1045, 1049}
_PG_REFUSED = {"28P01", "28000", "3D000"}
_REFUSED_TEXT = re.compile(
    r"access denied|unknown database|authentication failed|no pg_hba\.conf entry"
    r'|(database|role) "[^"]*" does not exist')


def is_disconnect(exc: BaseException) -> bool:
    """True when the connection is gone (a database restart, a killed session)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    code, sqlstate = _codes(exc)
    if code in _MYSQL_DISCONNECT:
        return True
    if sqlstate is not None and sqlstate.startswith(_PG_DISCONNECT_PREFIXES):
        return True
    text = str(exc).lower()
    return isinstance(exc, OperationalError) and (
        "connection" in text or "server closed" in text or "terminating" in text
    )


def is_transient(exc: BaseException) -> bool:
    """True for deadlocks, lock timeouts, a locked SQLite file and lost connections."""
    if is_disconnect(exc):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    code, sqlstate = _codes(exc)
    if code in _MYSQL_CONTENTION or sqlstate in _PG_CONTENTION:
        return True
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def is_refusal(exc: BaseException) -> bool:
    """True when the server answered and refused us: bad credentials, no access, an unknown
    database. Waiting does not help; fix the settings."""
    if not isinstance(exc, DatabaseError):
        return False
    code, sqlstate = _codes(exc)
    if code in _MYSQL_REFUSED or sqlstate in _PG_REFUSED:
        return True
    return bool(_REFUSED_TEXT.search(str(exc).lower()))


def is_unreachable(exc: BaseException, vendor: str) -> bool:
    """True when connecting to (or a first query on) a ``vendor`` database failed in a way
    a later try may not: refused, reset, timed out, a server gone, starting, shutting down
    or failing over, or a socket error the driver did not wrap (an ``OSError`` such as
    EINVAL from a proxy dropping the connection mid-handshake). False for a refusal (see
    :func:`is_refusal`), for errors that are not about reaching the database, and on SQLite
    for anything but a locked file (a file that cannot be opened will not open later)."""
    if is_refusal(exc):
        return False
    if isinstance(exc, OSError) or is_transient(exc):
        return True
    return vendor != "sqlite" and isinstance(exc, OperationalError | InterfaceError)


def check_refusal(connection: Any, exc: BaseException) -> str | None:
    """Why a CHECK constraint refused a row, when that undid only the failed statement and
    the transaction goes on; else None.

    Django's JSON columns carry a JSON check on MariaDB (which refuses nesting deeper than
    31 levels) and on SQLite (deeper than 2,000 levels). PostgreSQL's jsonb has no such
    check, and any error there aborts the whole transaction.
    """
    if not isinstance(exc, IntegrityError):
        return None
    if connection.vendor == "mysql":
        code, _ = _codes(exc)
        if code == _MYSQL_CHECK_FAILED:
            args = (exc.__cause__ or exc).args
            return str(args[1]) if len(args) > 1 else str(exc)
    elif connection.vendor == "sqlite" and str(exc).startswith("CHECK constraint failed"):
        return str(exc)
    return None


def _codes(exc: DatabaseError) -> tuple[int | None, str | None]:
    """(MySQL error code, PostgreSQL SQLSTATE) of the driver error behind ``exc``."""
    cause = exc.__cause__ or exc
    args = getattr(cause, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return code, sqlstate if isinstance(sqlstate, str) else None
