"""System checks for the SQLQUEUE setting, and the defaults get_settings() falls back to."""

from __future__ import annotations

import warnings

import pytest
from django.conf import settings
from django.core.checks import Error, run_checks
from django.test import override_settings

from django_sqlqueue.checks import (
    check_database_isolation,
    check_settings,
    check_sqlite_transaction_mode,
)
from django_sqlqueue.conf import DEFAULTS, get_settings


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
    ],
)
def test_bad_value_has_its_own_id_and_a_hint(name, value, check_id):
    [error] = errors_for({name: value})

    assert error.id == check_id
    assert f"SQLQUEUE['{name}']" in error.msg
    assert repr(value) in error.msg
    assert repr(DEFAULTS[name]) in error.hint


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
