"""The Tasks backend in the enqueuing process: what enqueue writes, what it refuses, and
what get_result reads. Running tasks is in test_tasks_worker.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.models import QueueMessage, TaskResultRecord
from django_sqlqueue.rows import decode_json
from django_sqlqueue.tasks import InvalidTaskArguments, QueueBackend, task_options
from django_sqlqueue.tasks.compat import (
    SOURCE,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_sqlqueue.tasks.queues import configured_queues
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def nested_task():  # type: ignore[no-untyped-def]
    def inner() -> None:
        pass

    return inner


def test_the_backend_supports_defer_priority_results_and_async_tasks():
    backend = task_backends["default"]
    assert isinstance(backend, QueueBackend)
    assert (backend.supports_defer, backend.supports_priority, backend.supports_get_result,
            backend.supports_async_task) == (True, True, True, True)


def test_enqueue_publishes_one_keyless_message_on_the_queue_topic_and_no_result_row():
    result = tasks.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    message = QueueMessage.objects.get(topic="tasks.default", message_id=result.id)
    assert message.message_key == ""
    payload = decode_json(message.payload)
    assert (payload["task"], payload["args"], payload["kwargs"]) == (
        "tests.testapp.tasks.add", [2], {"b": 3})
    # A worker writes the result row as it starts the task.
    assert not TaskResultRecord.objects.exists()


def test_get_result_of_a_task_no_worker_started_reads_its_message():
    result = tasks.add.using(priority=7).enqueue(1, 2)
    again = tasks.add.get_result(result.id)
    assert (again.id, again.status, again.args, again.worker_ids, again.errors) == (
        result.id, TaskResultStatus.READY, [1, 2], [], [])
    assert again.task.priority == 7
    assert again.enqueued_at is not None and again.started_at is None


def test_an_unknown_result_id_raises_task_result_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("no-such-id")


def test_an_enqueue_rolled_back_leaves_neither_result_nor_message():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    assert not QueueMessage.objects.filter(message_id=result.id).exists()
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result.id)


def test_task_enqueued_is_sent_once_the_enqueue_commits(django_capture_on_commit_callbacks):
    seen = []

    def receiver(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((sender, task_result.id))

    task_enqueued.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            result = tasks.add.enqueue(1, 2)
            assert seen == []
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(QueueBackend, result.id)]


@pytest.mark.parametrize("args", [
    (object(),), ({1, 2},), (float("nan"),),
])
def test_arguments_that_are_not_json_are_refused_at_enqueue(args):
    with pytest.raises(InvalidTaskArguments, match="tests.testapp.tasks.add"):
        tasks.add.enqueue(*args)
    assert not QueueMessage.objects.exists()


def test_run_after_is_stored_and_delays_the_message_by_the_database_clock():
    run_after = timezone.now() + timedelta(minutes=5)
    result = tasks.add.using(run_after=run_after).enqueue(1, 2)
    message = QueueMessage.objects.get(message_id=result.id)
    assert tasks.add.get_result(result.id).task.run_after == run_after
    assert abs(message.deliver_at - run_after.timestamp() * 1000) < 2000


def test_a_nested_function_is_an_invalid_task():
    with pytest.raises(InvalidTask, match="module level"):
        tasks.task(nested_task())


@pytest.mark.parametrize("priority", [101, -101, 1.5])
def test_a_priority_out_of_range_is_an_invalid_task(priority):
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=priority)


def test_an_unknown_queue_is_an_invalid_task():
    with pytest.raises(InvalidTask, match="nowhere"):
        tasks.add.using(queue_name="nowhere")


def test_a_naive_run_after_is_an_invalid_task():
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))


@pytest.mark.parametrize("attempts", [0, 1001, "3", True])
def test_max_attempts_out_of_range_is_an_invalid_task(attempts):
    with pytest.raises(InvalidTask, match="max_attempts"):
        tasks.task(max_attempts=attempts)(tasks.add.func)
    with pytest.raises(InvalidTask, match="max_attempts"):
        task_options(max_attempts=attempts)


def test_a_backoff_without_a_delay_method_is_an_invalid_task():
    with pytest.raises(InvalidTask, match="backoff"):
        task_options(backoff=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- queues


def test_an_empty_queues_list_refuses_every_queue_at_enqueue():
    # Django reads QUEUES = [] as "any queue"; no worker runs any queue of it.
    empty = {"default": {"BACKEND": "django_sqlqueue.tasks.QueueBackend", "QUEUES": []}}
    with override_settings(TASKS=empty):
        # Tasks still import (the system check, sqlqueue.E056, says what is wrong) ...
        anywhere = tasks.add.using(queue_name="anything")
        for task in (tasks.add, anywhere):
            # ... but none is enqueued.
            with pytest.raises(InvalidTask, match=r"QUEUES'\] is empty"):
                task.enqueue(1, 2)
    assert not QueueMessage.objects.exists()


# --------------------------------------------------------------------------- run_after


@pytest.mark.parametrize("run_after", [
    datetime(9999, 12, 31, tzinfo=UTC),
    timezone.now() + timedelta(days=365_251),  # beyond the longest delay (1,000 years)
    datetime(1969, 12, 31, 23, 59, tzinfo=UTC),  # before the epoch due times count from
    datetime(1, 1, 2, tzinfo=ZoneInfo("Asia/Tokyo")),
])
def test_a_run_after_out_of_range_is_an_invalid_task(run_after):
    with pytest.raises(InvalidTask, match="run_after must be"):
        tasks.add.using(run_after=run_after).enqueue(1, 2)
    assert not QueueMessage.objects.exists()


def test_a_run_after_at_the_far_end_of_the_range_is_enqueued():
    run_after = timezone.now() + timedelta(days=365_000)
    result = tasks.add.using(run_after=run_after).enqueue(1, 2)
    assert tasks.add.get_result(result.id).task.run_after == run_after


def test_two_backends_sharing_a_queue_name_are_refused_when_a_worker_starts():
    backend = {"BACKEND": "django_sqlqueue.tasks.QueueBackend", "QUEUES": ["default"]}
    with override_settings(TASKS={"default": backend, "other": backend}), \
            pytest.raises(ConfigurationError, match="'default' is in TASKS"):
        configured_queues()


def test_the_worker_finds_every_queue_of_every_queue_backend_and_no_other():
    tasks_setting = {
        "default": {"BACKEND": "django_sqlqueue.tasks.QueueBackend", "QUEUES": ["a", "b"]},
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"
                      if SOURCE == "django.tasks" else
                      "django_tasks.backends.immediate.ImmediateBackend", "QUEUES": ["c"]},
    }
    with override_settings(TASKS=tasks_setting):
        assert configured_queues() == {"a": "default", "b": "default"}


def test_pruning_deletes_results_finished_before_the_cutoff_and_nothing_unfinished():
    now = timezone.now()
    old = now - timedelta(days=8)
    common = {"task_path": "tests.testapp.tasks.add", "backend": "default",
              "queue_name": "default", "enqueued_at": old}
    TaskResultRecord.objects.create(id="old-ok", status="SUCCESSFUL", finished_at=old, **common)
    TaskResultRecord.objects.create(id="old-failed", status="FAILED", finished_at=old, **common)
    TaskResultRecord.objects.create(id="recent", status="SUCCESSFUL", finished_at=now, **common)
    TaskResultRecord.objects.create(id="running", status="RUNNING", **common)
    deleted = TaskResultRecord.objects.prune(now - timedelta(days=7), batch=1)
    assert deleted == 2
    assert sorted(TaskResultRecord.objects.values_list("id", flat=True)) == ["recent", "running"]
