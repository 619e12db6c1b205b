"""A partition being handed to another worker waits only for handlers that exist.

A worker gives partitions away (a peer joined, or it stops) by draining them: it reads no
more from them and releases each once its handlers are done. A message can be in flight
with no handler in the worker at all: its handler was skipped because the lease was in
doubt when a thread came free, or its outcome could not be recorded. Such a message waits
for nothing, so it must not keep the partition from the peer: the partition is released
at once, and the new owner redelivers the message when its visibility runs out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.registry import Subscription, subscriptions, unregister
from django_sqlqueue.models import PartitionLease, SubscriberHeartbeat
from django_sqlqueue.partitioning import partition_for
from django_sqlqueue.worker.process import Worker
from tests.refusals import contains, refusing
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = pytest.mark.django_db(transaction=True)


def key_in(partition: int, partitions: int, prefix: str = "k") -> str:
    return next(f"{prefix}{n}" for n in range(1000)
                if partition_for(f"{prefix}{n}", partitions) == partition)


def holder(topic: str, partition: str) -> str:
    return PartitionLease.objects.filter(topic=topic, partition_key=partition).values_list(
        "leased_by", flat=True).get()


# --------------------------------------------------------------------------- in-process


@pytest.fixture
def gated() -> Iterator[tuple[Subscription, threading.Event, list[tuple[int, int]]]]:
    """"stuck" (two partitions) with a handler that blocks messages marked so on a gate."""
    gate = threading.Event()
    seen: list[tuple[int, int]] = []

    @sqlqueue.subscriber("stuck", group="gated")
    def handle(message: sqlqueue.Message) -> None:
        seen.append((message.offset, message.attempt))
        if message.payload.get("block"):
            gate.wait(10)

    [registered] = [s for s in subscriptions() if (s.topic, s.group) == ("stuck", "gated")]
    try:
        yield registered, gate, seen
    finally:
        gate.set()
        unregister("stuck", "gated")


def skip_the_victims_handler(worker: Worker, gate: threading.Event,
                              seen: list[tuple[int, int]]) -> int:
    """Start a handler blocking the worker's only thread in partition 0 and queue a
    victim in partition 1; stall the poll loop past the lease while the thread goes on,
    so the victim's handler is skipped when the thread comes free. Returns its offset."""
    blocker = sqlqueue.publish("stuck", {"block": True}, key=key_in(0, 2))
    victim = sqlqueue.publish("stuck", {}, key=key_in(1, 2))
    assert worker._step("start", worker._start) == 0.0
    deadline = time.monotonic() + 5
    while worker.dispatcher.busy < 2 and time.monotonic() < deadline:
        worker._step("poll", worker._tick)
        time.sleep(0.05)
    assert seen == [(blocker.offset, 1)]  # the victim waits for the only thread
    time.sleep(1.2)  # past the 1 s lease: no renewal meanwhile
    gate.set()
    wait_until(lambda: worker.dispatcher.busy == 0, timeout=5, what="the thread free")
    assert (victim.offset, 1) not in seen
    return victim.offset


def poll_until(worker: Worker, done: Callable[[], bool], seconds: float) -> float:
    """Run the worker's polls until ``done()``; return the seconds it took."""
    started = time.monotonic()
    while not done() and time.monotonic() < started + seconds:
        worker._step("poll", worker._tick)
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_draining_partition_whose_queued_handler_was_skipped_is_released(gated, settings):
    settings.SQLQUEUE = {**settings.SQLQUEUE, "LEASE_DURATION": 1.0, "RENEW_INTERVAL": 0.2}
    registered, gate, seen = gated
    worker = Worker([registered], name="w1", concurrency=1)
    try:
        skip_the_victims_handler(worker, gate, seen)
        # A peer joins: the worker gives partition 1 away.
        SubscriberHeartbeat.objects.beat("gated", "stuck", "w2", worker.clock.now_ms(), "default")
        took = poll_until(worker, lambda: holder("stuck", "1") == "", 5)
        assert holder("stuck", "1") == ""
        assert took < 1.0 + 0.5  # within a lease (and a poll or two)
        assert holder("stuck", "0") == "w1"
    finally:
        gate.set()
        worker.dispatcher.shutdown(wait=True)


def test_a_skipped_handler_runs_once_the_lease_is_renewed_as_the_same_attempt(gated, settings):
    settings.SQLQUEUE = {**settings.SQLQUEUE, "LEASE_DURATION": 1.0, "RENEW_INTERVAL": 0.2}
    registered, gate, seen = gated
    worker = Worker([registered], name="w1", concurrency=1)
    try:
        victim = skip_the_victims_handler(worker, gate, seen)
        # Nobody took the lease: the worker renews it and runs the message at once, not
        # after its visibility timeout (5 s), and the skipped start is no attempt.
        took = poll_until(worker, lambda: any(o == victim for o, _ in seen), 4)
        assert (victim, 1) in seen
        assert took < 1.0
    finally:
        gate.set()
        worker.dispatcher.shutdown(wait=True)


# --------------------------------------------------------------------------- real workers


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


@pytest.mark.worker
def test_a_partition_whose_outcome_could_not_be_recorded_reaches_a_peer(workers):
    # The database refuses to record this message's failure, every time: the worker gives
    # up on the outcome, and the message stays in flight with no handler.
    refused = contains("last_error", "refuse-me")
    with refusing("sqlqueue_test_refuse_nack", "queue_delivery_state", "UPDATE", refused):
        first = workers.start("drain-a", "--topic", "hostile",
                              settings={"VISIBILITY_TIMEOUT": 60.0})
        sqlqueue.publish("hostile", {"error": "refuse-me"}, key=key_in(3, 4, "bad"))
        wait_until(lambda: "giving up recording a handler outcome" in first.stderr,
                   what="the outcome given up", watch=[first])
        wait_until(lambda: first.leases() == 4, what="the first worker holding everything",
                   watch=[first])

        # A peer joins: the first worker drains partitions 2 and 3 and releases them.
        second = workers.start("drain-b", "--topic", "hostile",
                               settings={"VISIBILITY_TIMEOUT": 60.0})
        wait_until(lambda: second.leases() == 2, timeout=8,
                   what="the peer holding the two partitions given away",
                   watch=[first, second])
        assert holder("hostile", "3") == "drain-b"
        later = sqlqueue.publish("hostile", {}, key=key_in(3, 4, "good"))
        wait_until(lambda: Handled.objects.filter(offset=later.offset, pid=second.pid).exists(),
                   what="the peer handling the partition's next message",
                   watch=[first, second])
