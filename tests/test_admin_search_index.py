"""SQLQUEUE["SEARCH_FIELDS"]: checked settings, indexes made by migrate, and used by the search."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from django_sqlqueue.checks import check_settings
from django_sqlqueue.models import DeadLetter
from django_sqlqueue.models.payload_search import (
    ensure_search_indexes,
    index_name,
    indexed_column,
    match_lookup,
)
from tests.admin_fixtures import dead_letter


@pytest.mark.parametrize("fields", [
    "customer_id", ["1st"], ["customer-id"], ["ok", "OK"], ["x" * 41], [42],
])
def test_bad_search_fields_are_a_system_check_error(fields):
    with override_settings(SQLQUEUE={"SEARCH_FIELDS": fields}):
        assert [e.id for e in check_settings()] == ["sqlqueue.E080"]


def test_good_search_fields_pass_the_checks():
    with override_settings(SQLQUEUE={"SEARCH_FIELDS": ["customer_id", "order_id", "_x1"]}):
        assert check_settings() == []


def test_a_field_name_that_is_not_one_is_refused_before_any_sql(db):
    with pytest.raises(ValueError, match="not a payload field name"):
        match_lookup(connection, "x') OR 1=1 --", "1", indexed=False)
    with pytest.raises(ValueError, match="not a payload field name"):
        ensure_search_indexes(["x'"])


def test_migrate_indexed_the_declared_field(db):
    if connection.vendor == "mysql":
        assert indexed_column(connection, "customer_id") is not None
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "queue_messages")
    assert index_name("customer_id") in constraints


def test_ensure_is_idempotent_and_adds_a_new_field_once(transactional_db):
    # transactional_db: MariaDB commits around an ALTER TABLE.
    assert ensure_search_indexes(["customer_id"]) == []
    try:
        assert ensure_search_indexes(["order_ref"]) == ["order_ref"]
        assert ensure_search_indexes(["order_ref"]) == []
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute("ALTER TABLE queue_messages DROP COLUMN sqlqueue_s_order_ref")
            else:
                cursor.execute(f"DROP INDEX IF EXISTS {index_name('order_ref')}")


def _plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        else:
            cursor.execute("EXPLAIN " + sql, params)
        return " ".join(" ".join(str(v) for v in row) for row in cursor.fetchall())


def test_a_search_by_a_declared_field_reads_its_index(db):
    for n in range(30):
        dead_letter(payload={"customer_id": n})
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE queue_messages")
            cursor.execute("SET enable_seqscan = off")  # a tiny table: ask whether it can
    query = DeadLetter.objects.filter(
        match_lookup(connection, "customer_id", "7", indexed=True)).values("offset")
    compiled, compiled_params = query.query.sql_with_params()
    assert index_name("customer_id") in _plan(compiled, list(compiled_params))
    assert [row["offset"] for row in query] == list(
        DeadLetter.objects.filter(payload__customer_id=7).values_list("offset", flat=True))
