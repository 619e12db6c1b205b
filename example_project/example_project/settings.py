"""Settings for the django-sqlqueue example project.

Everything that differs between machines comes from the environment (django-environ):

    DATABASE_URL  default sqlite:///<this project>/db.sqlite3; e.g. mysql://user:pw@host/shop
                  or postgres://user:pw@host/shop
    DEBUG         default True
    SECRET_KEY    default a development-only value
"""

from __future__ import annotations

from pathlib import Path

import environ

PROJECT_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-sqlqueue-example-not-secret")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_sqlqueue",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

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

# --------------------------------------------------------------------------- database

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{PROJECT_DIR / 'db.sqlite3'}"),
}
_db = DATABASES["default"]

if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db.setdefault("OPTIONS", {}).update(
        {
            # Worker processes and web requests share this one file, and SQLite allows one
            # writer at a time. IMMEDIATE takes the write lock at BEGIN, so a second writer
            # waits (up to `timeout` seconds) instead of failing with "database is locked"
            # when its read lock cannot be upgraded mid-transaction. WAL lets readers run
            # while someone writes; synchronous=NORMAL is durable across crashes in WAL mode.
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
elif _db["ENGINE"] == "django.db.backends.mysql":
    # Leave OPTIONS["isolation_level"] unset: Django's default, READ COMMITTED, is what
    # the queue needs (system check sqlqueue.W001).
    _db.setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --------------------------------------------------------------------------- sqlqueue

# Every key with its default value; delete the ones you do not change.
# See docs/quickstart.md for what each one means.
SQLQUEUE = {
    "POLL_INTERVAL": 0.1,  # seconds an idle worker waits between polls
    "BATCH_SIZE": 10,  # 1 = each key strictly one message at a time, in order
    "VISIBILITY_TIMEOUT": 30.0,  # seconds before an unacked delivery is redelivered
    "MAX_ATTEMPTS": 5,  # deliveries before a failing message moves to the DLQ
    # The demo's two workers should share partitions within seconds, so leases here are
    # shorter than the defaults (LEASE_DURATION 30 s, RENEW_INTERVAL 10 s).
    # Seconds before an unrenewed lease may be taken; seconds between renewals/rebalances.
    "LEASE_DURATION": env.float("SQLQUEUE_LEASE_DURATION", default=6.0),
    "RENEW_INTERVAL": env.float("SQLQUEUE_RENEW_INTERVAL", default=1.0),
    "DLQ_SUFFIX": "_dlq",  # "orders" dead-letters to "orders_dlq"
    "MAX_PAYLOAD_BYTES": 1024 * 1024,  # largest payload, as JSON
    "PUBLISH_BATCH_SIZE": 500,  # rows per INSERT in publish_many
    "GC_INTERVAL": 60.0,  # seconds between deletions of fully consumed messages; 0 = off
    "SHUTDOWN_GRACE": 30.0,  # seconds a stopping worker waits for running handlers
    "PARTITIONS": 16,  # partitions of a new topic: the most workers a group can spread over
    "TOPICS": {"orders": {"PARTITIONS": 8}},  # per-topic overrides
    # Recurring schedules, fired by the workers once per tick (docs/scheduling.md). Every
    # 5 seconds (a sixth field, seconds first) so `make demo` sees it fire; a real report
    # would run "0 18 * * *" with "timezone": "Europe/Paris".
    "SCHEDULES": {
        "sales-report": {"cron": "*/5 * * * * *", "task": "shop.tasks.sales_report"},
    },
    # The worker inside the web process, for example_project/asgi.py (`make demo-embedded`):
    # every subscription and task queue, as runqueueworker runs them with no --group,
    # --topic or --queue. SQLQUEUE_EMBEDDED=0 turns it off, e.g. where a worker fleet runs.
    "EMBEDDED": {
        "ENABLED": env.bool("SQLQUEUE_EMBEDDED", default=True),
        "CONCURRENCY": 4,  # handler threads inside each web process
    },
}

# Django's Tasks framework on the queue: `manage.py runqueueworker` runs these task queues
# too (see docs/tasks.md and shop/tasks.py).
TASKS = {
    "default": {
        "BACKEND": "django_sqlqueue.tasks.QueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    },
}

# --------------------------------------------------------------------------- the rest

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
