"""Enqueueing many calls of a task at once: QueueBackend.enqueue_many() and
django_sqlqueue.tasks.enqueue_many() write N tasks in O(N / PUBLISH_BATCH_SIZE) statements,
all or nothing, with each call checked as enqueue() checks it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_sqlqueue.models import QueueMessage
from django_sqlqueue.rows import decode_json
from django_sqlqueue.tasks import InvalidTaskArguments, enqueue_many
from django_sqlqueue.tasks.compat import TaskResultStatus, task_enqueued
from tests.testapp import tasks
from tests.worker_harness import wait_until, worker_pool

pytestmark = pytest.mark.django_db


def inserts(queries: CaptureQueriesContext) -> int:
    return sum(1 for q in queries.captured_queries
               if q["sql"].lstrip().upper().startswith("INSERT") and "queue_messages" in q["sql"])


def test_a_thousand_tasks_take_two_inserts_not_a_thousand(settings):
    settings.SQLQUEUE = {**settings.SQLQUEUE, "PUBLISH_BATCH_SIZE": 500}
    calls = [((i, i + 1), {}) for i in range(1000)]
    with CaptureQueriesContext(connection) as queries:
        results = enqueue_many(tasks.add, calls)
    assert inserts(queries) == 2
    assert len(queries.captured_queries) <= 12  # whatever N: the inserts and a few reads
    assert [r.args for r in results] == [[i, i + 1] for i in range(1000)]
    assert len({r.id for r in results}) == 1000
    assert all(r.status == TaskResultStatus.READY for r in results)
    stored = {m.message_id: decode_json(m.payload)
              for m in QueueMessage.objects.filter(topic="tasks.default")}
    assert len(stored) == 1000
    first = stored[results[0].id]
    assert (first["task"], first["args"], first["kwargs"]) == ("tests.testapp.tasks.add", [0, 1], {})
    # Each is the task enqueue() would have written: get_result() reads it back.
    assert tasks.add.get_result(results[7].id).args == [7, 8]


def test_task_options_and_limits_apply_to_every_call():
    results = enqueue_many(tasks.sync_account.using(priority=5),
                           [((), {"account_id": n, "log": "-"}) for n in (1, 2)])
    payloads = [decode_json(QueueMessage.objects.get(message_id=r.id).payload) for r in results]
    assert [p["priority"] for p in payloads] == [5, 5]
    assert [(p["limits"]["key"], p["limits"]["max_running"]) for p in payloads] == [
        ("account:1", 2), ("account:2", 2)]


def test_one_bad_call_is_named_and_nothing_is_written():
    with pytest.raises(InvalidTaskArguments, match=r"calls\[2\].*JSON-serializable"):
        enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {}), ((object(), 1), {})])
    with pytest.raises(InvalidTaskArguments, match=r"calls\[1\] must be an \(args, kwargs\) pair"):
        enqueue_many(tasks.add, [((1, 2), {}), (1, 2, 3)])
    with pytest.raises(TypeError, match="list of \\(args, kwargs\\) pairs"):
        enqueue_many(tasks.add, {"a": 1})
    assert not QueueMessage.objects.exists()


def test_a_rolled_back_block_leaves_no_task_and_sends_no_signal():
    sent = []

    def receiver(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
            raise RuntimeError("the domain write failed")
        assert not QueueMessage.objects.exists()
        assert sent == []
    finally:
        task_enqueued.disconnect(receiver)


def test_no_calls_write_nothing():
    assert enqueue_many(tasks.add, []) == []
    assert not QueueMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_worker_runs_every_task_enqueued_at_once(tmp_path):
    results = enqueue_many(tasks.add, [((i, 1), {}) for i in range(30)])
    with worker_pool(tmp_path) as pool:
        worker = pool.start("bulk", "--queue", "default")
        backend = tasks.add.get_backend()

        def done() -> bool:
            return all(backend.get_result(r.id).is_finished for r in results)

        wait_until(done, timeout=30, what="the 30 tasks finished", watch=[worker])
    assert [backend.get_result(r.id).return_value for r in results] == [i + 1 for i in range(30)]
