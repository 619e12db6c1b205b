"""Django settings for the chaos run (``DJANGO_SETTINGS_MODULE=tests.chaos.settings``).

The server comes from ``DATABASE_URL`` (default: the MariaDB test server); the run always
uses a database of its own, ``sqlqueue_chaos`` (``sqlqueue_chaos.sqlite3`` next to a
configured SQLite file), so it never touches the test suite's or the benchmarks' data.
"""

from __future__ import annotations

from pathlib import Path

import environ

from benchmarks.database import own_database

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CHAOS_DB_NAME = "sqlqueue_chaos"
DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/test"
TOPIC = "chaos"
PARTITIONS = 32

env = environ.Env()

SECRET_KEY = "django-sqlqueue-chaos-not-secret"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_sqlqueue",
    "tests.chaos",
]


def chaos_database() -> dict[str, object]:
    """The DATABASES entry for $DATABASE_URL, with the chaos run's own database name."""
    return own_database(env.db_url("DATABASE_URL", default=DEFAULT_DATABASE_URL),
                        CHAOS_DB_NAME, REPO_ROOT, sqlite_timeout=30)


DATABASES = {"default": chaos_database()}

# Short leases and timeouts so that every fault plays out within a few minutes. The lease
# outlasts a database restart (a few seconds), so a restart alone moves no partition.
LEASE_DURATION = 10.0  # seconds
VISIBILITY_TIMEOUT = 4.0  # seconds
MAX_HANDLER_TIME = 8.0  # seconds
SQLQUEUE: dict[str, object] = {
    "POLL_INTERVAL": 0.05,
    "LEASE_DURATION": LEASE_DURATION,
    "RENEW_INTERVAL": 1.0,
    "VISIBILITY_TIMEOUT": VISIBILITY_TIMEOUT,
    "MAX_ATTEMPTS": 12,
    "GC_INTERVAL": 1.0,
    "SHUTDOWN_GRACE": 3.0,
    "MAX_HANDLER_TIME": MAX_HANDLER_TIME,
    "TOPICS": {TOPIC: {"PARTITIONS": PARTITIONS}},
}

# The poison publisher's tasks (tests/chaos/tasks.py, poison.py) run on the same workers.
TASKS = {
    "default": {
        "BACKEND": "django_sqlqueue.tasks.QueueBackend",
        "QUEUES": ["chaos"],
        "OPTIONS": {"MAX_ATTEMPTS": 5},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain"},
        "observed": {"class": "tests.chaos.observe.LeaseLossRecorder", "level": "WARNING"},
    },
    "loggers": {"django_sqlqueue": {"handlers": ["stderr", "observed"], "level": "INFO"}},
}
