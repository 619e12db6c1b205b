"""The ``SQLQUEUE`` settings dict, read lazily so ``override_settings`` works.

Every key has a documented default; :mod:`django_sqlqueue.checks` reports bad values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS

from .limits import DEFAULT_MAX_PAYLOAD_BYTES

DEFAULTS: dict[str, Any] = {
    # The database alias holding the queue's tables; with another alias than "default",
    # DATABASE_ROUTERS must send the app's models there (django_sqlqueue.routers.QueueRouter).
    # Left out: the alias the routers choose for the app's models, normally "default".
    "DATABASE": DEFAULT_DB_ALIAS,
    # A read replica of the queue's database for what only reads and may lag: the admin's
    # pages (not its actions), `manage.py sqlqueue stats` and the metrics. Either one alias
    # (the replica of DATABASE) or {queue alias: replica alias}. None: everything reads the
    # queue's alias. See docs/operating.md, "Read replicas".
    "READ_DATABASE": None,
    # How long an idle worker waits between polls, in seconds.
    "POLL_INTERVAL": 0.1,
    # 1: strict mode, each key handled one message at a time in log order. Any other value:
    # concurrent mode, a key's messages handed out in order and run side by side.
    "BATCH_SIZE": 10,
    # How long a delivered message stays invisible before it is redelivered, in seconds.
    "VISIBILITY_TIMEOUT": 30.0,
    # Deliveries before a failing message moves to the dead-letter topic.
    "MAX_ATTEMPTS": 5,
    # A lease not renewed for this long may be taken by another worker, in seconds.
    "LEASE_DURATION": 30.0,
    # How often a worker renews leases, heartbeats and rebalances, in seconds.
    "RENEW_INTERVAL": 10.0,
    # Appended to a topic to name its dead-letter topic.
    "DLQ_SUFFIX": "_dlq",
    # Largest accepted payload, as serialized JSON, in bytes.
    "MAX_PAYLOAD_BYTES": DEFAULT_MAX_PAYLOAD_BYTES,
    # Rows per multi-row INSERT in publish_many.
    "PUBLISH_BATCH_SIZE": 500,
    # How often a worker deletes fully consumed messages, in seconds (0 disables GC).
    "GC_INTERVAL": 60.0,
    # A registered consumer group with neither a heartbeat nor an ack for this many seconds
    # stops holding GC back (Kafka's offset retention); None: groups hold it back until
    # retired with `manage.py sqlqueue forget`.
    "GROUP_RETENTION": 7 * 24 * 3600.0,
    # Seconds a stopping worker waits for in-flight handlers before giving up on them.
    "SHUTDOWN_GRACE": 30.0,
    # Seconds after which a running handler's message is no longer kept invisible, so it
    # is redelivered once its visibility timeout runs out; None: handlers may run forever.
    "MAX_HANDLER_TIME": None,
    # Unacked messages a worker keeps in memory per partition it holds (in flight, due, or
    # waiting briefly). Messages that wait long, or beyond half of it, stay in the database
    # until due, so a mass of delayed messages never holds up due ones.
    "MAX_WINDOW": 10_000,
    # Partitions of a topic that has no entry in TOPICS, recorded when the topic is first
    # sequenced. A partition is the unit of leasing: at most this many workers share a topic.
    "PARTITIONS": 16,
    # Per-topic options, e.g. {"orders": {"PARTITIONS": 64, "DATABASE": "events"}}.
    # DATABASE places the topic (its log, groups, offsets, leases, dead letters) on another
    # alias of DATABASES, migrated like the queue's own; see docs/operating.md, "When one
    # server is not enough".
    "TOPICS": {},
    # Top-level payload fields the admin's dead-letter search finds by exact value
    # ("customer_id=42") through an index, created by `migrate`. Other fields are searched
    # in the newest dead letters only.
    "SEARCH_FIELDS": [],
    # True: GC deletes only messages the archive job (python -m django_sqlqueue.spark.archive)
    # has exported, besides waiting for every consumer group.
    "ARCHIVE_BEFORE_GC": False,
    # Seconds the metrics view (django_sqlqueue.urls) reuses the gauges it read from the
    # database, per process; 0 reads them on every scrape.
    "METRICS_CACHE_SECONDS": 5.0,
    # When set, the metrics view serves only requests with "Authorization: Bearer <token>".
    # None: anyone who can reach the URL (protect it another way).
    "METRICS_TOKEN": None,
    # Recurring schedules by name: {"nightly": {"cron": "0 3 * * *", "task": "shop.tasks.x"}}
    # or {"cron": ..., "topic": ..., "payload": ...}; see docs/scheduling.md. Synced into
    # the queue_schedules table by migrate and by each worker at start.
    "SCHEDULES": {},
    # Modules holding @task functions besides each installed app's `tasks` module, e.g.
    # ["myproject.jobs"]. A worker runs, and get_result() reads, only the tasks found in
    # those modules: a task message naming any other path is dead-lettered, never imported.
    "TASK_MODULES": [],
    # PostgreSQL: publishing notifies idle workers, which start the message at once instead
    # of at their next poll (LISTEN/NOTIFY; one listener connection per worker). Ignored on
    # other databases. False: polling only.
    "NOTIFY": True,
    # PostgreSQL and MariaDB/MySQL: each worker holds a lock on a connection of its own,
    # which the server releases when the worker's process dies, so the other workers take
    # its partitions at once instead of after LEASE_DURATION. False: leases alone (as on
    # SQLite, which has no server session).
    "LIVENESS": True,
    # PostgreSQL behind a transaction pooler (PgBouncer): an alias of DATABASES reaching the
    # queue's database directly, for what needs a server session of its own (the wake-up
    # listener, the liveness lock). None: the queue's alias itself, unless that sets
    # DISABLE_SERVER_SIDE_CURSORS (a pooler): then polling and leases alone.
    "DIRECT_DATABASE": None,
    # The worker run inside web processes by django_sqlqueue.embedded (sqlqueue_asgi,
    # sqlqueue_wsgi, the gunicorn hooks); keyword arguments given there win. Keys, with
    # their defaults: "ENABLED": True (False: off, e.g. per environment); "GROUP", "TOPIC",
    # "QUEUE": [] (runqueueworker's --group/--topic/--queue; none of them: every
    # subscription and task queue); "NAME": None (host:pid); "CONCURRENCY": 4 (handler
    # threads, 1 to 1000); "SCHEDULES": True (False: --no-schedules); "PROCESSES": "every"
    # (or "one": one web process per server); "AUTORELOAD": False (True: also under
    # runserver's autoreloader); "START": "request" (or "import": when the server sends no
    # lifespan events). See docs/operating.md, "A worker inside the web process".
    "EMBEDDED": {},
}

MAX_PARTITIONS = 4096  # per topic; lease rows, watermarks and fair share count partitions
# The longest any duration setting may be, in seconds. Longer is a typo, and some would
# break the worker: a wait longer than threading.TIMEOUT_MAX (292 years) raises, and times
# are stored as epoch milliseconds in 64-bit integers.
MAX_SECONDS = 365 * 24 * 3600.0  # a year
# The longest lease, in seconds: a worker bounds its idle transactions by it, and
# PostgreSQL takes at most 2**31 - 1 ms (24.8 days) for idle_in_transaction_session_timeout.
MAX_LEASE_SECONDS = 24 * 3600.0  # a day


def is_seconds(value: Any, *, zero: bool = False, most: float = MAX_SECONDS) -> bool:
    """Whether ``value`` is an int or float of seconds, > 0 (>= 0 with ``zero``) and at most
    ``most``: never NaN, a bool or infinite."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return (value >= 0 if zero else value > 0) and value <= most  # inf is over any ``most``
TOPIC_OPTIONS = frozenset({"PARTITIONS", "DATABASE"})


@dataclass(frozen=True)
class QueueSettings:
    database: str
    read_database: str | dict[str, str] | None
    poll_interval: float
    batch_size: int
    visibility_timeout: float
    max_attempts: int
    lease_duration: float
    renew_interval: float
    dlq_suffix: str
    max_payload_bytes: int
    publish_batch_size: int
    gc_interval: float
    group_retention: float | None
    shutdown_grace: float
    max_handler_time: float | None
    max_window: int
    partitions: int
    topics: dict[str, dict[str, Any]]
    search_fields: list[str]
    archive_before_gc: bool
    metrics_cache_seconds: float
    metrics_token: str | None
    schedules: dict[str, dict[str, Any]]
    task_modules: list[str]
    notify: bool
    liveness: bool
    direct_database: str | None
    embedded: dict[str, Any]

    def partitions_for(self, topic: str) -> int:
        """The partition count configured for ``topic`` (the recorded count wins once a
        topic has one; see :mod:`django_sqlqueue.partitioning`)."""
        options = self.topics.get(topic) or {}
        return int(options.get("PARTITIONS", self.partitions))


def database_configured() -> bool:
    """Whether ``SQLQUEUE`` names the queue's database itself (``DATABASE``)."""
    user = getattr(settings, "SQLQUEUE", None)
    return isinstance(user, dict) and "DATABASE" in user


def queue_database(topic: str | None = None) -> str:
    """The database alias holding ``topic``'s rows: its ``SQLQUEUE["TOPICS"][topic]
    ["DATABASE"]`` when set (a dead-letter topic lives with the topic it serves), else the
    queue's alias: ``SQLQUEUE["DATABASE"]`` when set, else the alias ``DATABASE_ROUTERS``
    choose for writing the app's models (``"default"`` without routers).

    Every caller that reads or writes the queue without an explicit alias asks this, so
    publishing, the worker, the admin and the commands agree. What belongs to no topic
    (schedules not aimed at one, the worker's own rows) asks without ``topic``.
    """
    if topic is not None:
        placed = topic_database(topic)
        if placed is not None:
            return placed
    if database_configured():
        return get_settings().database
    from django.apps import apps
    from django.db import router

    return str(router.db_for_write(apps.get_model("django_sqlqueue", "QueueMessage")))


def topic_database(topic: str) -> str | None:
    """The alias ``SQLQUEUE["TOPICS"]`` places ``topic`` on, or None when it names none.

    A dead-letter topic (``orders_dlq``) follows ``orders`` unless it is placed itself:
    the worker copies a dead letter in the same transaction that settles the original.
    """
    conf = get_settings()
    topics = conf.topics
    if not topics:
        return None
    suffix = conf.dlq_suffix
    while True:
        options = topics.get(topic)
        if isinstance(options, dict) and isinstance(options.get("DATABASE"), str):
            return str(options["DATABASE"])
        if not suffix or not topic.endswith(suffix) or len(topic) == len(suffix):
            return None
        topic = topic[: -len(suffix)]


def queue_aliases() -> list[str]:
    """Every alias holding queue tables, the queue's own first: ``SQLQUEUE["DATABASE"]``
    and the ``DATABASE`` of each topic in ``SQLQUEUE["TOPICS"]`` that names one."""
    aliases = [queue_database()]
    for options in (raw_settings()["TOPICS"] or {}).values():
        alias = options.get("DATABASE") if isinstance(options, dict) else None
        if isinstance(alias, str) and alias not in aliases:
            aliases.append(alias)
    return aliases


def read_database(alias: str | None = None) -> str:
    """The alias to read the queue alias ``alias`` (default: :func:`queue_database`) from
    where a lagging view is acceptable: its ``SQLQUEUE["READ_DATABASE"]`` replica, else
    ``alias`` itself.

    Only what writes nothing and need not see its own writes may ask this; everything else
    reads the queue's alias (the router's ``db_for_read`` answers it too).
    """
    primary = queue_database()
    alias = alias or primary
    replicas = get_settings().read_database
    if isinstance(replicas, str):
        return replicas if alias == primary else alias
    if isinstance(replicas, dict):
        return str(replicas.get(alias) or alias)
    return alias


def raw_settings() -> dict[str, Any]:
    """The user's ``SQLQUEUE`` dict merged over the defaults, unvalidated."""
    user = getattr(settings, "SQLQUEUE", None) or {}
    return {**DEFAULTS, **(user if isinstance(user, dict) else {})}


_cached: tuple[object, QueueSettings] | None = None


def get_settings() -> QueueSettings:
    """The current settings; call it each time rather than caching the result.

    Built once per ``SQLQUEUE`` object (publish() calls this for every message):
    ``override_settings`` installs a new object, and ``setting_changed`` clears the cache
    for changes made in place.
    """
    global _cached
    user = getattr(settings, "SQLQUEUE", None)
    if _cached is not None and _cached[0] is user:
        return _cached[1]
    values = raw_settings()
    built = QueueSettings(**{name.lower(): values[name] for name in DEFAULTS})
    _cached = (user, built)
    return built


def _forget(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "SQLQUEUE":
        _cached = None


setting_changed.connect(_forget)
