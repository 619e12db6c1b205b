"""Fencing and the database clock: a paused worker, and workers with wrong wall clocks.

A worker that was paused past its lease (SIGSTOP, then SIGCONT) must not deliver, ack or move
the watermark of a partition another worker took over meanwhile; and leases, visibility and
delays are judged by the database server's clock, so a worker whose own clock is off by a
minute and a half behaves exactly like the others.
"""

from __future__ import annotations

import glob
import os
import signal
import time

import pytest
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import ConsumerOffset, PartitionLease
from tests.testapp.models import Handled
from tests.worker_harness import (
    idle_transactions,
    lease_counts,
    partition_of,
    position_of,
    sessions_blocked_updating,
    wait_stable,
    wait_until,
    watermark,
    worker_pool,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


# Short leases so a paused worker loses its partition quickly.
FAST_LEASES = {"LEASE_DURATION": 1.5, "RENEW_INTERVAL": 0.3}


def runs(topic: str, offset: int) -> list[tuple[int, int]]:
    """(attempt, pid) of every handler run of a message, in attempt order."""
    return list(
        Handled.objects.filter(topic=topic, offset=offset)
        .order_by("attempt", "handled_at").values_list("attempt", "pid")
    )


def test_a_paused_worker_cannot_ack_or_deliver_after_its_lease_was_taken(workers):
    message = sqlqueue.publish("slow", {"sleep": 1.5}, key="p")
    a = workers.start("fence-a", "--topic", "slow", settings=FAST_LEASES)
    wait_until(lambda: runs("slow", message.offset), what="worker A starting the handler",
               watch=[a])
    a.send(signal.SIGSTOP)  # paused mid-handler, past its lease and the visibility timeout
    try:
        b = workers.start("fence-b", "--topic", "slow", settings=FAST_LEASES)
        wait_until(
            lambda: PartitionLease.objects.filter(topic="slow", partition_key=partition_of("slow", "p"),
                                                  leased_by="fence-b").exists(),
            what="worker B taking over A's stale lease", watch=[b],
        )
        # B redelivers once A's delivery is no longer invisible (visibility_timeout=2 s).
        wait_until(lambda: len(runs("slow", message.offset)) >= 2, timeout=15,
                   what="worker B redelivering the message", watch=[b])
    finally:
        a.send(signal.SIGCONT)

    # A's handler now finishes; its ack is refused and A drops the partition.
    wait_until(lambda: "lease lost" in a.stderr, what="worker A noticing its lease is gone",
               watch=[a, b])
    later = sqlqueue.publish_many("slow", [{"payload": {"sleep": 0}, "key": "p"} for _ in range(3)])
    wait_until(lambda: all(runs("slow", m.offset) for m in later), what="the later messages",
               watch=[a, b])
    wait_until(lambda: watermark("billing", "slow", "p") >= position_of(later[-1].offset),
               what="B's watermark passing every message", watch=[a, b])

    lease = PartitionLease.objects.get(consumer_group="billing", topic="slow",
                                      partition_key=partition_of("slow", "p"))
    assert (lease.leased_by, lease.generation) == ("fence-b", 2)
    assert runs("slow", message.offset) == [(1, a.pid), (2, b.pid)]  # A never redelivered it
    for m in later:
        assert runs("slow", m.offset) == [(1, b.pid)]  # and never fetched after resuming
    assert Handled.objects.filter(pid=a.pid).count() == 1
    a.terminate()
    assert a.wait_exit(timeout=10) == 0


@pytest.mark.skipif(connection.vendor == "sqlite",
                    reason="a paused SQLite writer blocks the replacement from starting at all")
def test_a_paused_worker_and_its_replacement_under_the_same_name_never_share_a_partition(workers):
    """A supervisor restarts a worker that stopped responding, under the same --name,
    while the old process is only paused; then the old process resumes."""
    first = sqlqueue.publish_many("strict", [{"payload": {"n": n}, "key": f"k{n % 8}"}
                                             for n in range(300)])
    old = workers.start("same-name", "--topic", "strict", settings=FAST_LEASES)
    wait_until(lambda: Handled.objects.filter(pid=old.pid).count() >= 20,
               what="the first process handling messages", watch=[old])
    old.send(signal.SIGSTOP)
    try:
        new = workers.start("same-name", "--topic", "strict", settings=FAST_LEASES)
        wait_until(lambda: Handled.objects.filter(pid=new.pid).count() >= 20, timeout=30,
                   what="the replacement handling messages", watch=[new])
    finally:
        old.send(signal.SIGCONT)
    resumed_at = time.time()
    later = sqlqueue.publish_many("strict", [{"payload": {"n": n}, "key": f"k{n % 8}"}
                                             for n in range(100)])
    offsets = {m.offset for m in first + later}
    wait_until(lambda: set(Handled.objects.filter(topic="strict")
                           .values_list("offset", flat=True)) >= offsets, timeout=60,
               what="every message handled", watch=[old, new])

    # The resumed process starts nothing more: not the handlers it had queued before the
    # pause, not new deliveries. (A handler that was already running when it was paused
    # finishes; at most one per thread.)
    late_runs = Handled.objects.filter(pid=old.pid, handled_at__gt=resumed_at + 0.05).count()
    assert late_runs <= 4
    # Nothing acked was delivered again as a first attempt.
    first_attempts = list(Handled.objects.filter(topic="strict", attempt=1)
                          .values_list("offset", flat=True))
    assert len(first_attempts) == len(set(first_attempts))
    assert not PartitionLease.objects.filter(topic="strict", leased_by="same-name",
                                             generation__lt=2).exists()


@pytest.mark.skipif(connection.vendor == "sqlite",
                    reason="a paused SQLite writer blocks every other writer; documented")
def test_a_worker_frozen_inside_its_poll_transaction_loses_its_partitions_after_a_lease(workers):
    sqlqueue.publish_many("spread", [{"payload": {"n": n}} for n in range(3000)])
    frozen = workers.start("frozen", "--topic", "spread", settings=FAST_LEASES)
    wait_until(lambda: Handled.objects.filter(topic="spread").count() >= 50,
               what="the worker busy", watch=[frozen])
    # Catch it inside its poll transaction: hold the rows its cycle writes last (the
    # group's watermarks), wait until the cycle waits for them, freeze the worker, then let
    # go. Its statement completes, and its transaction stays open with the lease rows it
    # share-locked, as when a process freezes between two statements.
    with transaction.atomic():
        list(ConsumerOffset.objects.select_for_update().filter(topic="spread",
                                                               consumer_group="pool"))
        wait_until(lambda: sessions_blocked_updating("queue_offsets"),
                   what="the worker's cycle waiting for its watermarks", watch=[frozen])
        frozen.send(signal.SIGSTOP)
    wait_until(idle_transactions, timeout=5, what="the frozen worker's open transaction")
    try:
        other = workers.start("other", "--topic", "spread", settings=FAST_LEASES)
        leases = PartitionLease.objects.filter(topic="spread", consumer_group="pool")
        wait_until(lambda: leases.filter(leased_by="other").count() == leases.count(), timeout=20,
                   what="the other worker taking every partition", watch=[other])
        before = Handled.objects.filter(pid=other.pid).count()
        wait_until(lambda: Handled.objects.filter(pid=other.pid).count() > before + 50,
                   what="the other worker handling messages", watch=[other])
    finally:
        frozen.send(signal.SIGCONT)


# --------------------------------------------------------------------------- one clock


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else ""


LIBFAKETIME = _libfaketime()
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# SQLite runs inside the calling process, so its "server clock" is each process's own clock:
# a skewed worker and a true publisher cannot share one clock there.
needs_a_server_clock = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite has no server clock: it uses each process's own"
)
# Under CI, .ci/run installs faketime; a missing library fails the test instead (below).
needs_libfaketime = pytest.mark.skipif(
    not LIBFAKETIME and not IN_CI, reason="libfaketime is not installed (apt-get install faketime)"
)


def _start_skewed(workers, name: str, skew: str, *args: str):  # type: ignore[no-untyped-def]
    """A worker whose wall clock (time.time, datetime.now) is shifted by ``skew``.

    libfaketime is preloaded directly: the ``faketime`` wrapper forks, and signals sent to
    it would not reach the worker. The monotonic clock stays true, as on a badly
    synchronised host (faking it too would also break every timed wait in the process).
    """
    assert LIBFAKETIME, "libfaketime is not installed (.ci/run installs the faketime package)"
    return workers.start(name, *args, settings=FAST_LEASES, extra_env={
        "LD_PRELOAD": LIBFAKETIME, "FAKETIME": skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    })


@needs_a_server_clock
@needs_libfaketime
@pytest.mark.parametrize("skew", ["+90s", "-90s"])
def test_a_worker_with_a_skewed_clock_respects_delays(workers, skew):
    worker = _start_skewed(workers, f"skewed{skew}", skew, "--topic", "orders",
                           "--group", "billing")
    control = sqlqueue.publish("orders", {"n": "now"}, key="k")
    wait_until(lambda: runs("orders", control.offset), what="the undelayed message",
               watch=[worker])

    published_at = time.time()
    delayed = sqlqueue.publish("orders", {"n": "later"}, key="k", delay=2.0)
    seen = wait_until(lambda: runs("orders", delayed.offset) and time.time(), timeout=15,
                      interval=0.02, what="the delayed message", watch=[worker])
    assert seen - published_at >= 2.0 - 0.1


@needs_a_server_clock
@needs_libfaketime
def test_leases_of_a_worker_with_a_slow_clock_are_not_stolen(workers):
    sqlqueue.publish_many("orders", [{"payload": {"n": n}, "key": f"k{n}"} for n in range(4)])
    # Were leases judged by the workers' own clocks, B would find A's renewals 90 s old,
    # steal every lease on each attempt, and A would steal them back: generations would climb.
    a = _start_skewed(workers, "slow-clock", "-90s", "--topic", "orders", "--group", "billing")
    b = workers.start("true-clock", "--topic", "orders", "--group", "billing",
                      settings=FAST_LEASES)
    names = ["slow-clock", "true-clock"]
    wait_stable(lambda: lease_counts(names), [6, 6], hold=1.0, what="a 6/6 split",
                watch=[a, b])
    generations = dict(PartitionLease.objects.filter(topic="orders", consumer_group="billing")
                       .values_list("partition_key", "generation"))
    time.sleep(2.5)  # longer than LEASE_DURATION: every lease has been renewed meanwhile
    assert lease_counts(names) == [6, 6]
    assert dict(PartitionLease.objects.filter(topic="orders", consumer_group="billing")
                .values_list("partition_key", "generation")) == generations
