"""A window rebuilt while one of its handlers runs hands that message out once.

A window is rebuilt from the database after a failed poll cycle, after an operator's nudge
(``deliver_now``) and when a partition is taken again. A message whose handler still runs
in the worker then stays in flight until its visibility runs out, and is redelivered once:
never twice at the same moment (two handlers of one delivery, and on PostgreSQL an upsert
reaching one row twice, which failed every later cycle of the worker).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.backoff import ExponentialBackoff
from django_sqlqueue.consuming.registry import Subscription, subscriptions, unregister
from django_sqlqueue.models import DeliveryState
from django_sqlqueue.models.delivery import DeliveryRow, MessageRef, ReadRow
from django_sqlqueue.models.messages import MessageRow
from django_sqlqueue.operations import deliver_now
from django_sqlqueue.worker.partitions import Partition
from django_sqlqueue.worker.priority import best_first
from django_sqlqueue.worker.process import Worker
from tests.testapp.models import Handled
from tests.worker_harness import position_of, wait_until, watermark, worker_pool

# --------------------------------------------------------------------------- the window alone


def subscription(**options: object) -> Subscription:
    return Subscription(topic="t", group="g", handler=lambda message: None, max_attempts=3,
                        visibility_timeout=30.0, batch_size=10, backoff=ExponentialBackoff(),
                        auto_extend=True, **options)  # type: ignore[arg-type]


def rebuilt_with_a_running_entry(partition: Partition) -> None:
    """What rebuilding a window does for a delivered message whose handler still runs."""
    row = MessageRow(offset=7, position=1, topic="t", key="", id="7", payload="{}",
                     metadata="{}", published_at=0, deliver_at=0)
    admitted = partition.admit(ReadRow("0", row, DeliveryRow(False, 0, 1000, "")), 0,
                               may_deliver=False)
    assert admitted.entry is not None
    partition.running(admitted.entry)


def test_a_rebuilt_running_entry_comes_due_once():
    partition = Partition(subscription(), "0", generation=1)
    rebuilt_with_a_running_entry(partition)

    assert [e.offset for e in partition.take_ready(now_ms=1000, limit=10)] == [7]
    assert partition.take_ready(now_ms=5000, limit=10) == []


def test_a_rebuilt_running_entry_of_a_prioritised_subscription_comes_due_once():
    partition = Partition(subscription(priority_of=lambda payload: 0), "0", generation=1)
    rebuilt_with_a_running_entry(partition)

    assert [e.offset for _, e in best_first([partition], now_ms=1000, limit=10)] == [7]
    assert best_first([partition], now_ms=5000, limit=10) == []


def test_a_delivery_row_is_upserted_once_when_named_twice(transactional_db):
    ref = MessageRef("0", 42)
    DeliveryState.objects.mark_delivered("g", "t", [ref], 1000, "default")

    DeliveryState.objects.mark_delivered("g", "t", [ref, ref], 2000, "default")

    row = DeliveryState.objects.get(consumer_group="g", topic="t", message_offset=42)
    assert (row.retry_count, row.invisible_until) == (1, 2000)


# --------------------------------------------------------------------------- a worker in-process


@pytest.fixture
def unextended() -> Iterator[tuple[Subscription, list[tuple[int, int]]]]:
    """A handler without auto-extension whose first attempt outlives its 1 s visibility."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    @sqlqueue.subscriber("slow", group="rebuilt", auto_extend=False, visibility_timeout=1.0)
    def handle(message: sqlqueue.Message) -> None:
        with lock:
            seen.append((message.offset, message.attempt))
        if message.attempt == 1:
            time.sleep(1.8)

    [registered] = [s for s in subscriptions() if (s.topic, s.group) == ("slow", "rebuilt")]
    try:
        yield registered, seen
    finally:
        unregister("slow", "rebuilt")


@pytest.mark.django_db(transaction=True)
def test_a_window_rebuilt_after_a_failed_cycle_redelivers_a_running_message_once(unextended):
    registered, seen = unextended
    worker = Worker([registered], name="rebuilt", concurrency=4)
    failures: list[str] = []
    noted = worker.faults.failed

    def failed(step: str, exc: BaseException) -> float:
        failures.append(f"{type(exc).__name__}: {exc}")
        return noted(step, exc)

    worker.faults.failed = failed  # type: ignore[method-assign]
    try:
        message = sqlqueue.publish("slow", {}, key="a")
        assert worker._step("start", worker._start) == 0.0
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            worker._step("poll", worker._tick)
            time.sleep(0.05)
        assert seen == [(message.offset, 1)]
        # What the worker does after a cycle failed: every window is rebuilt, while the
        # first attempt still runs.
        for partition in worker.partitions.values():
            partition.unreliable()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            worker._step("poll", worker._tick)
            time.sleep(0.05)
    finally:
        worker.dispatcher.shutdown(wait=True)

    assert seen == [(message.offset, 1), (message.offset, 2)]
    assert failures == []


# --------------------------------------------------------------------------- real workers


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def attempts(offset: int) -> list[int]:
    return sorted(Handled.objects.filter(offset=offset).values_list("attempt", flat=True))


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_operator_nudge_while_a_handler_runs_redelivers_its_message_once(workers):
    # "stuck" hangs on a message's first attempt only; visibility 1 s, no extension after
    # 0.3 s: the message is redelivered while its first attempt still runs.
    worker = workers.start("nudged", "--topic", "stuck", "--topic", "manykeys",
                           "--concurrency", "4",
                           settings={"VISIBILITY_TIMEOUT": 1.0, "MAX_HANDLER_TIME": 0.3})
    hung = sqlqueue.publish("stuck", {"hang": 3}, key="hung")
    later = sqlqueue.publish("stuck", {}, key="later", delay=3600)
    wait_until(lambda: attempts(hung.offset) == [1], what="the first attempt", watch=[worker])

    # The operator makes the delayed message due: the worker rebuilds the topic's windows
    # while the first attempt still runs.
    assert deliver_now("billing", "stuck", later.offset)

    wait_until(lambda: attempts(later.offset) == [1], what="the nudged message",
               watch=[worker])
    wait_until(lambda: watermark("billing", "stuck", "hung") >= position_of(hung.offset),
               timeout=10, what="the hung message acked after its redelivery", watch=[worker])
    others = sqlqueue.publish_many("manykeys", [{"payload": {"n": n}, "key": f"k{n}"}
                                                for n in range(10)])
    wait_until(lambda: Handled.objects.filter(offset__in=[m.offset for m in others]).count()
               == 10, timeout=10, what="later messages of another topic", watch=[worker])
    assert attempts(hung.offset) == [1, 2]  # redelivered once, not twice at once
    assert "poll cycle failed" not in worker.stderr
