"""Django settings for the benchmark suite (``DJANGO_SETTINGS_MODULE=benchmarks.settings``).

The server comes from ``DATABASE_URL`` (django-environ syntax, default: the MariaDB test
server), but the benchmarks always use their own database so they never touch the test
suite's data: ``sqlqueue_bench`` on MySQL/MariaDB and PostgreSQL (``benchmarks/run.py``
creates it when missing), or ``sqlqueue_bench.sqlite3`` next to the configured SQLite file.

``SQLQUEUE`` keeps the library defaults (POLL_INTERVAL 0.1 s, RENEW_INTERVAL 10 s, ...).
A benchmark may override keys with a JSON object in ``SQLQUEUE_BENCH_SETTINGS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import environ

from benchmarks.database import own_database

REPO_ROOT = Path(__file__).resolve().parent.parent
# SQLQUEUE_BENCH_DB names another one, so runs from two checkouts never share it.
BENCH_DB_NAME = os.environ.get("SQLQUEUE_BENCH_DB") or "sqlqueue_bench"
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
    # The admin_pages benchmark renders the queue's admin pages.
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_sqlqueue",
    "benchmarks.benchapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
ROOT_URLCONF = "benchmarks.urls"
STATIC_URL = "/static/"

# The tasks benchmark compares the Tasks backend with django-tasks-db (its db_worker),
# which `make bench` installs into the bench environment only.
TASKS: dict[str, dict[str, object]] = {
    "default": {"BACKEND": "django_sqlqueue.tasks.QueueBackend", "QUEUES": ["bench", "latency"]},
}
if importlib.util.find_spec("django_tasks_db") is not None:
    INSTALLED_APPS.append("django_tasks_db")
    TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["bench"]}


def bench_database() -> dict[str, object]:
    """The DATABASES entry for $DATABASE_URL, with the bench database's name."""
    return own_database(env.db_url("DATABASE_URL", default=DEFAULT_DATABASE_URL),
                        BENCH_DB_NAME, REPO_ROOT)


DATABASES = {"default": bench_database()}
# The scaleout benchmark's second MariaDB server (clusters/mariadb.py), which it starts
# itself; nothing connects to it unless a topic is placed there. An empty
# SQLQUEUE_BENCH_SECOND_URL leaves it out (the throughput benchmark runs earlier checkouts,
# whose commands would check every alias).
SECOND_DATABASE_URL = os.environ.get("SQLQUEUE_BENCH_SECOND_URL",
                                     "mysql://root@127.0.0.1:23306/test")
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql" and SECOND_DATABASE_URL:
    DATABASES["second"] = own_database(env.db_url_config(SECOND_DATABASE_URL), BENCH_DB_NAME,
                                       REPO_ROOT)

# The fleet benchmark's topic has 1,024 partitions; every other topic the default 16.
SQLQUEUE: dict[str, object] = {"TOPICS": {"fleet": {"PARTITIONS": 1024},
                                          "waiting": {"PARTITIONS": 1},
                                          "waiting_strict": {"PARTITIONS": 1}}}
if _overrides := os.environ.get("SQLQUEUE_BENCH_SETTINGS"):
    SQLQUEUE.update(json.loads(_overrides))
