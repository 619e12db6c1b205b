"""Transaction poolers (PgBouncer's ``pool_mode = transaction``) in front of PostgreSQL.

Behind such a pooler each transaction may run on another server session, so nothing may
rely on a session outliving its transaction: a ``LISTEN``, a session advisory lock, a
``SET`` outside a transaction, a prepared statement. An alias is taken to go through one
when its ``DATABASES`` entry sets ``DISABLE_SERVER_SIDE_CURSORS`` (what Django requires
there anyway). What needs a session of its own then uses ``SQLQUEUE["DIRECT_DATABASE"]``,
an alias reaching the same database without the pooler; without it, wake-up on commit
falls back to polling and a killed worker is noticed by its lease alone.
"""

from __future__ import annotations

from django.conf import settings

from ..conf import get_settings


def pooled(using: str) -> bool:
    """Whether ``using`` is a PostgreSQL alias behind a transaction pooler."""
    config = settings.DATABASES.get(using) or {}
    return "postgresql" in str(config.get("ENGINE", "")) and bool(
        config.get("DISABLE_SERVER_SIDE_CURSORS"))


def session_alias(using: str) -> str | None:
    """The alias a session of its own for the queue on ``using`` is opened on (the
    wake-up listener, the liveness lock): ``DIRECT_DATABASE`` when set, else ``using``
    itself unless it goes through a transaction pooler (then None: no such session)."""
    direct = get_settings().direct_database
    if direct:
        return str(direct)
    return None if pooled(using) else using
