"""Open a DB-API connection from a ``DATABASE_URL``-style URL, without Django settings.

MariaDB/MySQL through mysqlclient, PostgreSQL through psycopg 3, SQLite through sqlite3:
the drivers Django uses, configured the way the queue expects (READ COMMITTED and utf8mb4
on MySQL, like the test settings and the documented Django settings). The URL is parsed by
django-environ, as Django settings parse it. The password never appears in an error or a
log line: :func:`redact` is the only way a URL is shown.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..db import sql as sqlb
from ..db import vendor as db_vendor
from ..exceptions import SQLQueueError
from .url_secrets import hide, password_of, redact

__all__ = ["ConnectFailed", "Connection", "django_connection", "open_connection", "parse_url",
           "redact"]

_ENGINES = {
    "django.db.backends.mysql": "mysql",
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.sqlite3": "sqlite",
}
CONNECT_TIMEOUT = 10  # seconds
SQLITE_BUSY_TIMEOUT = 20  # seconds a writer waits for SQLite's database lock


class ConnectFailed(SQLQueueError):
    """The database URL is unusable or the database cannot be reached."""


class Connection:
    """A DB-API connection that runs the store modules' SQL.

    SQL is written with ``%s`` placeholders; for SQLite they become ``?``. Every identifier
    goes through :meth:`q`, since ``offset`` is a reserved word on PostgreSQL and SQLite.
    The SQL fragments that differ between databases come from :mod:`django_sqlqueue.db.vendor`,
    as they do for Django connections. Statements run in a transaction ended by
    :meth:`commit` or :meth:`rollback` (or the :meth:`atomic` block).
    """

    def __init__(self, raw: Any, vendor: str, *, mariadb: bool = False) -> None:
        self.raw = raw
        self.vendor = vendor
        self._mariadb = mariadb

    @property
    def mysql_is_mariadb(self) -> bool:
        """Whether the server is MariaDB (named as on Django's MySQL connection)."""
        return self._mariadb

    @property
    def has_json_table(self) -> bool:
        """Whether a statement can join ``JSON_TABLE``: MariaDB 10.6 and later (MySQL 8
        has it too, but the statements using it are tested on MariaDB only)."""
        return self.mysql_is_mariadb and _version(self.raw.get_server_info()) >= (10, 6)

    # ------------------------------------------------------------------ SQL text

    def q(self, name: str) -> str:
        return db_vendor.quote(self, name)

    def now_ms_sql(self) -> str:
        """The database server's clock in epoch ms (see :func:`django_sqlqueue.db.vendor.now_ms_sql`)."""
        return db_vendor.now_ms_sql(self)

    def skip_locked_sql(self) -> str:
        return db_vendor.skip_locked_sql(self)

    def for_update_sql(self) -> str:
        return db_vendor.for_update_sql(self)

    def json_param_sql(self) -> str:
        return db_vendor.json_param_sql(self)

    def insert_ignore(self, conflict_columns: Sequence[str]) -> tuple[str, str]:
        """(prefix, suffix) of an INSERT that skips rows whose key is stored already."""
        return sqlb.insert_ignore(self, conflict_columns)

    # ------------------------------------------------------------------ running it

    def _sql(self, sql: str) -> str:
        return sql.replace("%s", "?") if self.vendor == "sqlite" else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return its row count."""
        cursor = self.raw.cursor()
        try:
            cursor.execute(self._sql(sql), tuple(params))
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = self.raw.cursor()
        try:
            cursor.execute(self._sql(sql), tuple(params))
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def warnings(self) -> list[tuple[int, str]]:
        """MySQL's warnings of the last statement, (code, message); [] elsewhere."""
        if self.vendor != "mysql" or not self.raw.warning_count():
            return []
        return [(int(code), message) for _level, code, message in self.fetch_all("SHOW WARNINGS")]

    def autocommits(self) -> bool:
        """Whether a statement run now commits on its own (no transaction is open)."""
        if self.vendor == "sqlite":
            return not self.raw.in_transaction
        return bool(getattr(self.raw, "autocommit", False)) if self.vendor == "postgresql" \
            else bool(self.raw.get_autocommit())

    def begin(self) -> None:
        # sqlite3 runs in autocommit mode here (isolation_level=None): take the write lock at
        # BEGIN, as the Django settings' IMMEDIATE transaction mode does, so two writers
        # queue on the busy timeout instead of failing on a lock upgrade.
        if self.vendor == "sqlite":
            self.raw.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        if self.vendor == "sqlite":
            if self.raw.in_transaction:
                self.raw.execute("COMMIT")
        else:
            self.raw.commit()

    def rollback(self) -> None:
        if self.vendor == "sqlite":
            if self.raw.in_transaction:
                self.raw.execute("ROLLBACK")
        else:
            self.raw.rollback()

    @contextlib.contextmanager
    def atomic(self) -> Iterator[Connection]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        self.begin()
        try:
            yield self
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DjangoConnection(Connection):
    """A Django database connection as a :class:`Connection`, so that Django code (the
    worker) runs the store modules' SQL in its own transactions.

    Statements go through Django's cursor, which takes ``%s`` on every backend, and
    :meth:`atomic` is Django's ``transaction.atomic``: inside the caller's atomic block it
    is a savepoint, as any Django query would be.
    """

    def __init__(self, using: str, wrapper: Any = None) -> None:
        from django.db import connections

        wrapper = wrapper or connections[using]
        super().__init__(wrapper, wrapper.vendor)
        self.using = using

    @property
    def mysql_is_mariadb(self) -> bool:
        # Asked only when a statement needs it: the first answer costs Django a query.
        return self.vendor == "mysql" and bool(self.raw.mysql_is_mariadb)

    @property
    def has_json_table(self) -> bool:
        return db_vendor.has_json_table(self.raw)

    def _sql(self, sql: str) -> str:
        return sql

    def warnings(self) -> list[tuple[int, str]]:
        if self.vendor != "mysql":
            return []
        self.raw.ensure_connection()
        if not self.raw.connection.warning_count():
            return []
        return [(int(code), message) for _level, code, message in self.fetch_all("SHOW WARNINGS")]

    def autocommits(self) -> bool:
        return bool(self.raw.get_autocommit()) and not self.raw.in_atomic_block

    def begin(self) -> None:
        raise NotImplementedError("use atomic(): Django manages this connection's transactions")

    commit = rollback = begin

    @contextlib.contextmanager
    def atomic(self) -> Iterator[Connection]:
        from django.db import transaction

        with transaction.atomic(using=self.using):
            yield self

    def close(self) -> None:
        """Django closes its own connections."""


def _version(server_info: str) -> tuple[int, ...]:
    """(10, 11, 9) of ``10.11.9-MariaDB-0+deb12u1``."""
    numbers = server_info.split("-", 1)[0].split(".")
    return tuple(int(n) for n in numbers if n.isdigit())


def django_connection(using: str, wrapper: Any = None) -> Connection:
    """The Django database alias ``using`` as a :class:`Connection`; ``wrapper``, a
    connection of that alias made by ``connections.create_connection``, instead of this
    thread's."""
    return DjangoConnection(using, wrapper)


def parse_url(url: str) -> dict[str, Any]:
    """django-environ's reading of ``url``: ENGINE, NAME, USER, PASSWORD, HOST, PORT."""
    if not isinstance(url, str) or not url:
        raise ConnectFailed("a database url is required, e.g. mysql://user:pass@host:3306/db")
    # Raised outside the except blocks, so the error keeps no __context__: django-environ's
    # message may quote a piece of the password ("Port could not be cast to integer value
    # as 'Tr0ub'"), and is shown only for a url without one.
    failure = None
    try:
        # Only the Spark data source and the archive job read urls: the spark extra
        # installs django-environ, and nothing else of the package needs it.
        import environ
    except ImportError:
        raise ConnectFailed("reading a database url needs django-environ: "
                            "pip install 'django-sqlqueue[spark]'") from None
    try:
        config = dict(environ.Env.db_url_config(url))
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad url
        failure = (f"{type(exc).__name__}; percent-encode the password's special characters "
                   "('/' as %2F, '?' as %3F)" if password_of(url) else hide(str(exc), url))
    if failure is not None:
        raise ConnectFailed(f"cannot read the database url {redact(url)!r}: {failure}")
    if config.get("ENGINE") not in _ENGINES:
        raise ConnectFailed(
            f"the database url {redact(url)!r} is not a MariaDB/MySQL, PostgreSQL or SQLite "
            "url (mysql://, postgres://, sqlite:///)")
    return config


def open_connection(url: str) -> Connection:
    """Connect to the queue's database named by ``url`` (``DATABASE_URL`` format)."""
    config = parse_url(url)
    vendor = _ENGINES[config["ENGINE"]]
    opener: Callable[[dict[str, Any]], Connection] = {
        "mysql": _open_mysql, "postgresql": _open_postgresql, "sqlite": _open_sqlite,
    }[vendor]
    try:
        return opener(config)
    except ConnectFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - said once, without the password
        failure = f"{type(exc).__name__}: {hide(str(exc), url)}"
    # Raised out here, with no __context__: the driver's exception (and its traceback's
    # locals) may carry the connection parameters, the password among them.
    raise ConnectFailed(f"cannot connect to {redact(url)}: {failure}")


def _open_mysql(config: dict[str, Any]) -> Connection:
    import MySQLdb  # mysqlclient, as Django uses

    kwargs: dict[str, Any] = {
        "db": config.get("NAME") or "", "user": config.get("USER") or "",
        "passwd": config.get("PASSWORD") or "", "host": config.get("HOST") or "localhost",
        "charset": "utf8mb4", "connect_timeout": CONNECT_TIMEOUT, "autocommit": False,
    }
    if config.get("PORT"):
        kwargs["port"] = int(config["PORT"])
    raw = MySQLdb.connect(**kwargs)
    cursor = raw.cursor()
    # READ COMMITTED, as the queue's Django settings use: a plain read sees rows committed
    # since the transaction began, and INSERT … SELECT reads without locks.
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cursor.close()
    return Connection(raw, "mysql", mariadb="mariadb" in raw.get_server_info().lower())


def _open_postgresql(config: dict[str, Any]) -> Connection:
    import psycopg

    kwargs: dict[str, Any] = {
        "dbname": config.get("NAME") or "", "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None, "host": config.get("HOST") or None,
        "connect_timeout": CONNECT_TIMEOUT,
    }
    if config.get("PORT"):
        kwargs["port"] = int(config["PORT"])
    return Connection(psycopg.connect(**{k: v for k, v in kwargs.items() if v is not None}),
                      "postgresql")


def _open_sqlite(config: dict[str, Any]) -> Connection:
    name = str(config.get("NAME") or "")
    if not name or name == ":memory:":
        raise ConnectFailed("a SQLite queue needs a database file (sqlite:////path/db.sqlite3)")
    raw = sqlite3.connect(name, timeout=SQLITE_BUSY_TIMEOUT, isolation_level=None,
                          check_same_thread=False)
    raw.execute("PRAGMA journal_mode=WAL")
    return Connection(raw, "sqlite")
