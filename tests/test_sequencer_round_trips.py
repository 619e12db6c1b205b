"""What sequencing costs between a commit and its handler: the statements of a batch, and
what a worker that finds the sequencer busy does while it waits."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import LogSequencer
from django_sqlqueue.sequencing import sequence_once
from django_sqlqueue.store import sequencer_statements
from tests.factories import LogSequencerFactory
from tests.helpers import in_other_connection, outcomes, positions_by_offset, start_thread

pytestmark = pytest.mark.django_db

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="the two-statement batch is PostgreSQL's")
needs_row_locks = pytest.mark.skipif(connection.vendor == "sqlite",
                                     reason="SQLite has no row locks to wait on")


def last_position() -> int:
    return LogSequencer.objects.get(name="default").last_position


@postgresql_only
def test_a_batch_takes_two_statements_on_postgresql():
    LogSequencerFactory(last_position=0)
    offsets = [sqlqueue.publish("orders", n, key=f"k{n % 3}").offset for n in range(5)]

    with CaptureQueriesContext(connection) as captured:
        batch = sequence_once()

    assert batch.positioned == 5 and batch.last_position == 5
    assert positions_by_offset() == dict(zip(offsets, range(1, 6), strict=True))
    statements = [q["sql"] for q in captured if "SAVEPOINT" not in q["sql"]]  # the test's
    assert len(statements) == 2, statements
    assert last_position() == 5


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_snapshot_overtaken_before_the_counters_lock_numbers_nothing_twice(monkeypatch):
    """Another sequencer's commit can fall between the read's snapshot and the counter's
    lock: the rows it numbered look unsequenced. The numbering statement sees them and
    changes nothing, and the batch is taken again the careful way."""
    LogSequencerFactory(last_position=0)
    offsets = [sqlqueue.publish("orders", n, key="k").offset for n in range(3)]
    read = sequencer_statements.lock_and_read

    def overtaken(*args, **kwargs):
        opened = read(*args, **kwargs)

        def number_first() -> None:  # as a sequencer that committed just before the lock
            with connection.cursor() as cursor:
                cursor.execute('UPDATE queue_messages SET position = 100, partition_key = %s '
                               'WHERE "offset" = %s', ["0", offsets[0]])

        in_other_connection(number_first)
        return opened

    monkeypatch.setattr(sequencer_statements, "lock_and_read", overtaken)
    batch = sequence_once()

    assert positions_by_offset() == {offsets[0]: 100, offsets[1]: 1, offsets[2]: 2}
    assert (batch.positioned, batch.last_position) == (2, 2)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_row_held_elsewhere_ends_the_batch_before_it_as_before():
    """The numbering statement skips a held row, which the careful way must see: the batch
    is taken again and numbers only the messages before it."""
    LogSequencerFactory(last_position=0)
    offsets = [sqlqueue.publish("orders", n, key="k").offset for n in range(3)]
    locked, release = threading.Event(), threading.Event()

    def hold_second_row() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute('SELECT 1 FROM queue_messages WHERE "offset" = %s FOR UPDATE',
                           [offsets[1]])
            locked.set()
            release.wait(10)

    thread = start_thread(hold_second_row, name="holder")
    try:
        assert locked.wait(10)
        batch = sequence_once()
    finally:
        release.set()
    outcomes([thread])

    assert (batch.positioned, batch.last_position, batch.more) == (1, 1, True)
    assert positions_by_offset() == {offsets[0]: 1, offsets[1]: None, offsets[2]: None}
    assert last_position() == 1


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_a_waiting_worker_takes_the_head_a_busy_sequencer_commits_without_a_transaction():
    """The wait happens in autocommit: once the holder commits, one statement returns the
    head it left, and the waiter never holds the counter itself."""
    LogSequencerFactory(last_position=0)
    offset = sqlqueue.publish("orders", {}).offset
    locked = threading.Event()
    held = 0.3  # seconds

    def sequence_slowly() -> int:
        with transaction.atomic():
            position = LogSequencer.objects.lock_counter(connection.alias)
            locked.set()
            with connection.cursor() as cursor:
                cursor.execute('UPDATE queue_messages SET position = 1, partition_key = %s '
                               'WHERE "offset" = %s' if connection.vendor == "postgresql" else
                               "UPDATE queue_messages SET position = 1, partition_key = %s "
                               "WHERE `offset` = %s", ["0", offset])
                cursor.execute("UPDATE queue_sequencer SET last_position = 1")
            time.sleep(held)
        return position

    thread = start_thread(sequence_slowly, name="busy-sequencer")
    assert locked.wait(10)
    started = time.monotonic()
    with CaptureQueriesContext(connection) as captured:
        batch = sequence_once(wait=True)
    elapsed = time.monotonic() - started
    assert outcomes([thread]) == [0]

    assert (batch.positioned, batch.last_position, batch.more) == (0, 1, False)
    assert elapsed >= held / 2  # waited for the holder instead of returning
    waits = [q["sql"] for q in captured.captured_queries if "FOR UPDATE" in q["sql"]
             and "SKIP" not in q["sql"]]
    assert len(waits) == 1, captured.captured_queries
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert positions_by_offset() == {offset: 1}
