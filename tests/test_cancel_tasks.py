"""Cancelling a task that has not started: its result reads FAILED with a ``Cancelled``
error and it never runs; a task already running or finished is left as it is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqlqueue.exceptions import Cancelled, SQLQueueError
from django_sqlqueue.tasks.compat import TaskResultDoesNotExist, TaskResultStatus
from tests.testapp import tasks
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.compat]

CANCELLED = "django_sqlqueue.exceptions.Cancelled"


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def backend():  # type: ignore[no-untyped-def]
    return tasks.remember.get_backend()


def ran(label: str) -> bool:
    return Handled.objects.filter(group="tasks", key=label).exists()


def status(result_id: str) -> TaskResultStatus:
    return backend().get_result(result_id).status


def test_a_cancelled_ready_task_reads_failed_with_cancelled_and_never_runs(workers):
    doomed = tasks.remember.enqueue("doomed")
    assert status(doomed.id) == TaskResultStatus.READY

    outcome = backend().cancel(doomed.id, by="ops")

    assert outcome.cancelled
    result = backend().get_result(doomed.id)
    assert result.status == TaskResultStatus.FAILED and result.finished_at is not None
    assert [e.exception_class_path for e in result.errors] == [CANCELLED]
    assert result.errors[0].exception_class is Cancelled
    assert issubclass(Cancelled, SQLQueueError)
    assert "cancelled by ops before it started" in result.errors[0].traceback
    after = tasks.remember.enqueue("after")
    worker = workers.start("tasks", "--queue", "ordered")
    wait_until(lambda: status(after.id) == TaskResultStatus.SUCCESSFUL,
               what="the task enqueued after it", watch=[worker])
    assert not ran("doomed")
    assert status(doomed.id) == TaskResultStatus.FAILED
    assert backend().cancel(doomed.id).cancelled is False  # said so, nothing changed


def test_a_running_task_is_not_cancelled_and_finishes(workers):
    worker = workers.start("tasks", "--queue", "ordered")
    busy = tasks.remember.enqueue("busy", sleep=2)
    wait_until(lambda: ran("busy"), what="the task starting", watch=[worker])

    outcome = backend().cancel(busy.id)

    assert not outcome.cancelled and outcome.result.status == TaskResultStatus.RUNNING
    wait_until(lambda: status(busy.id) == TaskResultStatus.SUCCESSFUL,
               what="the task finishing", watch=[worker])
    finished = backend().cancel(busy.id)
    assert not finished.cancelled and finished.result.status == TaskResultStatus.SUCCESSFUL
    assert finished.result.errors == []


def test_a_waiting_task_is_cancelled_while_a_worker_runs_its_queue(workers):
    worker = workers.start("tasks", "--queue", "ordered")
    blocker = tasks.remember.enqueue("blocker", sleep=1)
    wait_until(lambda: ran("blocker"), what="the first task starting", watch=[worker])
    later = tasks.remember.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    assert backend().cancel(later.id).cancelled
    wait_until(lambda: status(blocker.id) == TaskResultStatus.SUCCESSFUL,
               what="the first task", watch=[worker])
    assert status(later.id) == TaskResultStatus.FAILED and not ran("later")


def test_cancelling_an_unknown_task_says_it_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        backend().cancel("no-such-result")
