"""Handing tasks out marks their results RUNNING in the cycle's transaction: a first
attempt's row is inserted, a row that exists already (a replay, a retry, a duplicate) is
updated under its lock. Where the database can skip existing rows in an insert
(PostgreSQL, SQLite), the first attempts of a cycle cost one statement."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqlqueue.consuming.message import Message
from django_sqlqueue.models import QueueMessage, TaskResultRecord
from django_sqlqueue.models.task_results import can_skip_existing
from django_sqlqueue.tasks.runner import TaskRunner
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def delivered(result_id: str, attempt: int = 1) -> Message:
    row = QueueMessage.objects.get(payload__id=result_id)
    return Message(topic=row.topic, key=row.message_key, id=row.message_id, offset=row.offset,
                   payload=row.payload, headers={}, published_at=timezone.now(),
                   attempt=attempt)


def test_first_attempts_are_inserted_running_in_one_statement_where_the_database_can():
    results = [tasks.add.enqueue(n, n) for n in range(5)]
    runner = TaskRunner("w1")
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        runner.handed_out([delivered(r.id) for r in results], "default")
    writes = [q["sql"] for q in captured.captured_queries
              if "task" in q["sql"].lower() and not q["sql"].upper().startswith(
                  ("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]
    assert len(writes) == (1 if can_skip_existing("default") else 2), writes
    rows = TaskResultRecord.objects.filter(id__in=[r.id for r in results])
    assert sorted((row.status, row.worker_ids) for row in rows) == [("RUNNING", ["w1"])] * 5


def test_a_task_whose_row_exists_is_marked_running_on_its_row_beside_new_ones():
    earlier = tasks.add.enqueue(1, 1)
    runner = TaskRunner("w1")
    with transaction.atomic():
        runner.handed_out([delivered(earlier.id)], "default")
    # Its next run (the worker died, say) is handed out with first attempts of others.
    fresh = [tasks.add.enqueue(n, n) for n in range(3)]
    again = TaskRunner("w2")
    with transaction.atomic():
        again.handed_out([delivered(earlier.id, attempt=2), *(delivered(r.id) for r in fresh)],
                         "default")
    row = TaskResultRecord.objects.get(id=earlier.id)
    assert (row.status, row.worker_ids) == ("RUNNING", ["w1", "w2"])
    assert len(row.errors) == 1  # the run w1 never finished is recorded as lost
    for result in fresh:
        assert TaskResultRecord.objects.get(id=result.id).worker_ids == ["w2"]


def test_a_replayed_first_attempt_of_a_finished_task_is_not_marked_running_again():
    done = tasks.add.enqueue(2, 2)
    TaskResultRecord.objects.create(
        id=done.id, task_path=done.task.module_path, backend="default", queue_name="default",
        status="SUCCESSFUL", enqueued_at=timezone.now(), worker_ids=["w0"], errors=[])
    runner = TaskRunner("w1")
    with transaction.atomic():
        runner.handed_out([delivered(done.id)], "default")
    row = TaskResultRecord.objects.get(id=done.id)
    assert (row.status, row.worker_ids) == ("SUCCESSFUL", ["w0"])
