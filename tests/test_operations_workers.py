"""Operations against real ``runqueueworker`` processes: pause and resume, replay to the
failed group only after GC, deliver now, release leases."""

from __future__ import annotations

import time

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations as ops
from django_sqlqueue.models import PartitionLease, QueueMessage, Throughput
from tests.testapp.models import Handled
from tests.worker_harness import position_of, wait_until, watermark, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

QUIET = 1.0  # seconds a paused worker must stay idle: 20 polls at the test POLL_INTERVAL


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def runs(topic: str, group: str = "billing") -> list[Handled]:
    return list(Handled.objects.filter(topic=topic, group=group).order_by("id"))


def test_a_paused_group_finishes_running_handlers_takes_nothing_new_and_resumes_in_order(
        workers):
    first = sqlqueue.publish("pausable", {"sleep": 1.5, "n": 0}, key="a")
    w1 = workers.start("w1", "--topic", "pausable")
    wait_until(lambda: runs("pausable"), what="the slow handler started", watch=[w1])

    assert ops.pause("billing", "pausable") is True
    # The running handler finishes and its ack is recorded while paused.
    wait_until(lambda: watermark("billing", "pausable", "a") >= position_of(first.offset),
               what="the running message acked while paused", watch=[w1])
    later = [sqlqueue.publish("pausable", {"sleep": 0, "n": n}, key="a") for n in (1, 2, 3)]
    time.sleep(QUIET)
    assert len(runs("pausable")) == 1
    assert PartitionLease.objects.filter(topic="pausable", leased_by="w1").count() == 4

    # Paused survives a restart: the new worker takes the lease and still waits.
    w1.terminate()
    assert w1.wait_exit(15) == 0
    w2 = workers.start("w2", "--topic", "pausable")
    wait_until(lambda: w2.leases() == 4, what="w2 holds the partitions", watch=[w2])
    time.sleep(QUIET)
    assert len(runs("pausable")) == 1
    assert ops.overview(topic="pausable")[0].paused is True
    assert ops.overview(topic="pausable")[0].lag == 3

    assert ops.resume("billing", "pausable") is True
    done = wait_until(lambda: len(runs("pausable")) == 4 and runs("pausable"),
                      what="the backlog handled after resume", watch=[w2])
    assert [r.payload["n"] for r in done] == [0, 1, 2, 3]
    assert [r.offset for r in done[1:]] == [m.offset for m in later]


def test_replay_after_gc_reaches_the_failed_group_only(workers, tmp_path):
    broken = tmp_path / "billing-broken"
    broken.touch()
    original = sqlqueue.publish("fixable", {"fail_while": str(broken), "customer_id": 42},
                                key="c-42", id="order-42")
    worker = workers.start("w1", "--topic", "fixable")
    dead = wait_until(lambda: QueueMessage.objects.filter(topic="fixable_dlq").first(),
                      what="billing's dead letter", watch=[worker])
    position = wait_until(lambda: position_of(original.offset), what="sequenced")
    wait_until(lambda: watermark("billing", "fixable", "c-42") >= position
               and watermark("shipping", "fixable", "c-42") >= position,
               what="both groups past the original", watch=[worker])
    assert dead.consumer_group == "billing"

    assert ops.run_gc(topic="fixable").deleted == {"fixable": 1}
    assert position_of(original.offset) is None  # the original is gone from the log
    broken.unlink()  # the handler is fixed

    outcome = ops.replay(ops.DeadLetterFilter(topic="fixable", group="billing"))

    assert (outcome.replayed, outcome.skipped) == (1, 0)
    billing = wait_until(lambda: len(runs("fixable")) == 3 and runs("fixable"),
                         what="billing ran the replay", watch=[worker])
    assert [r.attempt for r in billing] == [1, 2, 1]
    assert billing[-1].message_id == "order-42" and billing[-1].key == "c-42"
    assert billing[-1].payload["customer_id"] == 42
    replay = QueueMessage.objects.get(topic="fixable", message_id=f"replay:{dead.offset}")
    wait_until(lambda: watermark("billing", "fixable", "c-42") >= (replay.position or 1 << 62)
               and watermark("shipping", "fixable", "c-42") >= replay.position,
               what="both groups past the replay", watch=[worker])
    time.sleep(0.3)
    assert len(runs("fixable", "shipping")) == 1  # shipping never saw it again
    assert not QueueMessage.objects.filter(topic="fixable_dlq").exists()
    rows = {r.group: r for r in ops.overview(topic="fixable")}
    assert rows["billing"].lag == 0 and rows["shipping"].lag == 0
    assert rows["billing"].dead_letters == 0
    assert sum(rows["billing"].handled_per_minute) == 2  # the dead letter, then the replay
    assert Throughput.objects.filter(consumer_group="shipping").exists()


def test_bulk_replay_of_a_filtered_set_in_small_batches(workers, tmp_path):
    broken = tmp_path / "billing-broken"
    broken.touch()
    sqlqueue.publish_many("fixable", [
        {"payload": {"fail_while": str(broken), "n": n}, "key": f"k{n % 5}"} for n in range(24)])
    worker = workers.start("w1", "--topic", "fixable", "--concurrency", "8")
    wait_until(lambda: QueueMessage.objects.filter(topic="fixable_dlq").count() == 24,
               timeout=60, what="24 dead letters", watch=[worker])
    broken.unlink()
    evens = [m.offset for m in QueueMessage.objects.filter(topic="fixable_dlq")
             if m.payload["n"] % 2 == 0]

    outcome = ops.replay(ops.DeadLetterFilter(ids=tuple(evens), error_contains="broken"),
                         batch_size=5)

    assert outcome.replayed == 12
    wait_until(lambda: Handled.objects.filter(topic="fixable", group="billing",
                                              attempt=1)
               .count() == 24 + 12, timeout=60, what="the 12 replays handled", watch=[worker])
    replayed = sorted(r.payload["n"] for r in runs("fixable")[48:])
    assert replayed == list(range(0, 24, 2))
    assert QueueMessage.objects.filter(topic="fixable_dlq").count() == 12
    assert len(runs("fixable", "shipping")) == 24


def test_deliver_now_ends_a_retry_backoff_at_once(workers):
    message = sqlqueue.publish("retried", {"retry_in": 3600}, key="r")
    worker = workers.start("w1", "--topic", "retried")
    wait_until(lambda: runs("retried"), what="the first attempt", watch=[worker])
    time.sleep(0.3)  # its nack recorded

    assert ops.deliver_now("billing", "retried", message.offset) is True

    second = wait_until(lambda: len(runs("retried")) == 2 and runs("retried")[1], timeout=10,
                        what="the second attempt, long before the backoff", watch=[worker])
    assert second.attempt == 2


def test_released_leases_are_dropped_by_their_owner_and_taken_again(workers):
    worker = workers.start("w1", "--topic", "slow")
    wait_until(lambda: worker.leases() == 1, what="w1 holds the partition", watch=[worker])
    generation = PartitionLease.objects.get(topic="slow").generation

    assert ops.release_leases(subscriber="w1").leases == 1

    wait_until(lambda: PartitionLease.objects.get(topic="slow").generation > generation,
               what="the partition taken again", watch=[worker])
    sqlqueue.publish("slow", {"sleep": 0}, key="after")
    wait_until(lambda: runs("slow"), what="handled after the release", watch=[worker])
    assert "lease lost" in worker.stderr or "leases acquired" in worker.stderr
