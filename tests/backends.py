"""Reachability check for the database the test suite is configured to use.

Used by ``tests/conftest.py`` at session start and by the Makefile before each
backend run::

    DATABASE_URL=mysql://root@127.0.0.1:3306/test python -m tests.backends

prints one line describing the server and exits 0 when it accepts a connection,
1 when it does not. SQLite is always reachable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

CONNECT_TIMEOUT = 3  # seconds

_LABELS = {
    "django.db.backends.sqlite3": "SQLite",
    "django.db.backends.mysql": "MariaDB",
    "django.db.backends.postgresql": "PostgreSQL",
}


def is_ci() -> bool:
    """True when running under CI (``CI=true``), where every backend is mandatory."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def label(db: Mapping[str, Any]) -> str:
    engine = db.get("ENGINE", "")
    return _LABELS.get(engine, engine.rsplit(".", 1)[-1])


def address(db: Mapping[str, Any]) -> str:
    if db.get("ENGINE") == "django.db.backends.sqlite3":
        return str(db.get("NAME", ""))
    host = db.get("HOST") or "localhost"
    port = db.get("PORT")
    return f"{host}:{port}" if port else str(host)


def describe(db: Mapping[str, Any]) -> str:
    """E.g. ``MariaDB at 127.0.0.1:3306``."""
    return f"{label(db)} at {address(db)}"


def _short(exc: BaseException) -> str:
    text = str(exc)
    if len(exc.args) == 2 and isinstance(exc.args[0], int):  # MySQLdb: (errno, message)
        text = f"{exc.args[1]} [{exc.args[0]}]"
    text = " ".join(text.split()) or exc.__class__.__name__
    return text if len(text) <= 120 else text[:117] + "..."


def unreachable_reason(db: Mapping[str, Any], timeout: int = CONNECT_TIMEOUT) -> str | None:
    """Try one short connection; return why it failed, or None when it worked."""
    engine = db.get("ENGINE")
    if engine == "django.db.backends.mysql":
        try:
            import MySQLdb
        except ImportError:
            return "mysqlclient is not installed (pip install 'django-sqlqueue[mysql]')"
        kwargs: dict[str, Any] = {"connect_timeout": timeout}
        for key, arg in (("HOST", "host"), ("USER", "user"), ("PASSWORD", "password")):
            if db.get(key):
                kwargs[arg] = db[key]
        if db.get("PORT"):
            kwargs["port"] = int(db["PORT"])
        if db.get("NAME"):
            kwargs["database"] = db["NAME"]
        try:
            MySQLdb.connect(**kwargs).close()
        except Exception as exc:
            return _short(exc)
        return None
    if engine == "django.db.backends.postgresql":
        try:
            import psycopg
        except ImportError:
            return "psycopg is not installed (pip install 'django-sqlqueue[postgres]')"
        params: dict[str, Any] = {"connect_timeout": timeout}
        for key, arg in (
            ("HOST", "host"),
            ("PORT", "port"),
            ("USER", "user"),
            ("PASSWORD", "password"),
            ("NAME", "dbname"),
        ):
            if db.get(key):
                params[arg] = db[key]
        try:
            psycopg.connect(**params).close()
        except Exception as exc:
            return _short(exc)
        return None
    return None


def default_database() -> Mapping[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    db: Mapping[str, Any] = settings.DATABASES["default"]
    return db


def main() -> int:
    db = default_database()
    reason = unreachable_reason(db)
    if reason is None:
        print(f"{describe(db)} is reachable")
        return 0
    print(f"{describe(db)} is not reachable: {reason}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
