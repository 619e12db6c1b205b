"""A dead worker is noticed at once, a slow one is not: real worker processes.

On PostgreSQL and MariaDB/MySQL each worker holds a liveness lock on a connection of its
own. ``kill -9`` closes that connection, the server releases the lock, and the other
worker takes the partitions within two seconds, however long the lease, under a new
generation. A worker that is only paused (SIGSTOP) keeps its lock and is taken over only
when its lease expires. SQLite has no server session: there a killed worker's partitions
wait for its lease, as the last test shows.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection
from django.urls import reverse

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.worker.liveness import SETTLE
from tests.testapp.models import Handled
from tests.worker_harness import keys_in_partition, lease_counts, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TOPIC, GROUP = "spread", "pool"  # 4 partitions
TAKEOVER = 2.0  # seconds from kill -9 to every partition leased by the survivor
# A lease far longer than the takeover: only the liveness lock can explain a fast one.
LONG_LEASE = {"LEASE_DURATION": 30.0, "RENEW_INTERVAL": 0.5}
SHORT_LEASE = {"LEASE_DURATION": 3.0, "RENEW_INTERVAL": 0.5}
needs_sessions = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no server session to hold a liveness lock: leases alone (documented)")


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def start_pair(workers, settings):  # type: ignore[no-untyped-def]
    """Two workers sharing the topic 2/2, each having advertised its liveness lock (where
    there is one) and held it long enough to judge the other by it."""
    a = workers.start("live-a", "--topic", TOPIC, settings=settings)
    b = workers.start("live-b", "--topic", TOPIC, settings=settings)
    wait_until(lambda: lease_counts(["live-a", "live-b"]) == [2, 2], what="a 2/2 share",
               watch=[a, b])
    if connection.vendor != "sqlite":
        wait_until(lambda: not PartitionLease.objects.filter(topic=TOPIC, liveness_token="")
                   .exists(), what="both workers' tokens on their leases", watch=[a, b])
        time.sleep(SETTLE)  # the survivor judges others only once its own lock settled
    return a, b


def partitions_of(name: str) -> dict[str, int]:
    return dict(PartitionLease.objects.filter(consumer_group=GROUP, topic=TOPIC, leased_by=name)
                .values_list("partition_key", "generation"))


@needs_sessions
def test_a_killed_workers_partitions_are_taken_over_within_two_seconds(workers):
    a, b = start_pair(workers, LONG_LEASE)
    assert "liveness=lock" in a.stderr
    b_had = partitions_of("live-b")

    b.kill()
    killed = time.monotonic()
    wait_until(lambda: len(partitions_of("live-a")) == 4, timeout=10,
               what="the survivor holding every partition", watch=[a])
    took = time.monotonic() - killed

    assert took <= TAKEOVER, f"took {took:.2f}s"
    # Taken as an expired lease is: each under the next generation, fencing the dead one.
    held = partitions_of("live-a")
    assert {p: held[p] for p in b_had} == {p: g + 1 for p, g in b_had.items()}
    # And consumed: a message on each of them is handled by the survivor.
    messages = [sqlqueue.publish(TOPIC, {"n": p}, key=keys_in_partition(TOPIC, p, 1)[0])
                for p in b_had]
    wait_until(lambda: Handled.objects.filter(topic=TOPIC, pid=a.pid, offset__in=[
        m.offset for m in messages]).count() == len(messages), timeout=5,
        what="the survivor handling the dead worker's partitions", watch=[a])

    # Restarted under its name (a supervisor's restart), it need not wait out the dead
    # process's 30-second lease: it starts once it sees that process's lock gone.
    again = workers.start("live-b", "--topic", TOPIC, settings=LONG_LEASE)
    wait_until(lambda: len(partitions_of("live-b")) == 2, timeout=SETTLE + 7,
               what="the restarted worker taking its share", watch=[a, again])


@needs_sessions
def test_a_paused_worker_is_taken_over_only_after_its_lease_expires(workers):
    a, b = start_pair(workers, SHORT_LEASE)
    b.send(signal.SIGSTOP)  # alive, its connections open: its lock stays held
    paused = time.monotonic()
    try:
        # Nothing moves while the lease lasts (minus the renewal b may have missed).
        patience = SHORT_LEASE["LEASE_DURATION"] - SHORT_LEASE["RENEW_INTERVAL"] - 0.3
        while time.monotonic() - paused < patience:
            assert len(partitions_of("live-a")) == 2, (
                f"taken over {time.monotonic() - paused:.2f}s into a "
                f"{SHORT_LEASE['LEASE_DURATION']}s lease")
            time.sleep(0.05)
        wait_until(lambda: len(partitions_of("live-a")) == 4, timeout=10,
                   what="the survivor taking the paused worker's expired leases", watch=[a])
    finally:
        b.send(signal.SIGCONT)
    wait_until(lambda: "lease lost" in b.stderr, what="the paused worker noticing", watch=[a])


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the other databases notice at once")
def test_on_sqlite_a_killed_workers_partitions_wait_for_its_lease(workers):
    a, b = start_pair(workers, SHORT_LEASE)
    assert "liveness=lease" in a.stderr
    b.kill()
    killed = time.monotonic()
    wait_until(lambda: len(partitions_of("live-a")) == 4, timeout=15,
               what="the survivor taking the expired leases", watch=[a])
    took = time.monotonic() - killed

    assert took >= SHORT_LEASE["LEASE_DURATION"] - SHORT_LEASE["RENEW_INTERVAL"] - 0.3


@needs_sessions
def test_a_killed_worker_leaves_the_overview_and_frees_its_group_at_once(workers, settings,
                                                                          admin_client):
    """Its heartbeat is fresh for a whole lease more, but its session closed with it: the
    overview, the subscribers page and ``forget`` all know it is gone."""
    from django_sqlqueue import operations
    from django_sqlqueue.models import SubscriberHeartbeat

    settings.SQLQUEUE = {**settings.SQLQUEUE, "LEASE_DURATION": 30.0}
    worker = workers.start("seen", "--topic", TOPIC, settings=LONG_LEASE)
    wait_until(lambda: SubscriberHeartbeat.objects.filter(subscriber_name="seen")
               .exclude(liveness_token="").exists(),
               what="its heartbeat carrying its liveness token", watch=[worker])

    def live() -> int | None:
        return {r.group: r.workers for r in operations.overview(topic=TOPIC)}.get(GROUP)

    assert live() == 1
    worker.kill()
    killed = time.monotonic()
    wait_until(lambda: live() == 0, timeout=TAKEOVER, what="the overview counting it gone")
    assert time.monotonic() - killed < 30.0  # long before its heartbeat ages
    page = admin_client.get(reverse("admin:django_sqlqueue_subscriber_changelist"))
    assert '<span class="sqlqueue-bad">gone</span>' in page.content.decode()
    forgotten = operations.forget(GROUP, topic=TOPIC)  # refused while a worker runs
    assert forgotten.heartbeats >= 1


@needs_sessions
def test_a_killed_workers_limit_slot_is_free_again_at_once(workers, tmp_path):
    """max_running=1: the worker running the only slot's message is killed. Its slot would
    expire with its lease (30 s); its closed session says it is gone, so the other worker
    takes the slot within seconds and runs the message that waited for it."""
    from django_sqlqueue.models import LimitSlot

    log = tmp_path / "runs.log"
    a = workers.start("slot-a", "--topic", "capped-one", settings=LONG_LEASE)
    b = workers.start("slot-b", "--topic", "capped-one", settings=LONG_LEASE)
    wait_until(lambda: lease_counts(["slot-a", "slot-b"]) == [2, 2],
               what="a 2/2 share", watch=[a, b])
    wait_until(lambda: not PartitionLease.objects.filter(topic="capped-one", liveness_token="")
               .exists(), what="both workers' tokens on their leases", watch=[a, b])
    time.sleep(SETTLE)
    owner = dict(PartitionLease.objects.filter(topic="capped-one")
                 .values_list("partition_key", "leased_by"))
    b_part = next(p for p, name in owner.items() if name == "slot-b")
    a_part = next(p for p, name in owner.items() if name == "slot-a")
    sqlqueue.publish("capped-one", {"log": str(log), "sleep": 120},
                     key=keys_in_partition("capped-one", b_part, 1)[0])
    wait_until(lambda: LimitSlot.objects.filter(scope__contains="capped-one")
               .exclude(holder="").exists(), what="b running the only slot's message",
               watch=[a, b])
    waiting = sqlqueue.publish("capped-one", {"log": str(log)},
                               key=keys_in_partition("capped-one", a_part, 1)[0])
    time.sleep(1.0)
    assert not log.exists()  # the slot is b's: a's message waits

    b.kill()
    killed = time.monotonic()
    wait_until(lambda: log.exists() and f" {waiting.offset} " in log.read_text(), timeout=15,
               what="a running the waiting message", watch=[a])
    assert time.monotonic() - killed <= 5.0, "waited for the dead worker's slot to expire"
