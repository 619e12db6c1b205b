"""Liveness locks: a lock a worker's own database session holds, which the server releases
the moment that session ends (the process died, its connection closed).

PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) whose 64-bit key is the
first 16 hex digits of the worker process's token; others look it up in ``pg_locks``.
MariaDB/MySQL: a named lock (``GET_LOCK``) called ``sqlqueue-liveness-<token>``, looked
up with ``IS_USED_LOCK``. SQLite runs inside each process and has no server session: a
worker there is judged by its lease alone.

Other sessions only look at a lock, never take it, so a worker that lost its liveness
connection can always take its own lock again under the same token.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings, queue_aliases
from . import pooling
from .vendor import Vendored

LOCK_PREFIX = "sqlqueue-liveness-"  # MariaDB/MySQL lock names: this and the token (50 chars)
TOKEN_RE = re.compile(r"[0-9a-f]{32}")  # a worker process's token (uuid4().hex)


# --------------------------------------------------------------------------- the connection


def liveness_settings(using: str) -> dict[str, Any]:
    """The ``DATABASES`` entry the liveness connection of a worker on ``using`` opens."""
    return dict(settings.DATABASES[pooling.session_alias(using) or using])


def liveness_connection(using: str) -> BaseDatabaseWrapper:
    """A new connection of its own, for a worker on ``using`` to hold its liveness lock on.

    The one place that says where that connection goes (with :func:`liveness_settings`):
    a session lock must live on a server session of its own, so behind a transaction
    pooler this is where a direct connection would be named.
    """
    return connections.create_connection(pooling.session_alias(using) or using)


def fallback_reason(using: str) -> str | None:
    """Why workers on ``using`` are judged by their leases alone (no liveness lock), or
    None when they hold one."""
    if get_settings().liveness is False:
        return "SQLQUEUE['LIVENESS'] is False"
    if using not in settings.DATABASES:
        return f"DATABASES has no alias {using!r}"
    if pooling.session_alias(using) is None:
        # There a session lock would stay with a pooled server connection, whoever holds it.
        return (f"DATABASES[{using!r}] sets DISABLE_SERVER_SIDE_CURSORS, as behind a "
                "transaction pooler, and SQLQUEUE['DIRECT_DATABASE'] names no direct "
                "connection")
    config = liveness_settings(using)
    engine = str(config.get("ENGINE", ""))
    if "sqlite3" in engine:
        return "SQLite has no server session a lock could belong to"
    if "postgresql" not in engine and "mysql" not in engine:
        return f"the {engine or 'unknown'} backend has no session locks"
    return None


def judged_by_locks(using: str) -> bool:
    """Whether a reader on ``using`` counts a worker live only while its liveness lock is
    held, so a killed worker drops out at once rather than once its heartbeat ages: where
    workers hold locks, and read on the queue's own server (a replica cannot see the
    primary's locks)."""
    return using in queue_aliases() and fallback_reason(using) is None


# --------------------------------------------------------------------------- the holder's side


def take(connection: BaseDatabaseWrapper, token: str) -> bool:
    """Take the liveness lock of ``token`` on ``connection`` without waiting; False when
    another session holds it (this worker's previous one, not yet ended by the server)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [advisory_key(token)])
        else:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [lock_name(token)])
        return bool(cursor.fetchone()[0])


def holds(connection: BaseDatabaseWrapper, token: str) -> bool:
    """Whether the session of ``connection`` itself holds the lock of ``token``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {_ADVISORY} "  # noqa: S608 - constant SQL, values bound
                f"AND l.pid = pg_backend_pid() AND {_LOCK_KEY} = %s)",
                [advisory_key(token)])
        else:
            cursor.execute("SELECT COALESCE(IS_USED_LOCK(%s) = CONNECTION_ID(), 0)",
                           [lock_name(token)])
        return bool(cursor.fetchone()[0])


def release(connection: BaseDatabaseWrapper, token: str) -> None:
    """Release the lock of ``token`` held on ``connection`` (closing it would too)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_unlock(%s)", [advisory_key(token)])
        else:
            cursor.execute("SELECT RELEASE_LOCK(%s)", [lock_name(token)])


def advisory_key(token: str) -> int:
    """PostgreSQL's 64-bit advisory key of ``token``: its first 16 hex digits, signed."""
    return int.from_bytes(bytes.fromhex(_checked(token)[:16]), "big", signed=True)


def lock_name(token: str) -> str:
    """The MariaDB/MySQL lock name of ``token`` (at most 64 characters, as MySQL allows)."""
    return LOCK_PREFIX + _checked(token)


def _checked(token: str) -> str:
    if not TOKEN_RE.fullmatch(token):
        raise ValueError(f"a liveness token is 32 lowercase hex digits, got {token!r}")
    return token


# --------------------------------------------------------------------------- everyone else's side

# pg_locks shows a bigint advisory key as two 32-bit halves (classid, objid), objsubid 1.
_ADVISORY = "l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
_LOCK_KEY = "((l.classid::int8 << 32) | l.objid::int8)"


def held_sql(connection: Vendored, column: str) -> str:
    """SQL that is true when some session holds the lock of the token in ``column`` (a
    quoted column holding a token, never empty where this is evaluated)."""
    if connection.vendor == "postgresql":
        # rpad: never a cast error, whatever order the server evaluates the terms in.
        key = f"('x' || rpad(substr({column}, 1, 16), 16, '0'))::bit(64)::int8"
        return (f"({key} IN (SELECT {_LOCK_KEY} FROM pg_locks l WHERE {_ADVISORY} "  # noqa: S608 - constant SQL and a quoted column
                "AND l.database = (SELECT d.oid FROM pg_database d "
                "WHERE d.datname = current_database())))")
    if connection.vendor == "mysql":
        return f"(IS_USED_LOCK(CONCAT('{LOCK_PREFIX}', {column})) IS NOT NULL)"
    raise NotImplementedError(f"no liveness locks on {connection.vendor!r}")


def alive_sql(connection: Vendored, column: str) -> str:
    """SQL that is false only for a row whose ``column`` names a token nobody holds the
    lock of: a worker whose session ended. A row without a token is alive (its worker
    holds no lock: judged by its lease)."""
    return f"({column} = '' OR {held_sql(connection, column)})"


def dead_holder_sql(connection: Vendored, liveness_column: str, token_column: str) -> str:
    """SQL that is true for a lease whose holder advertised its liveness lock under its
    own token and no session holds that lock any more: the holder's process is gone."""
    return (f"({liveness_column} <> '' AND {liveness_column} = {token_column} "
            f"AND NOT {held_sql(connection, liveness_column)})")


def seen_held(connection: BaseDatabaseWrapper, token: str) -> bool:
    """Whether ``connection`` sees some session hold the lock of ``token``: what every
    other worker will see (a worker checks it of its own lock before advertising it)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {held_sql(connection, '%s')}", [_checked(token)])
        return bool(cursor.fetchone()[0])
