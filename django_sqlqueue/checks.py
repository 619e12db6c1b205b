"""System checks for the ``SQLQUEUE`` setting (ids ``sqlqueue.E001`` …, ``sqlqueue.W001`` …)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from .conf import (
    DEFAULTS,
    MAX_LEASE_SECONDS,
    MAX_PARTITIONS,
    MAX_SECONDS,
    TOPIC_OPTIONS,
    is_seconds,
    raw_settings,
)
from .database_checks import (  # noqa: F401 - registers sqlqueue.E016, E017, E019
    check_queue_database,
    check_topic_databases,
)
from .docs import see
from .embedded.checks import check_embedded  # noqa: F401 - registers sqlqueue.E110
from .models.fields import TOPIC_LENGTH
from .models.payload_search import FIELD_RE
from .replica_checks import check_read_database  # noqa: F401 - registers sqlqueue.E018

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")  # the whole name: use fullmatch
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a dotted module path


def _positive_seconds(value: Any) -> bool:
    return is_seconds(value)


def _seconds_or_zero(value: Any) -> bool:
    return is_seconds(value, zero=True)


def _lease_seconds(value: Any) -> bool:
    return is_seconds(value, most=MAX_LEASE_SECONDS)


def _positive_seconds_or_none(value: Any) -> bool:
    return value is None or is_seconds(value)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _partition_count(value: Any) -> bool:
    return _positive_int(value) and value <= MAX_PARTITIONS


def _dlq_suffix(value: Any) -> bool:
    return isinstance(value, str) and bool(_NAME_RE.fullmatch(value)) and len(value) <= 50


def _metrics_token(value: Any) -> bool:
    # Sent in an HTTP header by Prometheus (authorization: credentials): visible ASCII only.
    return (isinstance(value, str) and len(value) >= 16 and value.isascii()
            and all(33 <= ord(c) <= 126 for c in value))


_SECRETS = frozenset({"METRICS_TOKEN"})  # never quoted: every manage.py command prints checks


def _secret(value: Any) -> str:
    """What is wrong with a secret, without the secret: its type, length and the kinds of
    characters it must not hold."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    problems = [what for what, found in (
        ("a line break (strip a token read from a file)", any(c in "\r\n" for c in value)),
        ("whitespace", any(c.isspace() and c not in "\r\n" for c in value)),
        ("non-ASCII characters", not value.isascii()),
        ("control characters", any(ord(c) < 32 or ord(c) == 127 for c in value if c not in "\r\n\t")),
    ) if found]
    held = f", holding {' and '.join(problems)}" if problems else ""
    return f"a string of {len(value)} characters{held} (not shown)"


def _module_paths(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(
        isinstance(name, str) and _MODULE_RE.fullmatch(name) for name in value)


_YEAR = f"at most {MAX_SECONDS:.0f} (a year)"
_DAY = f"at most {MAX_LEASE_SECONDS:.0f} (a day)"

# (setting, id, predicate, what it must be)
_RULES: list[tuple[str, str, Callable[[Any], bool], str]] = [
    ("POLL_INTERVAL", "sqlqueue.E002", _positive_seconds, f"a number of seconds > 0, {_YEAR}"),
    ("BATCH_SIZE", "sqlqueue.E003", _positive_int, "an integer >= 1"),
    ("VISIBILITY_TIMEOUT", "sqlqueue.E004", _positive_seconds,
     f"a number of seconds > 0, {_YEAR}"),
    ("MAX_ATTEMPTS", "sqlqueue.E005", _positive_int, "an integer >= 1"),
    ("LEASE_DURATION", "sqlqueue.E006", _lease_seconds, f"a number of seconds > 0, {_DAY}"),
    ("RENEW_INTERVAL", "sqlqueue.E007", _lease_seconds, f"a number of seconds > 0, {_DAY}"),
    ("DLQ_SUFFIX", "sqlqueue.E008", _dlq_suffix,
     "a non-empty string of at most 50 characters from [A-Za-z0-9._-]"),
    ("MAX_PAYLOAD_BYTES", "sqlqueue.E009", _positive_int, "an integer number of bytes >= 1"),
    ("PUBLISH_BATCH_SIZE", "sqlqueue.E010", _positive_int, "an integer >= 1"),
    ("GC_INTERVAL", "sqlqueue.E011", _seconds_or_zero,
     f"a number of seconds >= 0 (0 disables GC), {_YEAR}"),
    ("SHUTDOWN_GRACE", "sqlqueue.E012", _seconds_or_zero, f"a number of seconds >= 0, {_YEAR}"),
    ("PARTITIONS", "sqlqueue.E014", _partition_count, f"an integer from 1 to {MAX_PARTITIONS}"),
    ("MAX_HANDLER_TIME", "sqlqueue.E020", _positive_seconds_or_none,
     f"a number of seconds > 0, {_YEAR}, or None for no limit"),
    ("GROUP_RETENTION", "sqlqueue.E021", _positive_seconds_or_none,
     f"a number of seconds > 0, {_YEAR}, or None to keep consumer groups until forgotten"),
    ("MAX_WINDOW", "sqlqueue.E022", _positive_int, "an integer >= 1"),
    ("ARCHIVE_BEFORE_GC", "sqlqueue.E060", lambda value: isinstance(value, bool), "True or False"),
    ("TASK_MODULES", "sqlqueue.E058", _module_paths,
     "a list of dotted module paths, e.g. ['myproject.jobs']"),
    ("NOTIFY", "sqlqueue.E100", lambda value: isinstance(value, bool), "True or False"),
    ("LIVENESS", "sqlqueue.E101", lambda value: isinstance(value, bool), "True or False"),
    ("METRICS_CACHE_SECONDS", "sqlqueue.E070", lambda value: is_seconds(value, zero=True, most=3600),
     "a number of seconds from 0 (read on every scrape) to 3600"),
    ("METRICS_TOKEN", "sqlqueue.E071", lambda value: value is None or _metrics_token(value),
     "None or a string of at least 16 visible ASCII characters (no spaces)"),
]


@register("sqlqueue")
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Report every invalid ``SQLQUEUE`` value at once, each with the fix."""
    user = getattr(settings, "SQLQUEUE", None)
    if user is None:
        return []
    if not isinstance(user, dict):
        return [Error(
            f"SQLQUEUE must be a dict, got {type(user).__name__}.",
            hint="Set SQLQUEUE = {'POLL_INTERVAL': 0.1, ...} or remove it to use the defaults.",
            id="sqlqueue.E001",
        )]
    errors: list[CheckMessage] = []
    unknown = sorted(map(repr, set(user) - set(DEFAULTS)))  # repr: the keys may be of any type
    if unknown:
        errors.append(Error(
            f"SQLQUEUE has unknown key(s): {', '.join(unknown)}.",
            hint=f"Known keys: {', '.join(DEFAULTS)}.",
            id="sqlqueue.E001",
        ))
    values = raw_settings()
    for name, check_id, is_valid, expected in _RULES:
        if not is_valid(values[name]):
            shown = _secret(values[name]) if name in _SECRETS else repr(values[name])
            errors.append(Error(
                f"SQLQUEUE['{name}'] must be {expected}, got {shown}.",
                hint=f"Fix the value or remove the key to use the default ({DEFAULTS[name]!r}).",
                id=check_id,
            ))
    errors += _topic_errors(values["TOPICS"])
    errors += _search_field_errors(values["SEARCH_FIELDS"])
    if errors:
        return errors
    if values["RENEW_INTERVAL"] >= values["LEASE_DURATION"]:
        errors.append(Error(
            "SQLQUEUE['RENEW_INTERVAL'] must be shorter than SQLQUEUE['LEASE_DURATION'] "
            f"({values['RENEW_INTERVAL']!r} >= {values['LEASE_DURATION']!r}), or every lease "
            "would go stale before it is renewed.",
            hint="Renew about three times per lease, e.g. LEASE_DURATION=30, RENEW_INTERVAL=10.",
            id="sqlqueue.E013",
        ))
    return errors


def _search_field_errors(fields: Any) -> list[CheckMessage]:
    """``SEARCH_FIELDS`` lists top-level payload field names, e.g. ["customer_id"]."""
    if (not isinstance(fields, list | tuple)
            or not all(isinstance(f, str) and FIELD_RE.fullmatch(f) for f in fields)
            or len({f.lower() for f in fields}) != len(fields)):
        return [Error(
            f"SQLQUEUE['SEARCH_FIELDS'] must be a list of distinct payload field names, got "
            f"{fields!r}.",
            hint="Names of letters, digits and '_' (not starting with a digit, at most 40), "
            "e.g. ['customer_id', 'order_id'].",
            id="sqlqueue.E080",
        )]
    return []


def _topic_errors(topics: Any) -> list[CheckMessage]:
    """``TOPICS`` maps topic names to option dicts, e.g. {"orders": {"PARTITIONS": 64}}."""
    example = "SQLQUEUE['TOPICS'] = {'orders': {'PARTITIONS': 64}}"
    if not isinstance(topics, dict):
        return [Error(f"SQLQUEUE['TOPICS'] must be a dict, got {type(topics).__name__}.",
                      hint=f"For example {example}.", id="sqlqueue.E015")]
    errors: list[CheckMessage] = []
    for topic, options in topics.items():
        where = f"SQLQUEUE['TOPICS'][{topic!r}]"
        if not isinstance(topic, str) or not _NAME_RE.fullmatch(topic) or len(topic) > TOPIC_LENGTH:
            errors.append(Error(f"SQLQUEUE['TOPICS'] has a key that is not a topic name: {topic!r}.",
                                hint=f"Topic names are up to {TOPIC_LENGTH} letters, digits, "
                                "'.', '_' and '-'.",
                                id="sqlqueue.E015"))
        elif not isinstance(options, dict):
            errors.append(Error(f"{where} must be a dict of options, got {type(options).__name__}.",
                                hint=f"For example {example}.", id="sqlqueue.E015"))
        else:
            unknown = sorted(set(map(str, options)) - TOPIC_OPTIONS)
            if unknown:
                errors.append(Error(f"{where} has unknown option(s): {', '.join(unknown)}.",
                                    hint=f"Known options: {', '.join(sorted(TOPIC_OPTIONS))}.",
                                    id="sqlqueue.E015"))
            if "PARTITIONS" in options and not _partition_count(options["PARTITIONS"]):
                errors.append(Error(
                    f"{where}['PARTITIONS'] must be an integer from 1 to {MAX_PARTITIONS}, "
                    f"got {options['PARTITIONS']!r}.",
                    hint="A topic's partition count is recorded when it is first used. "
                    + see("consuming", "Changing the partition count"), id="sqlqueue.E014",
                ))
            if "DATABASE" in options and options["DATABASE"] not in settings.DATABASES:
                known = ", ".join(map(repr, settings.DATABASES))
                errors.append(Error(
                    f"{where}['DATABASE'] must name an alias of DATABASES ({known}), got "
                    f"{options['DATABASE']!r}.",
                    hint=see("operating", "When one server is not enough"), id="sqlqueue.E019",
                ))
    return errors


@register("sqlqueue")
def check_database_isolation(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """Warn when a MySQL alias is not at READ COMMITTED, which the sequencer relies on."""
    warnings: list[CheckMessage] = []
    for alias, config in settings.DATABASES.items():
        options = config.get("OPTIONS", {})
        if "mysql" not in config.get("ENGINE", "") or "isolation_level" not in options:
            continue  # Django's MySQL default is READ COMMITTED
        level = options["isolation_level"]
        if level is None or str(level).lower() in {"repeatable read", "serializable"}:
            shown = "the server default (REPEATABLE READ)" if level is None else repr(level)
            warnings.append(Warning(
                f"DATABASES['{alias}'] uses isolation level {shown}; django-sqlqueue's "
                "sequencer and workers expect READ COMMITTED and deadlock more often without it.",
                hint="Remove OPTIONS['isolation_level'] (Django's default is 'read committed').",
                id="sqlqueue.W001",
            ))
    return warnings


@register("sqlqueue")
def check_sqlite_transaction_mode(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """Warn when SQLite takes its write lock lazily: concurrent workers then fail with
    "database is locked" on every lock upgrade instead of waiting their turn."""
    warnings: list[CheckMessage] = []
    for alias, config in settings.DATABASES.items():
        if "sqlite3" not in config.get("ENGINE", ""):
            continue
        mode = str(config.get("OPTIONS", {}).get("transaction_mode") or "DEFERRED").upper()
        if mode != "IMMEDIATE":
            warnings.append(Warning(
                f"DATABASES['{alias}'] is SQLite with transaction_mode {mode}; queue workers "
                "and publishers will hit 'database is locked' errors (retried, but slow).",
                hint="Set OPTIONS = {'transaction_mode': 'IMMEDIATE', 'timeout': 20, "
                "'init_command': 'PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;'}. "
                + see("quickstart", "SQLite"),
                id="sqlqueue.W002",
            ))
    return warnings


@register("sqlqueue")
def check_pooler(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``SQLQUEUE["DIRECT_DATABASE"]`` names a configured alias (``E102``); an alias
    behind a transaction pooler (``DISABLE_SERVER_SIDE_CURSORS``) either has one, or its
    workers poll without wake-up on commit (``W102``); and psycopg does not prepare
    statements there (``W103``)."""
    from .db.pooling import pooled

    values = raw_settings()
    direct = values["DIRECT_DATABASE"]
    hint = see("operating", "PgBouncer")
    if direct is not None and (not isinstance(direct, str) or direct not in settings.DATABASES):
        known = ", ".join(map(repr, settings.DATABASES))
        return [Error(f"SQLQUEUE['DIRECT_DATABASE'] must be None or name an alias of "
                      f"DATABASES ({known}), got {direct!r}.", hint=hint, id="sqlqueue.E102")]
    messages: list[CheckMessage] = []
    for alias, config in settings.DATABASES.items():
        if not pooled(alias):
            continue
        if direct is None and values["NOTIFY"] is True:
            messages.append(Warning(
                f"DATABASES[{alias!r}] goes through a transaction pooler "
                "(DISABLE_SERVER_SIDE_CURSORS) and SQLQUEUE['DIRECT_DATABASE'] names no "
                "direct connection: workers there wake up by polling only (every "
                "POLL_INTERVAL), not on commit, and notice a killed worker by its lease alone.",
                hint="Add an alias reaching the same database without the pooler and name it "
                "in SQLQUEUE['DIRECT_DATABASE']. " + hint,
                id="sqlqueue.W102", obj=f"DATABASES[{alias!r}]"))
        options = config.get("OPTIONS") or {}
        if options.get("prepare_threshold") is not None:
            messages.append(Warning(
                f"DATABASES[{alias!r}] goes through a transaction pooler but sets "
                f"OPTIONS['prepare_threshold'] = {options['prepare_threshold']!r}: psycopg's "
                "prepared statements belong to one server session, and the pooler hands the "
                "next transaction another one.",
                hint="Leave prepare_threshold out (Django's default, None). " + hint,
                id="sqlqueue.W103", obj=f"DATABASES[{alias!r}]"))
    return messages


# A deployment check: SQLite projects (the demo, every test suite on SQLite) would otherwise
# read it on every manage.py command, and nothing is wrong with them.
@register("sqlqueue", deploy=True)
def check_liveness(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``W101`` for each database alias whose workers notice a killed worker only when its
    lease expires (no liveness lock: SQLite, ``LIVENESS`` off, a transaction pooler)."""
    from .db.liveness import fallback_reason

    if not isinstance(raw_settings()["LIVENESS"], bool):
        return []  # E101 comes first
    hint = ("A worker killed there keeps its partitions for LEASE_DURATION "
            f"({raw_settings()['LEASE_DURATION']!r} s). "
            + see("consuming", "A killed worker's partitions"))
    warnings: list[CheckMessage] = []
    for alias in settings.DATABASES:
        reason = fallback_reason(alias)
        if reason is not None:
            warnings.append(Warning(
                f"Workers on DATABASES[{alias!r}] notice a killed worker by its lease "
                f"alone: {reason}.", hint=hint, id="sqlqueue.W101", obj=f"DATABASES[{alias!r}]"))
    return warnings


# --------------------------------------------------------------------------- tasks


@register("sqlqueue")
def check_task_backends(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """The ``django_sqlqueue.tasks.QueueBackend`` entries of ``TASKS`` (``sqlqueue.E050`` …
    ``E057``). Django checks a Tasks backend only once something has imported
    ``django.tasks``; this check runs whether or not anything did."""
    try:
        from .tasks.checks import task_backend_errors
    except ImportError:  # no Tasks framework: Django 5.2 without the django-tasks backport
        return []
    return task_backend_errors()


@register("sqlqueue")
def check_schedules(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``SQLQUEUE["SCHEDULES"]``: cron, time zone, catch-up policy, task or message of each
    schedule (``sqlqueue.E090`` … ``E096``)."""
    from .scheduling.spec import E_FIELDS, problems

    declared = raw_settings()["SCHEDULES"]
    hint = see("scheduling", "Declaring schedules")
    if not isinstance(declared, dict):
        return [Error(f"SQLQUEUE['SCHEDULES'] must be a dict of schedules by name, got "
                      f"{type(declared).__name__}.", hint=hint, id=E_FIELDS)]
    errors: list[CheckMessage] = []
    for name, options in declared.items():
        errors += [Error(message + ".", hint=hint, id=check_id, obj=f"SCHEDULES[{name!r}]")
                   for check_id, message in problems(name, options)]
    return errors


# A deployment check: a schedule's topic may be read by something that is not a
# @subscriber (a Spark stream), so this is a question for the deploy review (``manage.py
# check --deploy``), not a warning every ``manage.py`` command repeats; it also imports
# every installed app's queues.py, which no other command needs.
@register("sqlqueue", deploy=True)
def check_schedule_topics(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``W090`` for a schedule that publishes to a topic no subscriber consumes."""
    declared = raw_settings()["SCHEDULES"]
    if not isinstance(declared, dict) or check_schedules(app_configs):
        return []  # the errors above come first
    topics = {name: options["topic"] for name, options in declared.items()
              if isinstance(options, dict) and "topic" in options}
    consumed = _consumed_topics() if topics else None
    return [
        Warning(
            f"schedule {name!r} publishes to topic {topic!r}, which no @subscriber "
            "consumes: its messages would wait in the log.",
            hint="Check the topic's spelling, or subscribe a handler to it in a queues.py.",
            id="sqlqueue.W090", obj=f"SCHEDULES[{name!r}]")
        for name, topic in topics.items()
        if consumed is not None and topic not in consumed
    ]


def _consumed_topics() -> set[str] | None:
    """Topics of the @subscriber handlers in installed apps' queues.py; None when those
    cannot be imported (runqueueworker reports why)."""
    from .consuming.registry import autodiscover, subscriptions
    from .exceptions import ConfigurationError

    try:
        autodiscover()
    except ConfigurationError:
        return None
    return {s.topic for s in subscriptions()}
