"""Every wait of a worker has a bound, and one partition's trouble stays its own.

Another transaction may hold rows the worker needs for one partition for a long time (an
operator's ``repartition`` or ``forget``, a forgotten transaction), and the database may
refuse a statement for one partition every time. Either way the worker renews its other
leases and handles its other partitions' messages meanwhile: a lease row held elsewhere is
passed over, a lock is waited for at most a bounded time (a quarter of a lease), and a
cycle that failed is retried apart from the partitions it did not fail for. A partition
whose cycle keeps failing alone is released, so its window is read afresh.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, connections

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.partitioning import partition_for
from django_sqlqueue.worker.session import SessionBounds
from tests.refusals import refusing
from tests.testapp.models import Handled
from tests.worker_harness import wait_stable, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TOPIC, GROUP = "manykeys", "bulk"  # four partitions, a handler that records each message


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def publish_to(partitions: list[int], each: int = 3, prefix: str = "k") -> dict[int, set[int]]:
    """``each`` messages on distinct keys of each partition; their offsets per partition."""
    keys: dict[int, list[str]] = {p: [] for p in partitions}
    n = 0
    while any(len(found) < each for found in keys.values()):
        key = f"{prefix}{n}"
        found = keys.get(partition_for(key, 4))
        if found is not None and len(found) < each:
            found.append(key)
        n += 1
    return {p: {sqlqueue.publish(TOPIC, {"n": key}, key=key).offset for key in found}
            for p, found in keys.items()}


def handled(offsets: set[int]) -> bool:
    return Handled.objects.filter(offset__in=offsets).count() >= len(offsets)


def renewed_at() -> dict[str, int]:
    return dict(PartitionLease.objects.filter(consumer_group=GROUP, topic=TOPIC)
                .values_list("partition_key", "lease_renewed_at"))


# A 2 s lease renewed every 0.3 s: the worker waits for a lock at most 0.5 s.
SHORT_LEASES = {"LEASE_DURATION": 2.0, "RENEW_INTERVAL": 0.3}


def started(workers):  # type: ignore[no-untyped-def]
    """A worker holding every partition of the topic, each window read."""
    worker = workers.start("bounded", "--topic", TOPIC, settings=SHORT_LEASES)
    first = publish_to([0, 1, 2, 3], each=1, prefix="first-")
    wait_until(lambda: handled(set().union(*first.values())), what="the first messages",
               watch=[worker])
    return worker


ROWS = {
    # What repartition (deleting the removed partitions' rows) or forget holds.
    "lease and watermark rows": ["queue_partition_leases", "queue_offsets"],
    # What the poll cycle waits for once the fence passed.
    "watermark row": ["queue_offsets"],
}


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has a busy timeout instead")
def test_the_worker_session_waits_for_a_lock_a_quarter_of_a_lease_at_most():
    bounds = SessionBounds("default", idle_transaction_seconds=3.0)
    bounds.ensure()
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SHOW lock_timeout")
                assert cursor.fetchone()[0] == "750ms"
            else:
                cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout, "
                               "@@SESSION.lock_wait_timeout")
                assert tuple(cursor.fetchone()) == (1, 1)  # whole seconds there
    finally:
        bounds.release()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "0"
        else:
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            assert cursor.fetchone()[0] > 1


@pytest.mark.skipif(connection.vendor == "sqlite",
                    reason="SQLite locks the whole database: see the SQLite test below")
@pytest.mark.parametrize("held", list(ROWS))
def test_rows_of_one_partition_held_elsewhere_stall_none_of_the_others(workers, held):
    worker = started(workers)
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    q = holder.ops.quote_name
    try:
        with holder.cursor() as cursor:
            for table in ROWS[held]:
                cursor.execute(f"SELECT 1 FROM {q(table)} WHERE {q('consumer_group')} = %s "
                               f"AND {q('topic')} = %s AND {q('partition_key')} = '0' FOR UPDATE",
                               [GROUP, TOPIC])
        before = renewed_at()
        hold_started = time.monotonic()
        blocked = publish_to([0], prefix="blocked-")[0]
        others = publish_to([1, 2, 3], prefix="other-")

        wait_until(lambda: handled(set().union(*others.values())), timeout=6,
                   what="the other partitions' messages", watch=[worker])
        # Past a lease since the rows were taken: the other leases were renewed meanwhile.
        time.sleep(max(0.0, hold_started + 2.5 - time.monotonic()))
        after = renewed_at()
        assert all(after[p] >= before[p] + 1800 for p in ("1", "2", "3")), (before, after)
        assert not handled(blocked)
    finally:
        holder.rollback()
        holder.close()
    wait_until(lambda: handled(blocked), timeout=8, what="the held partition's messages",
               watch=[worker])
    assert "lease lost" not in worker.stderr


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite case")
def test_sqlite_a_writer_holding_the_database_delays_the_worker_and_takes_no_lease(workers):
    """SQLite has one writer at a time and no row locks: a transaction holding the
    database delays every statement of the worker until it ends or the busy timeout
    (``OPTIONS["timeout"]``, 20 s here) runs out, whichever comes first. A hold shorter than a lease
    costs the worker no partition, and it goes on at once afterwards."""
    worker = started(workers)
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    try:
        with holder.cursor() as cursor:
            cursor.execute("UPDATE queue_partition_leases SET lease_renewed_at = lease_renewed_at"
                           " WHERE partition_key = '0'")  # the database's write lock
        time.sleep(1.5)
    finally:
        holder.rollback()
        holder.close()
    released = time.monotonic()
    later = publish_to([0, 1, 2, 3], each=2, prefix="later-")
    wait_until(lambda: handled(set().union(*later.values())), timeout=5,
               what="messages after the hold", watch=[worker])
    assert time.monotonic() - released < 2.0
    wait_stable(lambda: worker.leases(), 4, hold=0.5, what="the worker's leases",
                watch=[worker])
    assert "lease lost" not in worker.stderr


def test_a_partition_whose_cycle_keeps_failing_is_released_and_the_others_go_on(workers):
    worker = started(workers)
    # The database refuses every delivery (and hold) row of partition 2, for good.
    refused = f"NEW.topic = '{TOPIC}' AND NEW.partition_key = '2'"
    with refusing("sqlqueue_test_refuse_partition", "queue_delivery_state", "INSERT", refused):
        doomed = publish_to([2], prefix="doomed-")[2]
        others = publish_to([0, 1, 3], prefix="other-")

        wait_until(lambda: handled(set().union(*others.values())), timeout=8,
                   what="the other partitions' messages", watch=[worker])
        wait_until(lambda: "releasing a partition whose poll cycle keeps failing" in worker.stderr,
                   timeout=5, what="the failing partition released", watch=[worker])
        assert "partition=2 " in worker.stderr.split("keeps failing")[1].splitlines()[0]
        more = publish_to([0, 1, 3], prefix="more-")
        wait_until(lambda: handled(set().union(*more.values())), timeout=5,
                   what="later messages of the other partitions", watch=[worker])
        assert not handled(doomed)
    # Once the database takes its rows again, the partition is taken back and drained.
    wait_until(lambda: handled(doomed), timeout=10, what="the released partition's messages",
               watch=[worker])
