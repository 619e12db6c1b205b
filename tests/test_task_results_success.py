"""The statement that sets task results SUCCESSFUL, on each backend: every row of the
batch gets its own timings and return value, JSON of any shape round-trips, and rows
outside the batch are left alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_sqlqueue.models import TaskResultRecord
from django_sqlqueue.models.task_results import SUCCESS_BATCH, Success, mark_successful

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 29, 0, 30, 15, 123456, tzinfo=UTC)


def running(count: int, prefix: str = "r") -> list[TaskResultRecord]:
    rows = [TaskResultRecord(id=f"{prefix}{n:05d}", task_path="tests.testapp.tasks.add",
                             backend="default", queue_name="default", status="RUNNING",
                             enqueued_at=T0, started_at=T0, last_attempted_at=T0,
                             worker_ids=["w"]) for n in range(count)]
    return TaskResultRecord.objects.bulk_create(rows)


def test_each_row_gets_its_own_timings_and_return_value():
    rows = running(5)
    values = [None, {"ü": [1, 2.5, False, None], "nested": {"a": "b"}}, 0, "", [True]]
    successes = [Success(row.id, T0 + timedelta(seconds=n), T0 + timedelta(seconds=10 + n),
                         value) for n, (row, value) in enumerate(zip(rows[:4], values, strict=False))]
    finished_at = T0 + timedelta(minutes=1)

    mark_successful(successes, finished_at, "default")

    fresh = TaskResultRecord.objects.in_bulk([row.id for row in rows])
    for n, success in enumerate(successes):
        row = fresh[success.id]
        assert (row.status, row.finished_at) == ("SUCCESSFUL", finished_at)
        assert row.started_at == T0 + timedelta(seconds=n)
        assert row.last_attempted_at == T0 + timedelta(seconds=10 + n)
        assert row.return_value == values[n]
    untouched = fresh[rows[4].id]
    assert (untouched.status, untouched.finished_at, untouched.started_at) == ("RUNNING", None, T0)


def test_more_rows_than_one_statement_takes_are_all_set():
    rows = running(SUCCESS_BATCH * 2 + 3)
    mark_successful([Success(row.id, T0, T0 + timedelta(microseconds=n), n)
                     for n, row in enumerate(rows)], T0 + timedelta(hours=1), "default")
    done = dict(TaskResultRecord.objects.filter(status="SUCCESSFUL")
                .values_list("id", "return_value"))
    assert done == {row.id: n for n, row in enumerate(rows)}
    assert TaskResultRecord.objects.filter(
        last_attempted_at=T0 + timedelta(microseconds=SUCCESS_BATCH + 1)).get().id == rows[
        SUCCESS_BATCH + 1].id


def test_ids_that_differ_only_in_case_or_a_trailing_space_are_told_apart():
    rows = TaskResultRecord.objects.bulk_create(
        TaskResultRecord(id=task_id, task_path="tests.testapp.tasks.add", backend="default",
                         queue_name="default", status="RUNNING", enqueued_at=T0,
                         worker_ids=["w"]) for task_id in ("abc", "ABC", "abc "))
    mark_successful([Success(rows[0].id, T0, T0, "mine")], T0, "default")
    statuses = dict(TaskResultRecord.objects.values_list("id", "status"))
    assert statuses == {"abc": "SUCCESSFUL", "ABC": "RUNNING", "abc ": "RUNNING"}
