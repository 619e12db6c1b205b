"""The consuming worker end to end: real ``runqueueworker`` processes, a real database.

Handlers live in ``tests/testapp/queues.py`` and record every run in ``Handled``; the
tests publish from this process and watch the queue's tables and ``Handled``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import PartitionLease, QueueMessage, SubscriberHeartbeat
from tests.helpers import start_thread
from tests.testapp.models import Handled
from tests.worker_harness import (
    lease_counts,
    partition_heads,
    partition_of,
    partition_watermark,
    position_of,
    wait_stable,
    wait_until,
    watermark,
    worker_pool,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.compat]

EPSILON = 0.05  # seconds of slack for timing assertions between processes on this host


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def handled_offsets(group: str, topic: str = "orders") -> set[int]:
    return set(Handled.objects.filter(group=group, topic=topic).values_list("offset", flat=True))


def attempts_of(group: str, offset: int, topic: str = "orders") -> list[int]:
    return list(
        Handled.objects.filter(group=group, topic=topic, offset=offset)
        .order_by("attempt").values_list("attempt", flat=True)
    )


def watermarks_at_heads(group: str, topic: str) -> bool:
    heads = partition_heads(topic)
    return bool(heads) and all(partition_watermark(group, topic, p) == head for p, head in heads.items())


def dlq_rows(topic: str) -> list[QueueMessage]:
    return list(QueueMessage.objects.filter(topic=topic).order_by("consumer_group"))


# --------------------------------------------------------------------------- consumer groups


def test_two_groups_consume_the_same_topic_independently(workers):
    published = sqlqueue.publish_many(
        "orders", [{"payload": {"n": n}, "key": f"k{n % 4}"} for n in range(20)]
    )
    offsets = {m.offset for m in published}
    worker = workers.start("groups", "--topic", "orders")

    for group in ("billing", "shipping"):
        wait_until(lambda g=group: handled_offsets(g) >= offsets, what=f"{group} handling all 20",
                   watch=[worker])
        wait_until(lambda g=group: watermarks_at_heads(g, "orders"),
                   what=f"{group} watermarks at the partition heads", watch=[worker])
    assert handled_offsets("billing") == handled_offsets("shipping") == offsets

    # One group failing a message leaves the other untouched.
    failing = sqlqueue.publish("orders", {"fail_for": "shipping"}, key="k0")
    wait_until(lambda: len(attempts_of("shipping", failing.offset)) >= 2,
               what="shipping retrying the failing message", watch=[worker])
    wait_until(lambda: watermark("billing", "orders", "k0") >= position_of(failing.offset),
               what="billing acking the message shipping fails", watch=[worker])
    assert attempts_of("billing", failing.offset) == [1]
    assert not QueueMessage.objects.filter(topic="orders_dlq", consumer_group="billing").exists()


# --------------------------------------------------------------------------- dead letters


def test_a_message_that_always_fails_lands_in_the_failing_groups_dlq_only(workers):
    original = sqlqueue.publish("orders", {"fail_for": "shipping"}, key="k")
    poison = sqlqueue.publish("poison", {"n": 1}, key="k")
    worker = workers.start("dlq", "--topic", "orders", "--topic", "poison",
                           settings={"MAX_ATTEMPTS": 2})

    wait_until(lambda: len(dlq_rows("orders_dlq")) and len(dlq_rows("poison_dlq")),
               what="both dead-letter copies", watch=[worker])
    wait_until(lambda: watermark("billing", "orders", "k") >= position_of(original.offset),
               what="billing acking the original", watch=[worker])

    [dead] = dlq_rows("orders_dlq")
    assert (dead.consumer_group, dead.original_topic, dead.original_offset) == (
        "shipping", "orders", original.offset)
    assert dead.failure_count == 2
    assert "cannot handle order" in dead.last_error
    assert dead.payload == {"fail_for": "shipping"}
    assert attempts_of("shipping", original.offset) == [1, 2]
    assert attempts_of("billing", original.offset) == [1]
    assert QueueMessage.objects.filter(offset=original.offset, topic="orders").exists()

    # "poison" declares max_attempts=3, which wins over MAX_ATTEMPTS.
    [dead_poison] = dlq_rows("poison_dlq")
    assert (dead_poison.consumer_group, dead_poison.original_topic,
            dead_poison.original_offset, dead_poison.failure_count) == (
        "billing", "poison", poison.offset, 3)
    assert "poison message" in dead_poison.last_error
    assert attempts_of("billing", poison.offset, topic="poison") == [1, 2, 3]


def test_two_groups_failing_the_same_message_make_two_dlq_entries(workers):
    doomed = sqlqueue.publish("doomed", {"n": 1}, key="k")
    worker = workers.start("doomed", "--topic", "doomed")

    wait_until(lambda: len(dlq_rows("doomed_dlq")) >= 2, what="two dead-letter copies",
               watch=[worker])

    rows = dlq_rows("doomed_dlq")
    assert [(r.consumer_group, r.original_offset, r.failure_count, r.message_id) for r in rows] == [
        ("billing", doomed.offset, 2, f"billing:{doomed.offset}"),
        ("shipping", doomed.offset, 2, f"shipping:{doomed.offset}"),
    ]
    assert [r.last_error for r in rows] == [
        "RuntimeError: doomed for billing", "RuntimeError: doomed for shipping",
    ]
    for group in ("billing", "shipping"):
        assert attempts_of(group, doomed.offset, topic="doomed") == [1, 2]


# --------------------------------------------------------------------------- crashes and stops


def test_a_killed_workers_message_is_redelivered_after_the_visibility_timeout(workers):
    # Leases go stale sooner than the handler's visibility timeout (2 s for "slow"), so the
    # timeout, not the lease, decides when the message comes back.
    settings = {"LEASE_DURATION": 1.2, "RENEW_INTERVAL": 0.3}
    sqlqueue.publish("slow", {"sleep": 0}, key="k")
    a = workers.start("crash-a", "--topic", "slow", settings=settings)
    wait_until(lambda: a.leases() == 1, what="worker A leasing the partition", watch=[a])
    b = workers.start("crash-b", "--topic", "slow", settings=settings)
    wait_until(lambda: SubscriberHeartbeat.objects.filter(subscriber_name="crash-b").exists(),
               what="worker B running", watch=[b])

    message = sqlqueue.publish("slow", {"sleep": 30}, key="k")
    [first] = wait_until(
        lambda: list(Handled.objects.filter(offset=message.offset)),
        what="worker A starting the slow handler", watch=[a],
    )
    a.kill()
    lease = PartitionLease.objects.get(consumer_group="billing", topic="slow",
                                      partition_key=partition_of("slow", "k"))

    [again] = wait_until(
        lambda: list(Handled.objects.filter(offset=message.offset, pid=b.pid)),
        timeout=15, what="worker B redelivering the message", watch=[b],
    )
    assert (first.pid, first.attempt) == (a.pid, 1)
    assert lease.leased_by == "crash-a"
    assert again.attempt == 2
    # Not before the message's visibility timeout ran out...
    assert again.handled_at - first.handled_at >= 2.0 - EPSILON
    # ...nor before A's lease went stale (A renewed it last at lease_renewed_at).
    assert again.handled_at * 1000 >= lease.lease_renewed_at + 1200 - EPSILON * 1000
    assert Handled.objects.filter(offset=message.offset).count() == 2
    b.kill()


def test_sigterm_releases_leases_so_a_peer_takes_over_at_once(workers):
    sqlqueue.publish_many("orders", [{"payload": n, "key": f"k{n}"} for n in range(4)])
    # Leases this long never go stale during the test: B can only take what A released.
    settings = {"LEASE_DURATION": 10.0}
    args = ("--group", "billing", "--topic", "orders")
    a = workers.start("term-a", *args, settings=settings)
    wait_stable(a.leases, 12, hold=0.2, what="A holding all twelve partitions", watch=[a])
    b = workers.start("term-b", *args, settings=settings)
    wait_stable(lambda: lease_counts(["term-a", "term-b"]), [6, 6], hold=0.6,
                what="the two workers' lease counts", watch=[a, b])

    a.terminate()
    assert a.wait_exit(timeout=5) == 0
    exited_at = time.monotonic()

    assert a.leases() == 0
    heartbeats = SubscriberHeartbeat.objects.filter(subscriber_name="term-a")
    assert heartbeats.exists()
    assert all(h.deregistered_at > 0 for h in heartbeats)
    wait_until(lambda: b.leases() == 12, timeout=2.0, what="B taking all twelve partitions",
               watch=[b])
    assert time.monotonic() - exited_at < 2.0


def test_three_workers_share_12_partitions_4_4_4_and_two_share_them_6_6(workers):
    sqlqueue.publish_many("orders", [{"payload": n, "key": f"k{n:02}"} for n in range(12)])
    names = ["share-a", "share-b", "share-c"]
    started = [workers.start(name, "--group", "billing", "--topic", "orders") for name in names]

    wait_stable(lambda: lease_counts(names), [4, 4, 4], hold=1.0,
                what="lease counts of three workers", watch=started)
    assert PartitionLease.objects.filter(consumer_group="billing", topic="orders").count() == 12

    started[0].terminate()
    assert started[0].wait_exit(timeout=5) == 0
    wait_stable(lambda: lease_counts(names[1:]), [6, 6], hold=1.0,
                what="lease counts of the two remaining workers", watch=started[1:])


# --------------------------------------------------------------------------- ordering


def strict_runs(key: str) -> list[Handled]:
    return list(Handled.objects.filter(topic="strict", key=key).order_by("handled_at", "id"))


def test_batch_size_1_processes_each_partition_strictly_in_order(workers):
    expected: dict[str, list[int]] = defaultdict(list)
    for n in range(60):
        message = sqlqueue.publish("strict", {"seq": n}, key=f"s{n % 3}")
        expected[message.key].append(message.offset)
    # Two workers: partitions may move between them while the backlog is worked off.
    started = [workers.start(name, "--topic", "strict") for name in ("strict-a", "strict-b")]

    wait_until(lambda: Handled.objects.filter(topic="strict").count() >= 60,
               what="all 60 strict messages handled", watch=started)
    wait_until(lambda: watermarks_at_heads("ordered", "strict"),
               what="watermarks at the partition heads", watch=started)

    for key, offsets in expected.items():
        runs = strict_runs(key)
        assert [r.offset for r in runs] == offsets, f"partition {key} out of publish order"
        assert {r.attempt for r in runs} == {1}
        # The handler sleeps 2 ms after recording its start: a run that began before the
        # previous one of its partition had returned would start less than 2 ms after it.
        gaps = [b.handled_at - a.handled_at for a, b in zip(runs, runs[1:], strict=False)]
        assert min(gaps) >= 0.002, f"partition {key}: overlapping runs ({min(gaps):.4f} s apart)"


def test_batch_size_1_handles_one_publish_many_call_in_list_order(workers):
    published = sqlqueue.publish_many(
        "strict", [{"payload": {"seq": n}, "key": "batch"} for n in range(10)]
    )
    worker = workers.start("strict-list", "--topic", "strict")

    wait_until(lambda: len(strict_runs("batch")) >= 10, what="the ten messages handled",
               watch=[worker])
    assert [r.payload["seq"] for r in strict_runs("batch")] == list(range(10))
    assert [m.offset for m in published] == sorted(m.offset for m in published)


# --------------------------------------------------------------------------- commit order


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has a single writer: an open publisher transaction blocks every other "
    "publisher, so a later message can never commit first",
)
def test_a_late_committing_publishers_message_is_delivered(workers):
    sqlqueue.publish("orders", {"warm": "up"}, key="p")
    worker = workers.start("late", "--group", "billing", "--topic", "orders")
    wait_until(lambda: watermark("billing", "orders", "p") > 0, what="the worker consuming p",
               watch=[worker])

    inserted, release = threading.Event(), threading.Event()

    def late_publisher() -> int:
        with transaction.atomic():
            late = sqlqueue.publish("orders", {"name": "X"}, key="p")
            inserted.set()
            if not release.wait(15):
                raise AssertionError("the test never released the late publisher")
        return late.offset

    thread = start_thread(late_publisher, name="late-publisher")
    try:
        assert inserted.wait(10)
        y = sqlqueue.publish("orders", {"name": "Y"}, key="p")
        z = sqlqueue.publish("orders", {"name": "Z"}, key="p")
        wait_until(lambda: handled_offsets("billing") >= {y.offset, z.offset},
                   what="Y and Z handled", watch=[worker])
        wait_until(lambda: watermark("billing", "orders", "p") >= position_of(z.offset),
                   what="the watermark passing Y and Z", watch=[worker])
    finally:
        release.set()
    x_offset = thread.outcome()

    assert x_offset < y.offset < z.offset
    wait_until(lambda: x_offset in handled_offsets("billing"), what="X handled", watch=[worker])
    assert position_of(x_offset) > position_of(z.offset)
    wait_until(lambda: watermark("billing", "orders", "p") >= position_of(x_offset),
               what="the watermark passing X", watch=[worker])


# --------------------------------------------------------------------------- delays


def test_a_delayed_message_is_not_delivered_early(workers):
    worker = workers.start("delay", "--group", "billing", "--topic", "orders")
    # Started (and holding its partitions) first: on a loaded machine the start-up alone
    # could outlast the delay.
    wait_until(lambda: worker.leases(), what="the worker holding its partitions", watch=[worker])
    delayed = sqlqueue.publish("orders", {"name": "delayed"}, key="d", delay=3)
    control = sqlqueue.publish("orders", {"name": "control"}, key="d")
    assert (delayed.deliver_at - delayed.published_at).total_seconds() == pytest.approx(3, abs=0.01)

    [control_run] = wait_until(
        lambda: list(Handled.objects.filter(offset=control.offset)),
        what="the undelayed message handled", watch=[worker])
    # The delayed message, published first in the same partition, does not hold it back.
    assert control_run.handled_at < delayed.deliver_at.timestamp()
    assert not Handled.objects.filter(offset=delayed.offset).exists()

    [delayed_run] = wait_until(
        lambda: list(Handled.objects.filter(offset=delayed.offset)),
        timeout=10, what="the delayed message handled", watch=[worker])
    assert delayed_run.handled_at >= delayed.deliver_at.timestamp() - EPSILON
    assert delayed_run.attempt == 1


# --------------------------------------------------------------------------- burst mode


def test_burst_exits_0_once_nothing_is_deliverable(workers):
    published = sqlqueue.publish_many("orders", [{"payload": n, "key": f"k{n % 3}"}
                                                 for n in range(10)])
    worker = workers.start("burst", "--burst", "--group", "billing", "--topic", "orders")

    assert worker.wait_exit(timeout=15) == 0
    assert handled_offsets("billing") == {m.offset for m in published}
    assert not handled_offsets("shipping")
    assert worker.leases() == 0


def test_burst_works_off_a_strict_partition_completely(workers):
    for n in range(20):
        sqlqueue.publish("strict", {"seq": n}, key="one")
    # Frequent renewals: the worker learns early that nothing else is left to lease.
    worker = workers.start("strict-burst", "--burst", "--topic", "strict",
                           settings={"RENEW_INTERVAL": 0.1})

    assert worker.wait_exit(timeout=15) == 0
    assert [r.payload["seq"] for r in strict_runs("one")] == list(range(20))
