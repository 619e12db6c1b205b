"""Names compare byte for byte whatever the database's default collation.

On MariaDB/MySQL every CHAR/VARCHAR/TEXT column of the app's tables has the binary NO PAD
collation, except the free text listed below: a column a later migration adds without
``exact_names()`` fails here. The check runs on the test database and on a database this
module creates with the server's usual case-insensitive default, migrated from scratch in
a process of its own (tests/exact_names_probe.py), which then uses names that differ only
in case: schedules, archive marks, limit scopes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.conf import settings
from django.db import connection

from tests.exact_names_probe import probe

ON_MYSQL = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.mysql"
mysql_only = pytest.mark.skipif(
    not ON_MYSQL, reason="collations are MariaDB/MySQL's: PostgreSQL and SQLite compare text "
    "byte for byte whatever the database's default")

# Free text and JSON documents: never compared as names, searched case-insensitively.
FREE_TEXT = {
    ("queue_messages", "payload"), ("queue_messages", "metadata"),
    ("queue_messages", "last_error"), ("queue_delivery_state", "last_error"),
    ("queue_schedules", "definition"), ("queue_schedules", "reason"),
    ("queue_task_results", "args"), ("queue_task_results", "kwargs"),
    ("queue_task_results", "worker_ids"), ("queue_task_results", "errors"),
    ("queue_task_results", "return_value"),
}
EXACT = {"utf8mb4_nopad_bin", "utf8mb4_0900_bin"}  # MariaDB's, MySQL 8's
TEXT_TYPES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}


def app_tables() -> set[str]:
    config = apps.get_app_config("django_sqlqueue")
    return {model._meta.db_table for model in config.get_models(include_auto_created=True)}


def inexact(columns: list[list[str]]) -> list[tuple[str, str, str]]:
    """(table, column, collation) of each text column of the app's tables that is neither
    byte-exact nor listed as free text."""
    tables = app_tables()
    return sorted(
        (table, column, collation) for table, column, data_type, collation in columns
        if (table in tables or table.startswith("queue_")) and data_type in TEXT_TYPES
        and (table, column) not in FREE_TEXT and collation not in EXACT
    )


def text_columns() -> list[list[str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type, collation_name "
            "FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND collation_name IS NOT NULL")
        return [list(row) for row in cursor.fetchall()]


@pytest.fixture(scope="module")
def case_insensitive_database(django_db_setup: Any, django_db_blocker: Any) -> Any:
    """What tests/exact_names_probe.py saw on a database created utf8mb4_general_ci."""
    db = connection.settings_dict
    name = f"{db['NAME']}_ci"
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 "
                       "COLLATE utf8mb4_general_ci")
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    url = f"mysql://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}/{name}"
    try:
        run = subprocess.run(
            [sys.executable, "-m", "tests.exact_names_probe"], capture_output=True, text=True,
            timeout=120, env={**os.environ, "DATABASE_URL": url}, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        yield json.loads(run.stdout)
    finally:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


@mysql_only
@pytest.mark.django_db
def test_every_name_column_of_the_test_database_is_byte_exact():
    assert inexact(text_columns()) == []


@mysql_only
def test_every_name_column_is_byte_exact_on_a_case_insensitive_database(
        case_insensitive_database):
    assert case_insensitive_database["database_collation"] == "utf8mb4_general_ci"
    assert inexact(case_insensitive_database["columns"]) == []


@mysql_only
def test_schedules_differing_in_case_run_their_own_tasks(case_insensitive_database):
    seen = case_insensitive_database
    assert "drain_error" not in seen
    assert [status for _, status in seen["task_results"]] == ["SUCCESSFUL", "SUCCESSFUL"]
    assert [rid.split(":")[1] for rid, _ in seen["task_results"]] == ["Nightly", "nightly"]


@mysql_only
def test_a_topic_does_not_read_the_archive_marks_of_another_case(case_insensitive_database):
    assert case_insensitive_database["archive_marks"] == {"orders": {"0": 5000}, "Orders": {}}


@mysql_only
def test_limit_scopes_differing_in_case_have_their_own_slots(case_insensitive_database):
    assert case_insensitive_database["limit_scopes"] == ["group:Orders", "group:orders"]


@pytest.mark.django_db(transaction=True)
def test_names_differing_in_case_stay_distinct_on_the_test_database():
    seen = probe()
    assert "drain_error" not in seen
    assert len(seen["task_results"]) == 2
    assert seen["archive_marks"]["Orders"] == {}
    assert seen["limit_scopes"] == ["group:Orders", "group:orders"]
