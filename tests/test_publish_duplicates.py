"""A duplicate publish (same topic, key and id as a stored message) leaves the stored row alone.

It must not lock the row, or the sequencer (which skips locked rows) positions later
messages of the key first, and GC cannot delete the row; and it must write nothing. Each
test keeps the duplicate's transaction open on a second connection while the rest of the
queue goes on, as a retried request inside a long transaction would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import QueueMessage
from django_sqlqueue.sequencing import sequence_all
from tests.helpers import in_other_connection, message_count, start_thread

pytestmark = pytest.mark.django_db(transaction=True)

needs_row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has one writer: an open publisher transaction holds back every other writer",
)
WAIT = 10.0  # seconds a helper thread may take to reach the point the test waits for


@contextmanager
def duplicate_left_open(topic: str, payload: Any, **kwargs: Any) -> Iterator[None]:
    """Publish on a second connection and keep that transaction open until the block ends."""
    published = threading.Event()
    release = threading.Event()

    def publish_and_wait() -> sqlqueue.StoredMessage:
        with transaction.atomic():
            message = sqlqueue.publish(topic, payload, **kwargs)
            published.set()
            if not release.wait(WAIT * 3):
                raise AssertionError("the test never released the open transaction")
        return message

    thread = start_thread(publish_and_wait, name="duplicate")
    try:
        if not published.wait(WAIT):
            release.set()
            thread.outcome()  # re-raises the thread's error, if it died
            raise AssertionError(f"the duplicate publish did not return within {WAIT} s")
        yield
    finally:
        release.set()
        thread.join(WAIT)


def ids_in_position_order(topic: str) -> list[str]:
    return list(QueueMessage.objects.filter(topic=topic, position__isnull=False)
                .order_by("position").values_list("message_id", flat=True))


# --------------------------------------------------------------------------- order


@needs_row_locks
def test_a_duplicate_publish_left_open_does_not_put_later_messages_of_its_key_first():
    sqlqueue.publish("keyed", "created", key="order-7", id="created")

    with duplicate_left_open("keyed", "created again", key="order-7", id="created"):
        sqlqueue.publish("keyed", "paid", key="order-7", id="paid")
        sequence_all()
    sequence_all()

    assert ids_in_position_order("keyed") == ["created", "paid"]


@needs_row_locks
def test_a_duplicate_publish_left_open_lets_the_sequencer_position_the_stored_row():
    created = sqlqueue.publish("keyed", "created", key="order-7", id="created")

    with duplicate_left_open("keyed", "created again", key="order-7", id="created"):
        sequence_all()
        position = QueueMessage.objects.get(offset=created.offset).position

    assert position is not None


# --------------------------------------------------------------------------- locks


def delete_with_a_short_lock_timeout(offset: int) -> int:
    """Delete a message as GC does, giving up after a second of waiting for a lock."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
            elif connection.vendor == "postgresql":
                cursor.execute("SET LOCAL lock_timeout = '1s'")
        return QueueMessage.objects.delete_offsets([offset], using="default")


@needs_row_locks
def test_a_duplicate_publish_left_open_blocks_neither_sequencing_nor_deleting_the_stored_row():
    created = sqlqueue.publish("keyed", "created", key="order-7", id="created")
    sequence_all()

    with duplicate_left_open("keyed", "created again", key="order-7", id="created"):
        sqlqueue.publish("keyed", "neighbour", key="order-8", id="placed")
        sequence_all()
        positioned = ids_in_position_order("keyed")
        # As GC does, on another connection, waiting at most a second for locks.
        deleted = in_other_connection(delete_with_a_short_lock_timeout, created.offset)

    assert positioned == ["created", "placed"]
    assert deleted == 1


# --------------------------------------------------------------------------- writes


def write_counts() -> tuple[int, ...]:
    """Rows this connection has inserted, updated and deleted in queue_messages so far
    (MariaDB: this session; PostgreSQL: this transaction; SQLite: this connection)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN "
                           "('Handler_write', 'Handler_update', 'Handler_delete')")
            return tuple(int(value) for _name, value in sorted(cursor.fetchall()))
        if connection.vendor == "postgresql":
            cursor.execute("SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables "
                           "WHERE relname = 'queue_messages'")
            row = cursor.fetchone()
            return tuple(row) if row else (0, 0, 0)
    return (connection.connection.total_changes,)


def test_a_duplicate_publish_writes_nothing():
    first = sqlqueue.publish("orders", {"v": 1}, key="k", id="same")

    with transaction.atomic():
        before = write_counts()
        again = sqlqueue.publish("orders", {"v": 2}, key="k", id="same")
        after = write_counts()

    assert again == first
    assert after == before


def test_a_duplicate_in_publish_many_writes_nothing():
    first = sqlqueue.publish_many("orders", [{"payload": n, "key": "k", "id": f"id-{n}"}
                                             for n in range(3)])

    with transaction.atomic():
        before = write_counts()
        again = sqlqueue.publish_many("orders", [{"payload": "new", "key": "k", "id": f"id-{n}"}
                                                 for n in range(3)])
        after = write_counts()

    assert again == first
    assert after == before


@pytest.mark.skipif(connection.vendor != "postgresql", reason="xmin is PostgreSQL's")
def test_a_duplicate_publish_leaves_the_stored_row_version_alone_on_postgresql():
    def row_version(offset: int) -> tuple[str, str]:
        with connection.cursor() as cursor:
            cursor.execute('SELECT xmin::text, ctid::text FROM queue_messages WHERE "offset" = %s',
                           [offset])
            return cursor.fetchone()

    first = sqlqueue.publish("orders", {"v": 1}, key="k", id="same")
    version = row_version(first.offset)

    sqlqueue.publish("orders", {"v": 2}, key="k", id="same")

    assert row_version(first.offset) == version


# --------------------------------------------------------------------------- snapshots


@pytest.mark.skipif(connection.vendor != "mysql", reason="REPEATABLE READ snapshots of InnoDB")
def test_a_duplicate_in_a_snapshot_older_than_the_stored_row_gets_it_and_keeps_the_key_order():
    # The corner the docs describe: the caller's snapshot predates the stored row's commit,
    # so its reads do not see the row. It still gets the stored row, and the order of the
    # key holds while its transaction stays open (only GC waits for it).
    snapshot_taken, created_committed = threading.Event(), threading.Event()
    published, release = threading.Event(), threading.Event()

    def publish_in_an_old_snapshot() -> sqlqueue.StoredMessage:
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with transaction.atomic():
            message_count()  # the transaction's snapshot is taken here
            snapshot_taken.set()
            if not created_committed.wait(WAIT):
                raise AssertionError("the original was never published")
            message = sqlqueue.publish("keyed", "created again", key="order-7", id="created")
            published.set()
            if not release.wait(WAIT):
                raise AssertionError("the test never released the open transaction")
            return message

    thread = start_thread(publish_in_an_old_snapshot, name="old-snapshot")
    try:
        assert snapshot_taken.wait(WAIT)
        created = sqlqueue.publish("keyed", "created", key="order-7", id="created")
        created_committed.set()
        assert published.wait(WAIT)
        sqlqueue.publish("keyed", "paid", key="order-7", id="paid")
        sequence_all()
    finally:
        created_committed.set()
        release.set()
    again = thread.outcome()
    sequence_all()

    assert again == created
    assert ids_in_position_order("keyed") == ["created", "paid"]
