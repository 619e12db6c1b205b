"""System checks for the SQLQUEUE setting, and the defaults get_settings() falls back to."""

from __future__ import annotations

import math
import warnings
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.checks import Error, run_checks
from django.test import override_settings

from django_sqlqueue.checks import (
    check_database_isolation,
    check_liveness,
    check_pooler,
    check_read_database,
    check_settings,
    check_sqlite_transaction_mode,
    check_task_backends,
)
from django_sqlqueue.conf import DEFAULTS, get_settings, read_database


def errors_for(value) -> list:
    with override_settings(SQLQUEUE=value):
        return check_settings()


def ids_for(value) -> list[str]:
    return [error.id for error in errors_for(value)]


# --------------------------------------------------------------------------- valid settings


def test_empty_settings_pass():
    assert errors_for({}) == []


def test_missing_setting_passes():
    with override_settings():
        del settings.SQLQUEUE
        assert check_settings() == []


def test_none_passes():
    assert errors_for(None) == []


def test_a_full_valid_dict_passes():
    assert errors_for({
        "POLL_INTERVAL": 0.5, "BATCH_SIZE": 1, "VISIBILITY_TIMEOUT": 60, "MAX_ATTEMPTS": 3,
        "LEASE_DURATION": 15, "RENEW_INTERVAL": 5, "DLQ_SUFFIX": ".dead-letters",
        "MAX_PAYLOAD_BYTES": 4096, "PUBLISH_BATCH_SIZE": 100, "GC_INTERVAL": 0,
        "SHUTDOWN_GRACE": 0,
    }) == []


def test_the_documented_defaults_pass():
    assert errors_for(dict(DEFAULTS)) == []


def test_checks_are_registered_under_the_sqlqueue_tag():
    with override_settings(SQLQUEUE={"BATCH_SIZE": 0}):
        messages = run_checks(tags=["sqlqueue"])

    assert "sqlqueue.E003" in [message.id for message in messages]


@pytest.mark.django_db  # Django's own model checks ask SQLite whether it has JSON1
def test_default_check_run_reports_a_bad_setting():
    with override_settings(SQLQUEUE={"POLL_INTERVAL": 0}):
        messages = run_checks()

    assert "sqlqueue.E002" in [message.id for message in messages]


# --------------------------------------------------------------------------- E001


def test_non_dict_setting_is_e001():
    [error] = errors_for([("POLL_INTERVAL", 1)])

    assert error.id == "sqlqueue.E001"
    assert "must be a dict, got list" in error.msg
    assert error.hint


def test_unknown_key_is_e001_and_names_the_key():
    [error] = errors_for({"POLL_INTERVALL": 1})

    assert error.id == "sqlqueue.E001"
    assert "POLL_INTERVALL" in error.msg
    assert "POLL_INTERVAL" in error.hint


def test_check_errors_are_errors_not_warnings():
    [error] = errors_for({"BATCH_SIZE": 0})

    assert isinstance(error, Error)
    assert error.is_serious()


# --------------------------------------------------------------------------- each value


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("POLL_INTERVAL", 0, "sqlqueue.E002"),
        ("POLL_INTERVAL", -0.1, "sqlqueue.E002"),
        ("BATCH_SIZE", 0, "sqlqueue.E003"),
        ("BATCH_SIZE", 1.5, "sqlqueue.E003"),
        ("VISIBILITY_TIMEOUT", -1, "sqlqueue.E004"),
        ("MAX_ATTEMPTS", True, "sqlqueue.E005"),
        ("MAX_ATTEMPTS", 0, "sqlqueue.E005"),
        ("LEASE_DURATION", "30", "sqlqueue.E006"),
        ("RENEW_INTERVAL", 0, "sqlqueue.E007"),
        ("DLQ_SUFFIX", "", "sqlqueue.E008"),
        ("DLQ_SUFFIX", "bad suffix", "sqlqueue.E008"),
        ("DLQ_SUFFIX", "/dlq", "sqlqueue.E008"),
        ("DLQ_SUFFIX", "x" * 51, "sqlqueue.E008"),
        ("DLQ_SUFFIX", None, "sqlqueue.E008"),
        ("MAX_PAYLOAD_BYTES", 0, "sqlqueue.E009"),
        ("MAX_PAYLOAD_BYTES", 1024.0, "sqlqueue.E009"),
        ("PUBLISH_BATCH_SIZE", 0, "sqlqueue.E010"),
        ("GC_INTERVAL", -1, "sqlqueue.E011"),
        ("SHUTDOWN_GRACE", -1, "sqlqueue.E012"),
        ("MAX_HANDLER_TIME", 0, "sqlqueue.E020"),
        ("MAX_HANDLER_TIME", "1h", "sqlqueue.E020"),
        ("GROUP_RETENTION", 0, "sqlqueue.E021"),
        ("GROUP_RETENTION", "7d", "sqlqueue.E021"),
        ("MAX_WINDOW", 0, "sqlqueue.E022"),
        ("MAX_WINDOW", 100.0, "sqlqueue.E022"),
        ("ARCHIVE_BEFORE_GC", 1, "sqlqueue.E060"),
        ("ARCHIVE_BEFORE_GC", "yes", "sqlqueue.E060"),
        ("NOTIFY", "yes", "sqlqueue.E100"),
        ("NOTIFY", None, "sqlqueue.E100"),
        ("LIVENESS", "yes", "sqlqueue.E101"),
        ("LIVENESS", 1, "sqlqueue.E101"),
        ("TASK_MODULES", "myproject.jobs", "sqlqueue.E058"),
        ("TASK_MODULES", ["myproject/jobs.py"], "sqlqueue.E058"),
        ("TASK_MODULES", [None], "sqlqueue.E058"),
    ],
)
def test_bad_value_has_its_own_id_and_a_hint(name, value, check_id):
    [error] = errors_for({name: value})

    assert error.id == check_id
    assert f"SQLQUEUE['{name}']" in error.msg
    assert repr(value) in error.msg
    assert repr(DEFAULTS[name]) in error.hint


# Every duration setting, its check id, and whether 0 is allowed (it turns GC off, and a
# grace of 0 stops at once).
DURATIONS = [
    ("POLL_INTERVAL", "sqlqueue.E002", False), ("VISIBILITY_TIMEOUT", "sqlqueue.E004", False),
    ("LEASE_DURATION", "sqlqueue.E006", False), ("RENEW_INTERVAL", "sqlqueue.E007", False),
    ("GC_INTERVAL", "sqlqueue.E011", True), ("SHUTDOWN_GRACE", "sqlqueue.E012", True),
    ("MAX_HANDLER_TIME", "sqlqueue.E020", False), ("GROUP_RETENTION", "sqlqueue.E021", False),
]
COUNTS = [
    ("BATCH_SIZE", "sqlqueue.E003"), ("MAX_ATTEMPTS", "sqlqueue.E005"),
    ("MAX_PAYLOAD_BYTES", "sqlqueue.E009"), ("PUBLISH_BATCH_SIZE", "sqlqueue.E010"),
    ("PARTITIONS", "sqlqueue.E014"),
]
NOT_SECONDS = [math.nan, math.inf, -math.inf, -1, -0.001, 1e300, 10**30, "1", "1s", b"1",
               [1], {"seconds": 1}, True, False, Decimal("1")]
NOT_COUNTS = [0, -1, 1.0, 2.5, math.nan, math.inf, "10", None, True, [10]]


@pytest.mark.parametrize("value", NOT_SECONDS, ids=repr)
@pytest.mark.parametrize(("name", "check_id", "zero_ok"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_a_duration_that_is_not_a_sane_number_of_seconds_has_its_id(name, check_id, zero_ok, value):
    # Seconds are finite: NaN compares false with everything, infinity overflows a wait
    # or an epoch-millisecond column, and a year is longer than any of these should be.
    [error] = errors_for({name: value})

    assert error.id == check_id
    assert f"SQLQUEUE['{name}']" in error.msg


@pytest.mark.parametrize(("name", "check_id", "zero_ok"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_a_duration_of_zero_is_refused_unless_it_means_off(name, check_id, zero_ok):
    assert ids_for({name: 0}) == ([] if zero_ok else [check_id])


@pytest.mark.parametrize("value", NOT_COUNTS, ids=repr)
@pytest.mark.parametrize(("name", "check_id"), COUNTS, ids=[c[0] for c in COUNTS])
def test_a_count_that_is_not_a_positive_integer_has_its_id(name, check_id, value):
    [error] = errors_for({name: value})

    assert error.id == check_id


@pytest.mark.parametrize(("name", "value"), [
    ("POLL_INTERVAL", 365 * 86400), ("VISIBILITY_TIMEOUT", 365 * 86400.0),
    ("GC_INTERVAL", 365 * 86400), ("SHUTDOWN_GRACE", 365 * 86400),
    ("MAX_HANDLER_TIME", 365 * 86400), ("GROUP_RETENTION", 365 * 86400),
    ("MAX_ATTEMPTS", 10**9), ("BATCH_SIZE", 10**9), ("MAX_PAYLOAD_BYTES", 2**40),
    ("PUBLISH_BATCH_SIZE", 10**6), ("PARTITIONS", 4096),
])
def test_the_largest_accepted_value_passes(name, value):
    assert errors_for({name: value}) == []


@pytest.mark.parametrize(("name", "value", "check_id"), [
    ("POLL_INTERVAL", 365 * 86400 + 1, "sqlqueue.E002"),
    ("VISIBILITY_TIMEOUT", 365 * 86400 + 0.5, "sqlqueue.E004"),
    ("GROUP_RETENTION", 365 * 86400 + 1, "sqlqueue.E021"),
])
def test_a_duration_over_a_year_is_refused_naming_the_limit(name, value, check_id):
    [error] = errors_for({name: value})

    assert error.id == check_id
    assert "at most 31536000 (a year)" in error.msg


def test_a_lease_of_a_day_passes_and_a_longer_one_is_e006():
    # A worker bounds its idle transactions by the lease, and PostgreSQL takes at most
    # 24.8 days for that bound.
    assert errors_for({"LEASE_DURATION": 86400, "RENEW_INTERVAL": 3600}) == []
    [error] = errors_for({"LEASE_DURATION": 86401, "RENEW_INTERVAL": 3600})

    assert error.id == "sqlqueue.E006"
    assert "at most 86400 (a day)" in error.msg


def test_the_shortest_timings_in_use_stay_valid():
    assert errors_for({"POLL_INTERVAL": 0.05, "GC_INTERVAL": 1, "SHUTDOWN_GRACE": 2,
                       "LEASE_DURATION": 6, "RENEW_INTERVAL": 2, "VISIBILITY_TIMEOUT": 0.5,
                       "MAX_HANDLER_TIME": 0.5, "GROUP_RETENTION": 0.5}) == []


@pytest.mark.parametrize("value", ["_dlq\n", "\n", ".dlq\n"])
def test_a_dlq_suffix_ending_in_a_line_break_is_e008(value):
    assert ids_for({"DLQ_SUFFIX": value}) == ["sqlqueue.E008"]


def test_keys_of_any_type_are_reported_as_unknown_without_failing():
    [error] = errors_for({1: 2, None: 3, ("POLL_INTERVAL",): 4, "POLL_INTERVAL": 0.5})

    assert error.id == "sqlqueue.E001"
    assert "1" in error.msg and "None" in error.msg and "('POLL_INTERVAL',)" in error.msg


@pytest.mark.parametrize("topic", ["orders\n", "x" * 256, 7, None])
def test_a_topics_key_that_cannot_be_a_topic_is_e015(topic):
    assert ids_for({"TOPICS": {topic: {"PARTITIONS": 4}}}) == ["sqlqueue.E015"]


def test_every_bad_value_is_reported_at_once():
    assert ids_for({"POLL_INTERVAL": 0, "BATCH_SIZE": 0, "unknown": 1}) == [
        "sqlqueue.E001", "sqlqueue.E002", "sqlqueue.E003"
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [("GC_INTERVAL", 0), ("SHUTDOWN_GRACE", 0), ("DLQ_SUFFIX", "x" * 50), ("DLQ_SUFFIX", ".dlq"),
     ("MAX_HANDLER_TIME", None), ("MAX_HANDLER_TIME", 0.5), ("GROUP_RETENTION", None)],
)
def test_boundary_value_is_accepted(name, value):
    assert errors_for({name: value}) == []


# --------------------------------------------------------------------------- E013


def test_renew_interval_equal_to_lease_duration_is_e013():
    [error] = errors_for({"LEASE_DURATION": 10, "RENEW_INTERVAL": 10})

    assert error.id == "sqlqueue.E013"
    assert error.hint


def test_renew_interval_longer_than_lease_duration_is_e013():
    assert ids_for({"LEASE_DURATION": 5, "RENEW_INTERVAL": 10}) == ["sqlqueue.E013"]


def test_default_renew_interval_longer_than_a_short_lease_is_e013():
    assert ids_for({"LEASE_DURATION": 10}) == ["sqlqueue.E013"]


# --------------------------------------------------------------------------- E014, E015


@pytest.mark.parametrize("value", [0, -1, 4097, 2.0, "16", True, None])
def test_a_bad_partition_count_is_e014(value):
    assert ids_for({"PARTITIONS": value}) == ["sqlqueue.E014"]


def test_a_bad_per_topic_partition_count_is_e014_naming_the_topic():
    [error] = errors_for({"TOPICS": {"orders": {"PARTITIONS": 0}}})

    assert error.id == "sqlqueue.E014"
    assert "SQLQUEUE['TOPICS']['orders']['PARTITIONS']" in error.msg


@pytest.mark.parametrize(
    ("topics", "needle"),
    [
        ([("orders", 4)], "must be a dict"),
        ({"orders": 4}, "dict of options"),
        ({"bad topic": {"PARTITIONS": 4}}, "not a topic name"),
        ({"orders": {"PARTITONS": 4}}, "unknown option(s): PARTITONS"),
    ],
    ids=["not-a-dict", "options-not-a-dict", "bad-topic-name", "misspelt-option"],
)
def test_a_malformed_topics_setting_is_e015(topics, needle):
    [error] = errors_for({"TOPICS": topics})

    assert error.id == "sqlqueue.E015"
    assert needle in error.msg


def test_per_topic_partitions_override_the_default():
    with override_settings(SQLQUEUE={"PARTITIONS": 8, "TOPICS": {"orders": {"PARTITIONS": 64}}}):
        conf = get_settings()

    assert (conf.partitions_for("orders"), conf.partitions_for("other")) == (64, 8)


# --------------------------------------------------------------------------- W001


def database_warnings(check, engine: str, options: dict) -> list[str]:
    databases = {"default": {**settings.DATABASES["default"], "ENGINE": engine,
                             "OPTIONS": options}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding setting DATABASES ..."
        with override_settings(DATABASES=databases):
            return [message.id for message in check()]


def isolation_warnings(engine: str, options: dict) -> list[str]:
    return database_warnings(check_database_isolation, engine, options)


def test_mysql_repeatable_read_is_w001():
    assert isolation_warnings(
        "django.db.backends.mysql", {"isolation_level": "repeatable read"}
    ) == ["sqlqueue.W001"]


def test_mysql_serializable_is_w001():
    assert isolation_warnings(
        "django.db.backends.mysql", {"isolation_level": "serializable"}
    ) == ["sqlqueue.W001"]


def test_mysql_isolation_level_none_uses_the_server_default_and_is_w001():
    assert isolation_warnings("django.db.backends.mysql", {"isolation_level": None}) == [
        "sqlqueue.W001"
    ]


def test_mysql_read_committed_passes():
    assert isolation_warnings(
        "django.db.backends.mysql", {"isolation_level": "read committed"}
    ) == []


def test_mysql_without_an_isolation_level_passes():
    assert isolation_warnings("django.db.backends.mysql", {}) == []


def test_isolation_level_of_other_backends_is_not_checked():
    assert isolation_warnings(
        "django.db.backends.postgresql", {"isolation_level": "repeatable read"}
    ) == []


def test_sqlite_with_lazy_locking_is_w002():
    assert database_warnings(
        check_sqlite_transaction_mode, "django.db.backends.sqlite3", {}
    ) == ["sqlqueue.W002"]


def test_sqlite_with_immediate_transactions_passes():
    assert database_warnings(
        check_sqlite_transaction_mode, "django.db.backends.sqlite3",
        {"transaction_mode": "IMMEDIATE"},
    ) == []


def liveness_warnings(engine: str, *, liveness: object = True, **config: object) -> list[str]:
    databases = {"default": {"ENGINE": engine, "NAME": "x", **config}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding setting DATABASES ..."
        with override_settings(DATABASES=databases, SQLQUEUE={"LIVENESS": liveness}):
            return [f"{message.id} {message.msg}" for message in check_liveness()]


@pytest.mark.parametrize("engine", ["django.db.backends.postgresql", "django.db.backends.mysql"])
def test_workers_holding_a_liveness_lock_pass(engine):
    assert liveness_warnings(engine) == []


def test_sqlite_is_w101_as_its_workers_have_leases_alone():
    [warning] = liveness_warnings("django.db.backends.sqlite3")
    assert warning.startswith("sqlqueue.W101 ") and "SQLite has no server session" in warning


@pytest.mark.parametrize("engine", ["django.db.backends.postgresql", "django.db.backends.mysql"])
def test_liveness_turned_off_is_w101(engine):
    [warning] = liveness_warnings(engine, liveness=False)
    assert "SQLQUEUE['LIVENESS'] is False" in warning


def test_a_postgresql_alias_set_up_for_a_transaction_pooler_is_w101():
    [warning] = liveness_warnings("django.db.backends.postgresql",
                                  DISABLE_SERVER_SIDE_CURSORS=True)
    assert "transaction pooler" in warning


def test_a_pooled_alias_with_a_direct_connection_holds_its_lock_there():
    pg = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
    databases = {"default": {**pg, "PORT": 26432, "DISABLE_SERVER_SIDE_CURSORS": True},
                 "direct": pg}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with override_settings(DATABASES=databases, SQLQUEUE={"DIRECT_DATABASE": "direct"}):
            assert check_liveness() == []
            assert check_pooler() == []


# --------------------------------------------------------------------------- read replicas

PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
REPLICATED = {"default": PG, "queue": {**PG, "PORT": 5433}, "queue_replica": {**PG, "PORT": 5434},
              "other": {**PG, "PORT": 5435}, "mysql": {"ENGINE": "django.db.backends.mysql"}}
ROUTED = ["django_sqlqueue.routers.QueueRouter"]


def replica_messages(read_database: object, **sqlqueue: object) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with override_settings(DATABASES=REPLICATED, DATABASE_ROUTERS=ROUTED,
                               SQLQUEUE={"DATABASE": "queue", "READ_DATABASE": read_database,
                                         **sqlqueue}):
            return [f"{message.id} {message.msg}" for message in check_read_database()]


@pytest.mark.parametrize("value", [None, "queue_replica", {"queue": "queue_replica"},
                                   {"queue": "queue"}])
def test_a_replica_of_the_queue_alias_passes(value):
    assert replica_messages(value) == []


def test_read_database_answers_the_replica_of_a_queue_alias_and_any_other_alias_itself():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in ("queue_replica", {"queue": "queue_replica"}):
            with override_settings(DATABASES=REPLICATED, DATABASE_ROUTERS=ROUTED,
                                   SQLQUEUE={"DATABASE": "queue", "READ_DATABASE": value}):
                assert read_database() == read_database("queue") == "queue_replica"
                assert read_database("other") == "other"
        with override_settings(DATABASES=REPLICATED, DATABASE_ROUTERS=ROUTED,
                               SQLQUEUE={"DATABASE": "queue"}):
            assert read_database() == "queue"


@pytest.mark.parametrize(("value", "says"), [
    (["queue_replica"], "must be None, an alias of DATABASES or a dict"),
    ("replica", "SQLQUEUE['READ_DATABASE'] must name an alias of DATABASES"),
    ({"queue": "replica"}, "SQLQUEUE['READ_DATABASE']['queue'] must name an alias"),
    ({"queue": 5}, "got 5"),
    ({"other": "queue_replica"}, "has the key 'other', which holds no queue tables"),
    ({"queue": "mysql"}, "on another engine than 'queue'"),
])
def test_a_read_database_that_is_not_a_replica_of_a_queue_alias_is_e018(value, says):
    [message] = replica_messages(value)
    assert message.startswith("sqlqueue.E018 ") and says in message


def test_a_read_database_holding_another_queue_is_e018():
    # A topic on a database of its own (SQLQUEUE["TOPICS"][name]["DATABASE"]) makes that
    # alias a queue alias too: it is no replica of "queue".
    [message] = replica_messages({"queue": "other"},
                                 TOPICS={"reports": {"DATABASE": "other"}})
    assert "'other', which holds queue tables of its own" in message


def pooler_messages(sqlqueue: dict[str, object], **config: object) -> list[str]:
    databases = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x",
                             "DISABLE_SERVER_SIDE_CURSORS": True, **config}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with override_settings(DATABASES=databases, SQLQUEUE=sqlqueue):
            return [f"{message.id} {message.msg}" for message in check_pooler()]


def test_a_pooled_alias_without_a_direct_connection_is_w102():
    [warning] = pooler_messages({})
    assert warning.startswith("sqlqueue.W102 ") and "polling only" in warning


def test_a_pooled_alias_without_notifications_needs_no_direct_connection():
    assert pooler_messages({"NOTIFY": False}) == []


def test_prepared_statements_behind_a_pooler_are_w103():
    messages = pooler_messages({"NOTIFY": False}, OPTIONS={"prepare_threshold": 5})
    assert [m.split()[0] for m in messages] == ["sqlqueue.W103"]
    assert pooler_messages({"NOTIFY": False}, OPTIONS={"prepare_threshold": None}) == []


@pytest.mark.parametrize("direct", ["nowhere", 5, ""])
def test_a_direct_database_that_is_no_alias_is_e102(direct):
    [error] = pooler_messages({"DIRECT_DATABASE": direct})
    assert error.startswith("sqlqueue.E102 ")


def test_pooler_checks_stay_silent_without_a_pooler():
    with override_settings(SQLQUEUE={}):
        assert check_pooler() == []


def test_liveness_is_a_deployment_check():
    sqlite = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with override_settings(DATABASES=sqlite):
            assert "sqlqueue.W101" not in [m.id for m in run_checks(tags=["sqlqueue"])]
            assert "sqlqueue.W101" in [m.id for m in run_checks(
                tags=["sqlqueue"], include_deployment_checks=True)]


@pytest.mark.django_db  # Django's own model checks ask SQLite whether it has JSON1
def test_database_checks_run_with_the_default_check_run():
    databases = {"default": {**settings.DATABASES["default"],
                             "ENGINE": "django.db.backends.mysql",
                             "OPTIONS": {"isolation_level": "repeatable read"}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with override_settings(DATABASES=databases):
            ids = [message.id for message in run_checks()]

    assert "sqlqueue.W001" in ids


# --------------------------------------------------------------------------- get_settings


def test_get_settings_returns_the_documented_defaults():
    with override_settings(SQLQUEUE={}):
        conf = get_settings()

    assert conf.poll_interval == 0.1
    assert conf.batch_size == 10
    assert conf.visibility_timeout == 30
    assert conf.max_attempts == 5
    assert conf.lease_duration == 30
    assert conf.renew_interval == 10
    assert conf.dlq_suffix == "_dlq"
    assert conf.max_payload_bytes == 1024 * 1024
    assert conf.publish_batch_size == 500
    assert conf.gc_interval == 60
    assert conf.shutdown_grace == 30


def test_get_settings_overrides_only_the_given_keys():
    with override_settings(SQLQUEUE={"BATCH_SIZE": 1, "DLQ_SUFFIX": ".dead"}):
        conf = get_settings()

    assert (conf.batch_size, conf.dlq_suffix, conf.max_attempts) == (1, ".dead", 5)


def test_get_settings_follows_override_settings():
    before = get_settings().max_attempts

    with override_settings(SQLQUEUE={"MAX_ATTEMPTS": before + 1}):
        inside = get_settings().max_attempts

    assert (inside, get_settings().max_attempts) == (before + 1, before)


# --------------------------------------------------------------------------- tasks

QUEUE_BACKEND = "django_sqlqueue.tasks.QueueBackend"


def task_check_ids(tasks_setting) -> list[str]:
    with override_settings(TASKS=tasks_setting):
        return [error.id for error in check_task_backends()]


def test_a_valid_tasks_setting_passes():
    assert task_check_ids({"default": {"BACKEND": QUEUE_BACKEND, "QUEUES": ["default", "emails"],
                                       "OPTIONS": {"MAX_ATTEMPTS": 3}}}) == []


def test_a_queue_backend_without_queues_has_the_default_queue_and_passes():
    assert task_check_ids({"default": {"BACKEND": QUEUE_BACKEND}}) == []


@pytest.mark.parametrize(("options", "check_id"), [
    ({"MAX_ATTEMPTS": 0}, "sqlqueue.E051"),
    ({"BACKOFF": 5}, "sqlqueue.E052"),
    ({"VISIBILITY_TIMEOUT": -1}, "sqlqueue.E053"),
    ({"RESULT_RETENTION": "a week"}, "sqlqueue.E054"),
    ({"RETRIES": 3}, "sqlqueue.E050"),
])
def test_a_bad_task_backend_option_has_its_own_id(options, check_id):
    assert task_check_ids({"default": {"BACKEND": QUEUE_BACKEND, "QUEUES": ["default"],
                                       "OPTIONS": options}}) == [check_id]


def test_a_queue_name_that_cannot_name_a_topic_is_e055():
    assert task_check_ids({"default": {"BACKEND": QUEUE_BACKEND,
                                       "QUEUES": ["has space"]}}) == ["sqlqueue.E055"]


@pytest.mark.parametrize("queues", [[], (), "default", None, [["default"]]])
def test_queues_that_are_not_a_non_empty_list_of_names_are_e056(queues):
    with override_settings(TASKS={"default": {"BACKEND": QUEUE_BACKEND, "QUEUES": queues}}):
        [error] = check_task_backends()
    assert error.id == "sqlqueue.E056"
    assert "TASKS['default']['QUEUES']" in error.msg
    assert error.hint and "'QUEUES': ['default', 'emails']" in error.hint


def test_a_queue_named_by_two_queue_backends_is_e057():
    with override_settings(TASKS={
        "default": {"BACKEND": QUEUE_BACKEND, "QUEUES": ["default", "emails"]},
        "other": {"BACKEND": QUEUE_BACKEND, "QUEUES": ["emails"]},
    }):
        [error] = check_task_backends()
    assert error.id == "sqlqueue.E057"
    assert "'emails' is in TASKS['default'] and TASKS['other']" in error.msg


def test_other_task_backends_are_not_checked():
    assert task_check_ids({"default": {
        "BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []}}) == []


def test_task_backend_errors_are_reported_once_by_a_full_check_run():
    # Django's own Tasks check runs too (the test settings import django.tasks); the
    # backend leaves its settings to this app's check, so nothing is reported twice.
    with override_settings(TASKS={"default": {"BACKEND": QUEUE_BACKEND, "QUEUES": []}}):
        ids = [message.id for message in run_checks()]
    assert ids.count("sqlqueue.E056") == 1
