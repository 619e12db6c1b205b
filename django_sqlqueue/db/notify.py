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

PostgreSQL serializes every notifying commit of the server on one lock, so notifying on
each commit would cap concurrent publishers. A process therefore notifies a topic at most
once per ``INTERVAL`` from its publishing transactions; a commit that skipped its
notification owes one, which a small thread of this process sends ``INTERVAL`` later on
its own connection, after that commit (so the wake-up it causes finds the message). An
idle system notifies every commit at once; under load each topic costs a process about
two notifying commits per interval, and a message waits at most ``INTERVAL`` more.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings
from ..logtext import loggable
from . import pooling

logger = logging.getLogger("django_sqlqueue.publish")

CHANNEL = "sqlqueue"
APPLICATION_NAME_LENGTH = 63  # PostgreSQL's NAMEDATALEN - 1
# Seconds: a process notifies a topic from its publishing transactions at most once per
# interval; the commits in between are announced by one notification at its end. Short
# next to the listener's own folding (30 ms), long next to a commit under load.
INTERVAL = 0.01
IDLE_EXIT = 5.0  # seconds with nothing owed before the sending thread closes and ends


class _Announced:
    """The on_commit hook marking a topic announced in the current transaction; when its
    notification was skipped, it owes one once the transaction commits."""

    __slots__ = ("topic", "using")

    def __init__(self, using: str = "", topic: str = "") -> None:
        self.using, self.topic = using, topic

    def __call__(self) -> None:
        if self.topic:
            _throttle.owe(self.using, [self.topic])


class _Throttle:
    """When this process last notified each (database, topic), and the notifications its
    commits owe, sent by a thread of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owing = threading.Condition(self.lock)
        self.last: dict[tuple[str, str], float] = {}
        self.owed: set[tuple[str, str]] = set()
        self.thread: threading.Thread | None = None
        self.closing = False
        self.skipped = 0  # notifications skipped (owed instead), for tests and benchmarks
        self.sent_owed = 0  # notifications the thread sent for them

    def due(self, using: str, topic: str) -> bool:
        """Whether to notify ``topic`` now; if so, it counts as notified from now."""
        now = time.monotonic()
        with self.lock:
            if now - self.last.get((using, topic), -INTERVAL) < INTERVAL:
                self.skipped += 1
                return False
            self.last[(using, topic)] = now
            return True

    def owe(self, using: str, topics: Iterable[str]) -> None:
        """Notify ``topics`` within INTERVAL: their messages have committed unannounced."""
        with self.lock:
            self.owed.update((using, topic) for topic in topics)
            if self.thread is None:
                self.thread = threading.Thread(target=self._send_owed, daemon=True,
                                               name="sqlqueue-notify")
                self.thread.start()
            self.owing.notify()

    def _send_owed(self) -> None:
        used: set[str] = set()
        try:
            while True:
                with self.lock:
                    if not self.owed and not self.closing:
                        self.owing.wait(IDLE_EXIT)
                    if not self.owed:
                        self.thread = None
                        return
                # Commits owed meanwhile ride along; the rate stays one per interval.
                time.sleep(INTERVAL)
                with self.lock:
                    owed, self.owed = self.owed, set()
                    now = time.monotonic()
                    for key in owed:
                        self.last[key] = now
                    self.sent_owed += len(owed)
                for using in sorted({using for using, _ in owed}):
                    used.add(using)
                    _send(using, sorted(topic for alias, topic in owed if alias == using))
        finally:
            for using in used:
                connections[using].close()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is owed now and end the thread (its connection closed with it)."""
        with self.lock:
            thread, self.closing = self.thread, True
            self.owing.notify()
        try:
            if thread is not None:
                thread.join(timeout)
        finally:
            with self.lock:
                self.closing = False

    def reset(self) -> None:
        """After a fork: the parent's thread and lock are not the child's."""
        self.__init__()  # type: ignore[misc]


_throttle = _Throttle()
os.register_at_fork(after_in_child=_throttle.reset)


def _send(using: str, topics: list[str]) -> None:
    """NOTIFY ``topics`` now, in a transaction of their own."""
    try:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(topics)),
                           [value for topic in topics for value in (CHANNEL, topic)])
    except Exception as exc:  # noqa: BLE001 - polling finds the messages anyway
        logger.warning("owed notification not sent (polling finds the messages) topics=%s "
                       "error=%s: %s", ",".join(topics), type(exc).__name__,
                       loggable(exc, 200))
        connections[using].close()


def close() -> None:
    """Send the notifications this process owes, and close the connection they use (a
    test database about to be dropped, a process about to end)."""
    _throttle.close()


def enabled(connection: BaseDatabaseWrapper) -> bool:
    """Whether this connection's database pushes notifications and ``NOTIFY`` is on."""
    return connection.vendor == "postgresql" and get_settings().notify is True


def statement_channel(using: str, topic: str) -> str | None:
    """The channel an INSERT of ``topic`` should notify by itself (``RETURNING …,
    pg_notify()``): in autocommit the statement is the transaction, so that costs no round
    trip. None inside a transaction, when ``topic`` was notified less than INTERVAL ago,
    or without notifications: call :func:`announce` after the INSERT then."""
    connection = connections[using]
    if enabled(connection) and not connection.in_atomic_block and _throttle.due(using, topic):
        return CHANNEL
    return None


def announce(topics: Iterable[str], using: str) -> None:
    """Notify listeners of ``topics`` when the current transaction commits, or within
    INTERVAL when a notification of the topic was sent less than INTERVAL ago (in
    autocommit, where the messages have committed already, always within INTERVAL)."""
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
    if not in_transaction:
        # Committed already (publish() gets here when its INSERT skipped the notification):
        # owed, sent within INTERVAL, at no round trip on this connection.
        _throttle.owe(using, new)
        return
    now = [topic for topic in new if _throttle.due(using, topic)]
    if now:
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(now)),
                           [value for topic in now for value in (CHANNEL, topic)])
    for topic in new:
        marks[topic] = hook = _Announced(using, "" if topic in now else topic)
        connection.on_commit(hook)


def listener_connection(using: str, name: str) -> Any:
    """A new autocommit psycopg 3 connection of its own that LISTENs on the channel, named
    ``name`` in ``pg_stat_activity.application_name``, opened on the direct alias when
    ``using`` goes through a transaction pooler (see :mod:`.pooling`); None when the
    driver cannot wait for notifications (psycopg2) or there is no direct connection."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    alias = pooling.session_alias(using)
    if not is_psycopg3 or alias is None:
        return None
    import psycopg

    params = connections.create_connection(alias).get_connection_params()
    params["application_name"] = name[:APPLICATION_NAME_LENGTH]
    params["autocommit"] = True
    raw = psycopg.Connection.connect(**params)
    raw.execute(f"LISTEN {CHANNEL}")
    return raw
