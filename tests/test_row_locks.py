"""A worker's statements lock only the rows of its own partitions.

Two workers write the same small tables (delivery rows, offsets, leases) for different
partitions. If a statement of one worker reads rows of the other's partitions under a lock
(InnoDB locks every row a locking statement reads, and on a small table MariaDB prefers a
full scan to a list of primary-key lookups), the workers wait for each other's
transactions or deadlock. Here a second connection holds locks on partition 1's rows while
the statements a poll cycle runs for partition 0 must complete without waiting.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_sqlqueue.models import ConsumerOffset, DeliveryState, PartitionLease
from django_sqlqueue.models.delivery import MessageRef
from django_sqlqueue.models.offsets import Progress

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor == "sqlite",
                       reason="SQLite locks the whole database, not rows"),
]

GROUP, TOPIC, WORKER = "locks", "locks", "worker-a"
TOKEN = "0123456789abcdef0123456789abcdef"
ROWS = 120  # delivery rows per partition: small enough that MariaDB would rather scan


def set_lock_timeout(conn: BaseDatabaseWrapper, seconds: int) -> None:
    with conn.cursor() as cursor:
        if conn.vendor == "mysql":
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}")
        else:
            cursor.execute(f"SET lock_timeout = '{seconds}s'")


@pytest.fixture
def other_worker() -> Iterator[BaseDatabaseWrapper]:
    """A second connection, standing for the worker that owns partition 1."""
    other = connections.create_connection("default")
    try:
        yield other
    finally:
        if other.in_atomic_block:
            other.rollback()
        other.close()


def seed() -> None:
    for partition in ("0", "1"):
        DeliveryState.objects.bulk_create(
            DeliveryState(consumer_group=GROUP, topic=TOPIC, partition_key=partition,
                          message_offset=partition_offset(partition, n), acked=False,
                          invisible_until=0, retry_count=0, last_error="")
            for n in range(ROWS)
        )
    for partition, owner in (("0", WORKER), ("1", "worker-b")):
        ConsumerOffset.objects.create(consumer_group=GROUP, topic=TOPIC, partition_key=partition,
                                      offset_acked=0, offset_fetched=0, updated_at=0)
        PartitionLease.objects.create(consumer_group=GROUP, topic=TOPIC, partition_key=partition,
                                      leased_by=owner, lease_token=TOKEN, leased_at=1,
                                      lease_renewed_at=1, generation=1)


def partition_offset(partition: str, n: int) -> int:
    # Interleaved offsets, as keys hashed to partitions produce them.
    return 2 * n + int(partition) + 1


def hold_partition_one(other: BaseDatabaseWrapper) -> None:
    """Do, uncommitted, what the owner of partition 1 does in a poll cycle: ack its
    delivery rows, delete the acked ones its watermark passed, move the watermark and
    renew its lease. (Rows another transaction deleted are what a scan waits for:
    UPDATEs skip rows they find locked whose committed version does not match.)"""
    other.set_autocommit(False)
    q = other.ops.quote_name
    mine = f"{q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s"
    with other.cursor() as cursor:
        for sql in [
            f"UPDATE {q('queue_delivery_state')} SET {q('acked')} = TRUE WHERE {mine}",
            f"DELETE FROM {q('queue_delivery_state')} WHERE {mine} AND {q('acked')} = TRUE",
            f"UPDATE {q('queue_offsets')} SET {q('offset_acked')} = {q('offset_acked')} + 1 "
            f"WHERE {mine}",
            f"UPDATE {q('queue_partition_leases')} "
            f"SET {q('lease_renewed_at')} = {q('lease_renewed_at')} + 1 WHERE {mine}",
        ]:
            cursor.execute(sql, [GROUP, TOPIC, "1"])


def test_a_poll_cycles_statements_do_not_wait_for_another_workers_partitions(other_worker):
    seed()
    hold_partition_one(other_worker)
    set_lock_timeout(connection, 2)
    refs = [MessageRef("0", partition_offset("0", n)) for n in range(ROWS)]
    with transaction.atomic():
        owned, seen, _ = PartitionLease.objects.fence(WORKER, TOKEN, [(GROUP, TOPIC, "0")],
                                                   "default")
        assert owned == {(GROUP, TOPIC, "0"): 1}
        assert seen == {(GROUP, TOPIC, "0")}
        assert DeliveryState.objects.extend(GROUP, TOPIC, refs, 10**13, "default") == len(refs)
        assert DeliveryState.objects.ack(GROUP, TOPIC, refs, "default") == len(refs)
        assert DeliveryState.objects.delete_acked(GROUP, TOPIC, refs, "default") == len(refs)
        assert ConsumerOffset.objects.save_progress(
            GROUP, TOPIC, {"0": Progress(5, 9)}, 1, "default") == 1
        assert PartitionLease.objects.renew(WORKER, TOKEN, 2, "default") == {(GROUP, TOPIC, "0")}
        assert PartitionLease.objects.release(GROUP, TOPIC, {"0": 1}, WORKER, TOKEN,
                                              "default") == 1
    other_worker.rollback()
    assert DeliveryState.objects.filter(partition_key="0").count() == 0
    assert DeliveryState.objects.filter(partition_key="1", acked=False).count() == ROWS
