"""Wake-up on commit: PostgreSQL's LISTEN/NOTIFY, the one backend that can push.

Publishing sends ``pg_notify('sqlqueue', <topic>)`` inside the publishing transaction, so
the notification is delivered when (and only if) the messages commit. The payload is the
topic only: a notification says "look now", never what to read, and polling stays the
path that finds every message (a notification lost, or a listener reconnecting, costs at
most one poll interval).

A ``publish()`` in autocommit notifies from its INSERT itself (``RETURNING …,
pg_notify()``), at no extra round trip. Inside a transaction it is one NOTIFY per
transaction and topic, however many messages: the topics already announced in the current
transaction are remembered by a no-op ``on_commit`` hook each. Django forgets a hook when
the transaction (or the savepoint it was registered in) rolls back, which is exactly when
PostgreSQL discards the notification, so a hook still pending means "already announced in
this transaction". The server folds duplicates within a transaction anyway; this only
saves the statements.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings

CHANNEL = "sqlqueue"
APPLICATION_NAME_LENGTH = 63  # PostgreSQL's NAMEDATALEN - 1


class _Announced:
    """The on_commit hook marking a topic announced in the current transaction."""

    __slots__ = ()

    def __call__(self) -> None:
        return None


def enabled(connection: BaseDatabaseWrapper) -> bool:
    """Whether this connection's database pushes notifications and ``NOTIFY`` is on."""
    return connection.vendor == "postgresql" and get_settings().notify is True


def statement_channel(using: str) -> str | None:
    """The channel an INSERT should notify by itself (``RETURNING …, pg_notify()``): in
    autocommit the statement is the transaction, so that costs no round trip. None inside
    a transaction (:func:`announce` then, once per topic) or without notifications."""
    connection = connections[using]
    if enabled(connection) and not connection.in_atomic_block:
        return CHANNEL
    return None


def announce(topics: Iterable[str], using: str) -> None:
    """Notify listeners of ``topics`` when the current transaction commits (at once in
    autocommit, where the messages have committed already)."""
    connection = connections[using]
    if not enabled(connection):
        return
    in_transaction = connection.in_atomic_block
    marks: dict[str, _Announced] = connection.__dict__.setdefault("_sqlqueue_announced", {})
    if in_transaction:
        pending = {id(hook) for _, hook, *_ in connection.run_on_commit}
        new = sorted({t for t in topics if id(marks.get(t)) not in pending})
    else:
        new = sorted(set(topics))
    if not new:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(new)),
                       [value for topic in new for value in (CHANNEL, topic)])
    if in_transaction:
        for topic in new:
            marks[topic] = hook = _Announced()
            connection.on_commit(hook)


def listener_connection(using: str, name: str) -> Any:
    """A new autocommit psycopg 3 connection of its own that LISTENs on the channel, named
    ``name`` in ``pg_stat_activity.application_name``; None when the driver cannot wait
    for notifications (psycopg2)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return None
    import psycopg

    params = connections.create_connection(using).get_connection_params()
    params["application_name"] = name[:APPLICATION_NAME_LENGTH]
    params["autocommit"] = True
    raw = psycopg.Connection.connect(**params)
    raw.execute(f"LISTEN {CHANNEL}")
    return raw
