"""Django settings for the benchmark suite (``DJANGO_SETTINGS_MODULE=benchmarks.settings``).

The server comes from ``DATABASE_URL`` (django-environ syntax, default: the MariaDB test
server), but the benchmarks always use their own database so they never touch the test
suite's data: ``sqlqueue_bench`` on MySQL/MariaDB and PostgreSQL (``benchmarks/run.py``
creates it when missing), or ``sqlqueue_bench.sqlite3`` next to the configured SQLite file.

``SQLQUEUE`` keeps the library defaults (POLL_INTERVAL 0.1 s, RENEW_INTERVAL 10 s, ...).
A benchmark may override keys with a JSON object in ``SQLQUEUE_BENCH_SETTINGS``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import environ

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DB_NAME = "sqlqueue_bench"
DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/test"

env = environ.Env()

SECRET_KEY = "django-sqlqueue-benchmarks-not-secret"  # noqa: S105 - benchmarks only
DEBUG = False  # keeps Django from recording every query in memory
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_sqlqueue",
    "benchmarks.benchapp",
]


def bench_database() -> dict[str, object]:
    """The DATABASES entry for $DATABASE_URL, with the bench database's name."""
    db = env.db_url("DATABASE_URL", default=DEFAULT_DATABASE_URL)
    engine = db["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        configured = Path(str(db.get("NAME") or "")).expanduser()
        folder = configured.parent if str(configured) not in ("", ".", ":memory:") \
            else REPO_ROOT / ".test-data"
        if not folder.is_absolute():
            folder = REPO_ROOT / folder
        db["NAME"] = str(folder / f"{BENCH_DB_NAME}.sqlite3")
        db.setdefault("OPTIONS", {}).update({
            # As docs/quickstart.md recommends for SQLite.
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        })
    elif engine == "django.db.backends.mysql":
        db["NAME"] = BENCH_DB_NAME
        # Django's default isolation level (READ COMMITTED) is what the library expects.
        db.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    elif engine == "django.db.backends.postgresql":
        db["NAME"] = BENCH_DB_NAME
    else:
        raise RuntimeError(f"benchmarks: unsupported database engine {engine!r}")
    return db


DATABASES = {"default": bench_database()}

# The fleet benchmark's topic has 1,024 partitions; every other topic the default 16.
SQLQUEUE: dict[str, object] = {"TOPICS": {"fleet": {"PARTITIONS": 1024}}}
if _overrides := os.environ.get("SQLQUEUE_BENCH_SETTINGS"):
    SQLQUEUE.update(json.loads(_overrides))
