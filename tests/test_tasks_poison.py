"""A malformed message on a tasks topic is dead-lettered at its first attempt with a reason
a person can read, and the tasks behind it in its partition run (a real worker process)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import QueueMessage, TaskResultRecord
from django_sqlqueue.tasks.compat import TaskResultStatus, task_backends
from django_sqlqueue.tasks.limits import MAX_TASK_RUNNING
from django_sqlqueue.tasks.options import InvalidTaskLimits, task_options
from django_sqlqueue.tasks.payload import InvalidTaskPayload, parse
from tests.testapp import tasks
from tests.worker_harness import keys_in_partition, wait_until, worker_pool

TOPIC = "tasks.default"
GOOD = {"task": "tests.testapp.tasks.add", "backend": "default", "args": [2, 3], "kwargs": {},
        "priority": 0, "run_after": None}
# name: (what the payload becomes, a fragment of the reason)
MALFORMED: dict[str, tuple[Any, str]] = {
    "not_an_object": (["tests.testapp.tasks.add"], "not an object"),
    "missing_id": ({k: v for k, v in GOOD.items()}, "no 'id' field"),
    "id_not_a_string": ({"id": 7}, "'id' must be a non-empty string"),
    "id_too_long": ({"id": "i" * 300}, "'id' is 300 characters long"),
    "task_too_long": ({"task": "t." + "x" * 300}, "'task' is 302 characters long"),
    "backend_too_long": ({"backend": "b" * 150}, "'backend' is 150 characters long"),
    "unknown_backend": ({"backend": "nowhere"}, "backend 'nowhere', which is not in TASKS"),
    "missing_task": ({"task": None}, "'task' must be a non-empty string"),
    "priority_text": ({"priority": "high"}, "'priority' must be an int"),
    "priority_out_of_range": ({"priority": 10**30}, "'priority' must be an int"),
    "priority_bool": ({"priority": True}, "'priority' must be an int"),
    "run_after_text": ({"run_after": "tomorrow"}, "'run_after' must be an ISO 8601"),
    "run_after_number": ({"run_after": 12}, "'run_after' must be an ISO 8601"),
    "run_after_year_1": ({"run_after": "0001-01-01T00:00:00+00:00"}, "'run_after' must be from"),
    "args_not_a_list": ({"args": "2, 3"}, "'args' must be a list"),
    "kwargs_not_an_object": ({"kwargs": [1]}, "'kwargs' must be a object"),
    "limits_not_an_object": ({"limits": "1/s"}, "'limits' must be an object"),
    "rate_a_list": ({"limits": {"rate": ["10/s"]}}, "rate must be a string"),
    "rate_unreadable": ({"limits": {"rate": "lots"}}, "rate must look like"),
    "rate_too_long": ({"limits": {"rate": "1" * 40 + "/s"}}, "rate must be at most"),
    "max_running_huge": ({"limits": {"max_running": 10**8}}, "max_running of a task must be at most"),
    "max_running_zero": ({"limits": {"max_running": 0}}, "max_running must be an int >= 1"),
    "max_running_text": ({"limits": {"max_running": "2"}}, "max_running must be an int >= 1"),
    "limits_key_not_a_string": ({"limits": {"key": 5, "max_running": 1}}, "'limits.key' must be"),
    "task_not_a_task": ({"task": "os.path.join"}, "unknown task path"),
}


def malformed(name: str) -> Any:
    change, _ = MALFORMED[name]
    if not isinstance(change, dict):
        return change
    if name == "missing_id":
        return dict(change)
    return {**GOOD, "id": f"poison-{name}", **change}


@pytest.mark.parametrize("name", sorted(set(MALFORMED) - {"task_not_a_task"}))  # see the worker
def test_parse_refuses_each_malformed_field_with_its_reason(name):
    with pytest.raises(InvalidTaskPayload, match=re.escape(MALFORMED[name][1])):
        parse(malformed(name), TOPIC, {"default": "default"})


def test_parse_reads_what_enqueue_writes():
    payload = {**GOOD, "id": "ok", "priority": -100,
               "run_after": "2030-01-01T00:00:00+00:00",
               "limits": {"key": "account:7", "max_running": MAX_TASK_RUNNING, "rate": "10/s"}}
    parsed = parse(payload, TOPIC, {"default": "default"})
    assert (parsed.id, parsed.priority, parsed.args) == ("ok", -100, [2, 3])
    assert parsed.claim is not None and parsed.claim.max_running == MAX_TASK_RUNNING


def test_task_options_refuses_a_max_running_a_worker_would_refuse():
    with pytest.raises(InvalidTaskLimits, match=f"at most {MAX_TASK_RUNNING:,}"):
        task_options(max_running=MAX_TASK_RUNNING + 1)(lambda: None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_every_malformed_task_message_is_dead_lettered_and_the_tasks_behind_it_run(tmp_path):
    ids = {}
    for n, name in enumerate(sorted(MALFORMED)):
        ids[name] = f"msg-{name}"
        sqlqueue.publish(TOPIC, malformed(name), key=f"poison-{n}", id=ids[name])
    # Behind them, one good task in every partition of the queue.
    good = []
    for partition in range(4):
        key = keys_in_partition(TOPIC, str(partition), 1, prefix="good")[0]
        result_id = uuid.uuid4().hex
        sqlqueue.publish(TOPIC, {**GOOD, "id": result_id, "args": [partition, 1]}, key=key,
                         id=result_id)
        good.append(result_id)

    with worker_pool(tmp_path) as pool:
        worker = pool.start("poison", "--queue", "default")
        backend = tasks.add.get_backend()
        wait_until(lambda: TaskResultRecord.objects.filter(id__in=good, status="SUCCESSFUL")
                   .count() == len(good), timeout=60, what="the good tasks", watch=[worker])
        dead = wait_until(
            lambda: (lambda rows: rows if len(rows) == len(MALFORMED) else None)(
                dict(QueueMessage.objects.filter(topic=TOPIC + "_dlq")
                     .values_list("original_id", "last_error"))),
            timeout=60, what="every malformed message dead-lettered", watch=[worker])
        log = worker.stdout + worker.stderr

    assert [backend.get_result(i).return_value for i in good] == [1, 2, 3, 4]
    wrong = {name: dead.get(ids[name]) for name, (_, reason) in MALFORMED.items()
             if reason not in (dead.get(ids[name]) or "")}
    assert not wrong, f"dead-lettered without the expected reason: {wrong}"
    assert "poll cycle failed" not in log
    # Each at its first attempt: no retry as a failure of the poll cycle.
    attempts = QueueMessage.objects.filter(topic=TOPIC + "_dlq").values_list("failure_count",
                                                                             flat=True)
    assert set(attempts) == {1}
    # A malformed message whose id can be stored leaves its result FAILED with the reason.
    row = TaskResultRecord.objects.get(id="poison-unknown_backend")
    assert row.status == "FAILED" and row.backend == "default"  # the queue's: pruned with it
    assert "which is not in TASKS" in row.errors[-1]["traceback"]
    result = backend.get_result("poison-unknown_backend")
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path.endswith("InvalidTaskPayload")
    assert TaskResultRecord.objects.get(id="poison-priority_text").status == "FAILED"


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["priority_text", "run_after_text", "args_not_a_list"])
def test_get_result_of_a_waiting_malformed_task_says_why_it_will_not_run(name):
    sqlqueue.publish(TOPIC, malformed(name), id=f"poison-{name}")

    with pytest.raises(InvalidTaskPayload, match=re.escape(MALFORMED[name][1])):
        task_backends["default"].get_result(f"poison-{name}")
