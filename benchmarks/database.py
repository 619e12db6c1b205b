"""Database plumbing shared by the benchmarks: create the bench database, raw driver
connections for the baselines, emptying the queue tables, MariaDB status counters.

Nothing here needs Django to be set up, so it can run before ``django.setup()`` and in
the baselines' child processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

QUEUE_TABLES = (
    "queue_messages",
    "queue_delivery_state",
    "queue_partition_leases",
    "queue_offsets",
    "queue_subscriber_heartbeats",
    "queue_sequencer",
    "queue_topics",
    "queue_group_controls",
    "queue_throughput",
    "queue_schedules",
)

MYSQL = "django.db.backends.mysql"
POSTGRES = "django.db.backends.postgresql"
SQLITE = "django.db.backends.sqlite3"


def vendor(db: Mapping[str, Any]) -> str:
    return {MYSQL: "mysql", POSTGRES: "postgresql", SQLITE: "sqlite"}[db["ENGINE"]]


def label(db: Mapping[str, Any]) -> str:
    return {"mysql": "MariaDB/MySQL", "postgresql": "PostgreSQL", "sqlite": "SQLite"}[vendor(db)]


def _mysql_kwargs(db: Mapping[str, Any], with_db: bool = True) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"user": db.get("USER") or "root", "charset": "utf8mb4"}
    if db.get("PASSWORD"):
        kwargs["password"] = db["PASSWORD"]
    host = db.get("HOST") or "localhost"
    if host.startswith("/"):
        kwargs["unix_socket"] = host
    else:
        kwargs["host"] = host
    if db.get("PORT"):
        kwargs["port"] = int(db["PORT"])
    if with_db:
        kwargs["database"] = db["NAME"]
    return kwargs


def _postgres_kwargs(db: Mapping[str, Any], dbname: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dbname": dbname}
    for key, name in (("HOST", "host"), ("PORT", "port"), ("USER", "user"),
                      ("PASSWORD", "password")):
        if db.get(key):
            kwargs[name] = db[key]
    # A multi-host URL (a primary and its replicas) names the server to pick this way.
    options = db.get("OPTIONS") or {}
    if options.get("target_session_attrs"):
        kwargs["target_session_attrs"] = options["target_session_attrs"]
    return kwargs


def own_database(db: dict[str, Any], name: str, repo_root: Path,
                 sqlite_timeout: int = 20) -> dict[str, Any]:
    """``db`` (a DATABASES entry parsed from a URL) renamed to a database of its own,
    ``name``: on MariaDB/MySQL and PostgreSQL a database of that name on the same server; on
    SQLite ``<name>.sqlite3`` next to the configured file (or in ``.test-data``). The
    benchmarks and the chaos run use it so they never touch anybody's data."""
    engine = db["ENGINE"]
    if engine == SQLITE:
        configured = Path(str(db.get("NAME") or "")).expanduser()
        folder = configured.parent if str(configured) not in ("", ".", ":memory:") \
            else repo_root / ".test-data"
        if not folder.is_absolute():
            folder = repo_root / folder
        db["NAME"] = str(folder / f"{name}.sqlite3")
        db.setdefault("OPTIONS", {}).update({
            # As docs/quickstart.md recommends for SQLite.
            "transaction_mode": "IMMEDIATE",
            "timeout": sqlite_timeout,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        })
    elif engine == MYSQL:
        db["NAME"] = name
        # Django's default isolation level (READ COMMITTED) is what the library expects.
        db.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    elif engine == POSTGRES:
        db["NAME"] = name
    else:
        raise RuntimeError(f"unsupported database engine {engine!r}")
    return db


def ensure_database(db: Mapping[str, Any]) -> bool:
    """Create the bench database if it does not exist; True when it was created."""
    kind = vendor(db)
    if kind == "sqlite":
        path = Path(db["NAME"])
        path.parent.mkdir(parents=True, exist_ok=True)
        return not path.exists()
    if kind == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(**_mysql_kwargs(db, with_db=False))
        try:
            cur = conn.cursor()
            cur.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                        [db["NAME"]])
            if cur.fetchone():
                return False
            # A binary collation, as docs/quickstart.md recommends for keys and ids.
            cur.execute(f"CREATE DATABASE `{db['NAME']}` CHARACTER SET utf8mb4 "
                        "COLLATE utf8mb4_bin")
            return True
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(**_postgres_kwargs(db, "postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone():
            return False
        conn.execute(f'CREATE DATABASE "{db["NAME"]}"')
        return True


class Raw:
    """A plain DB-API connection with explicit transactions (autocommit off), no Django."""

    def __init__(self, db: Mapping[str, Any]) -> None:
        self.vendor = vendor(db)
        if self.vendor == "mysql":
            import MySQLdb

            self.conn: Any = MySQLdb.connect(**_mysql_kwargs(db))
            self.conn.autocommit(False)
            # The same isolation level Django (and so the queue) uses.
            self.conn.cursor().execute(
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        elif self.vendor == "postgresql":
            import psycopg

            self.conn = psycopg.connect(**_postgres_kwargs(db, db["NAME"]))
        else:
            self.conn = sqlite3.connect(db["NAME"], isolation_level=None, timeout=20)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.cursor = self.conn.cursor()

    def sql(self, text: str) -> str:
        """Queries are written with %s placeholders; SQLite wants ?."""
        return text.replace("%s", "?") if self.vendor == "sqlite" else text

    def begin(self) -> None:
        # MySQLdb and psycopg open a transaction implicitly (autocommit off); SQLite takes
        # the write lock up front, like the queue's IMMEDIATE transactions.
        if self.vendor == "sqlite":
            self.cursor.execute("BEGIN IMMEDIATE")

    def execute(self, text: str, params: Sequence[Any] = ()) -> Any:
        self.cursor.execute(self.sql(text), params)
        return self.cursor

    def commit(self) -> None:
        if self.vendor == "sqlite":
            self.cursor.execute("COMMIT")
        else:
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def truncate(db: Mapping[str, Any], tables: Sequence[str] = QUEUE_TABLES) -> None:
    """Empty ``tables`` (and restart their id counters)."""
    raw = Raw(db)
    try:
        if raw.vendor == "mysql":
            for table in tables:
                raw.execute(f"TRUNCATE TABLE `{table}`")
        elif raw.vendor == "postgresql":
            raw.execute("TRUNCATE TABLE " + ", ".join(f'"{t}"' for t in tables)
                        + " RESTART IDENTITY")
        else:
            raw.begin()
            for table in tables:
                raw.execute(f'DELETE FROM "{table}"')  # noqa: S608 - the queue's own tables
            if raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone():
                raw.execute("DELETE FROM sqlite_sequence WHERE name IN ("  # noqa: S608 - values bound
                            + ", ".join("%s" for _ in tables) + ")", list(tables))
        raw.commit()
    finally:
        raw.close()


def global_status(raw: Raw, names: Sequence[str]) -> dict[str, int]:
    """MariaDB global status counters (e.g. Questions, Com_select) by name."""
    cur = raw.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ("
                      + ", ".join("%s" for _ in names) + ")", list(names))
    return {name: int(value) for name, value in cur.fetchall()}


def session_questions(raw: Raw) -> int:
    cur = raw.execute("SHOW SESSION STATUS LIKE 'Questions'")
    return int(cur.fetchone()[1])
