"""Django settings for the django-sqlqueue test suite.

The database comes from ``DATABASE_URL`` (django-environ syntax) and defaults to a
SQLite file under ``.test-data/``. The Makefile runs the suite once per backend:

    sqlite:////<repo>/.test-data/sqlqueue.sqlite3
    mysql://root@127.0.0.1:3306/test
    postgres://postgres@127.0.0.1:5432/test

Worker processes started by the tests must open the test database that the test
runner created, not the configured one: they get its name (a file path for SQLite)
in ``SQLQUEUE_TEST_DB_NAME``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import environ

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_DATA_DIR = REPO_ROOT / ".test-data"

env = environ.Env()

DEFAULT_DATABASE_URL = f"sqlite:///{TEST_DATA_DIR / 'sqlqueue.sqlite3'}"

SECRET_KEY = "django-sqlqueue-tests-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_sqlqueue",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Django 5.2 has no django.tasks: the django-tasks backport stands in for it when installed.
try:
    import django.tasks  # noqa: F401
except ImportError:
    import importlib.util

    if importlib.util.find_spec("django_tasks") is not None:
        INSTALLED_APPS.append("django_tasks")

# The Tasks backend under test (tests/testapp/tasks.py). Worker tests that must not run
# these queues name their --group and --topic.
TASKS = {
    "default": {
        "BACKEND": "django_sqlqueue.tasks.QueueBackend",
        "QUEUES": ["default", "emails", "ordered"],
        "OPTIONS": {"MAX_ATTEMPTS": 2},
    },
}

ROOT_URLCONF = "tests.urls"
# No django.contrib.staticfiles: the admin pages must work without it. A URL for static
# files is still set, as a site serving them from its web server would (the live server of
# the browser test needs one).
STATIC_URL = "/static/"

USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Fast hashing keeps admin/auth fixtures cheap.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# --------------------------------------------------------------------------- database

DATABASES = {"default": env.db_url("DATABASE_URL", default=DEFAULT_DATABASE_URL)}
_db = DATABASES["default"]
_engine = _db["ENGINE"]

if _engine == "django.db.backends.sqlite3":
    TEST_DATA_DIR.mkdir(exist_ok=True)
    _db.setdefault("OPTIONS", {}).update(
        {
            # Take the write lock at BEGIN so concurrent workers queue on `timeout`
            # instead of failing with "database is locked" on lock upgrade.
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A real file (not :memory:) so worker subprocesses can open the same test database.
    # Named after the configured file, so runs pointed at different files never collide.
    _db["TEST"] = {"NAME": str(TEST_DATA_DIR / f"test_{Path(str(_db['NAME'])).name}")}
elif _engine == "django.db.backends.mysql":
    _db.setdefault("OPTIONS", {}).update(
        {"charset": "utf8mb4", "isolation_level": "read committed"}
    )
    _db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"}
# PostgreSQL needs nothing beyond what the URL gives.

if _test_db_name := os.environ.get("SQLQUEUE_TEST_DB_NAME"):
    _db["NAME"] = _test_db_name

# Behind PgBouncer in transaction pooling mode (tests/test_pgbouncer.py starts it on this
# port): "default" goes through the pooler, "direct" reaches the same database without it.
if (_pooler_port := os.environ.get("SQLQUEUE_TEST_POOLER_PORT")) and "postgresql" in _engine:
    DATABASES["direct"] = dict(_db)
    _db.update(HOST="127.0.0.1", PORT=int(_pooler_port), DISABLE_SERVER_SIDE_CURSORS=True)

# --------------------------------------------------------------------------- sqlqueue

# Settings for django_sqlqueue itself, tuned so worker tests finish quickly: fast polls,
# short leases. Worker subprocesses may override keys with a JSON object in
# SQLQUEUE_TEST_SETTINGS.
SQLQUEUE: dict[str, object] = {
    # The library's default: at 50 ms every idle worker of the suites running at once
    # cost the machine a fifth more CPU (make test took 1,169 s against 854 s).
    "POLL_INTERVAL": 0.1,
    "LEASE_DURATION": 3.0,
    "RENEW_INTERVAL": 0.5,
    "VISIBILITY_TIMEOUT": 5.0,
    "SHUTDOWN_GRACE": 10.0,
    # Few partitions keep lease counts easy to reason about; "orders" has 12 so that three
    # workers share it 4/4/4; "slow" has one, so one worker holds all of it;
    "PARTITIONS": 4,
    # "keyed" has one, so every key of it shares a partition.
    # "stuck" has two, so a worker that gives one away keeps the other.
    "TOPICS": {"orders": {"PARTITIONS": 12}, "slow": {"PARTITIONS": 1}, "stuck": {"PARTITIONS": 2},
               "keyed": {"PARTITIONS": 1}},
    # The admin's dead-letter search finds this payload field through an index.
    "SEARCH_FIELDS": ["customer_id"],
}
if _overrides := os.environ.get("SQLQUEUE_TEST_SETTINGS"):
    SQLQUEUE.update(json.loads(_overrides))
