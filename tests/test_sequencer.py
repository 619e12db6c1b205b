"""The log sequencer: committed messages get consecutive positions, in commit order."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import LogSequencer, QueueMessage
from django_sqlqueue.sequencing import (
    SEQUENCE_BATCH,
    sequence_all,
    sequence_once,
    sequence_pending,
)
from tests.factories import LogSequencerFactory, QueueMessageFactory
from tests.helpers import now_ms, outcomes, positions_by_offset, start_thread

pytestmark = pytest.mark.django_db

needs_row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has a single writer: a publisher's open transaction blocks every other "
    "writer, so commits cannot reorder and there is no row lock to skip",
)


def publish_n(count: int, topic: str = "orders", key: str = "p") -> list[int]:
    return [sqlqueue.publish(topic, n, key=key).offset for n in range(count)]


def last_position() -> int:
    return LogSequencer.objects.get(name="default").last_position


# --------------------------------------------------------------------------- positions


def test_sequence_all_positions_committed_messages_from_one():
    offsets = publish_n(3)

    assert sequence_all() == 3

    assert positions_by_offset() == dict(zip(offsets, [1, 2, 3], strict=True))


def test_positions_follow_offsets_for_messages_committed_together():
    with transaction.atomic():
        offsets = [sqlqueue.publish(topic, n, key=key).offset
                   for n, (topic, key) in enumerate([("a", "x"), ("b", "y"), ("a", "y")] * 3)]

    sequence_all()

    positions = positions_by_offset()
    assert [positions[offset] for offset in offsets] == list(range(1, 10))


def test_positions_continue_from_the_last_position():
    LogSequencerFactory(last_position=41)
    offsets = publish_n(3)

    sequence_all()

    assert positions_by_offset() == dict(zip(offsets, [42, 43, 44], strict=True))


def test_sequence_all_advances_the_counter():
    LogSequencerFactory(last_position=41)
    publish_n(3)

    sequence_all()

    assert last_position() == 44


def test_sequence_all_records_who_sequenced_and_when():
    publish_n(1)
    before = now_ms()

    sequence_all(sequenced_by="worker-1")

    counter = LogSequencer.objects.get(name="default")
    assert counter.sequenced_by == "worker-1"
    assert before - 2000 <= counter.sequenced_at <= now_ms() + 2000


def test_first_sequencing_creates_the_counter_row():
    assert not LogSequencer.objects.exists()
    publish_n(2)

    sequence_all()

    assert list(LogSequencer.objects.values_list("name", "last_position")) == [("default", 2)]


def test_sequence_all_with_nothing_waiting_returns_zero_and_keeps_the_counter():
    LogSequencerFactory(last_position=5, sequenced_by="earlier", sequenced_at=123)

    assert sequence_all(sequenced_by="now") == 0

    counter = LogSequencer.objects.get(name="default")
    assert (counter.last_position, counter.sequenced_by, counter.sequenced_at) == (
        5, "earlier", 123
    )


def test_sequence_all_leaves_positioned_messages_alone():
    LogSequencerFactory(last_position=10)
    old = QueueMessageFactory(position=7)
    new = QueueMessageFactory(position=None)

    assert sequence_all() == 1

    assert positions_by_offset() == {old.offset: 7, new.offset: 11}


def test_sequence_pending_positions_at_most_limit_oldest_first():
    offsets = publish_n(5)

    assert sequence_pending(limit=2) == 2

    assert positions_by_offset() == {
        offsets[0]: 1, offsets[1]: 2, offsets[2]: None, offsets[3]: None, offsets[4]: None
    }


def test_sequence_all_sequences_more_than_one_batch():
    count = 2 * SEQUENCE_BATCH + 1
    sqlqueue.publish_many("orders", [{"payload": n} for n in range(count)])

    assert sequence_all() == count

    positions = [p for _, p in sorted(positions_by_offset().items())]
    assert positions == list(range(1, count + 1))


def test_positions_are_not_reused_after_the_highest_message_is_deleted():
    publish_n(3)
    sequence_all()
    QueueMessage.objects.all().delete()  # as garbage collection would
    offset = sqlqueue.publish("orders", "after-gc").offset

    sequence_all()

    assert positions_by_offset() == {offset: 4}


def test_rolled_back_publisher_leaves_no_gap_in_positions():
    first = sqlqueue.publish("orders", "kept-1").offset
    with pytest.raises(RuntimeError), transaction.atomic():
        sqlqueue.publish("orders", "lost")
        raise RuntimeError("roll back")
    second = sqlqueue.publish("orders", "kept-2").offset

    sequence_all()

    assert positions_by_offset() == {first: 1, second: 2}


# --------------------------------------------------------------------------- head


def test_head_reports_the_last_position():
    LogSequencerFactory(last_position=7)

    last, _pending, _now = LogSequencer.objects.head("default")

    assert last == 7


def test_head_without_a_counter_row_reports_position_zero():
    last, pending, _now = LogSequencer.objects.head("default")

    assert (last, pending) == (0, False)


def test_head_reports_unsequenced_messages_as_pending():
    LogSequencerFactory(last_position=7)
    sqlqueue.publish("orders", {})

    assert LogSequencer.objects.head("default")[:2] == (7, True)


def test_head_reports_nothing_pending_once_sequenced():
    sqlqueue.publish("orders", {})
    sequence_all()

    assert LogSequencer.objects.head("default")[:2] == (1, False)


def test_head_reports_the_database_clock_in_epoch_ms():
    before = now_ms()
    _last, _pending, db_now = LogSequencer.objects.head("default")
    after = now_ms()

    assert before - 2000 <= db_now <= after + 2000


# --------------------------------------------------------------------------- commit order


@dataclass
class CommitOrderGap:
    x_offset: int  # published first, committed last
    y_offset: int
    first_pass: int  # messages sequenced while X's transaction was open
    first_pass_seconds: float
    before: dict[int, int | None]  # positions seen while X's transaction was open
    after: dict[int, int | None]  # positions after X committed and was sequenced


def commit_order_gap() -> CommitOrderGap:
    """X takes the smaller offset but commits after Y was published and sequenced."""
    inserted = threading.Event()
    release = threading.Event()

    def slow_publisher() -> int:
        with transaction.atomic():
            offset = sqlqueue.publish("orders", "x", key="p").offset
            inserted.set()
            if not release.wait(10):
                raise AssertionError("the test never let the slow publisher commit")
        return offset

    thread = start_thread(slow_publisher, name="slow-publisher")
    try:
        assert inserted.wait(10), "the slow publisher did not insert"
        y_offset = sqlqueue.publish("orders", "y", key="p").offset
        started = time.monotonic()
        first_pass = sequence_all()
        first_pass_seconds = time.monotonic() - started
        before = positions_by_offset()
    finally:
        release.set()
    [x_offset] = outcomes([thread])
    sequence_all()
    return CommitOrderGap(x_offset, y_offset, first_pass, first_pass_seconds, before,
                          positions_by_offset())


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_open_publisher_transaction_does_not_hold_up_later_messages():
    gap = commit_order_gap()

    assert gap.x_offset < gap.y_offset
    assert gap.first_pass == 1
    assert gap.before == {gap.y_offset: 1}


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_sequencer_does_not_wait_for_an_open_publisher_transaction():
    gap = commit_order_gap()

    assert gap.first_pass_seconds < 1.0


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_late_commit_is_positioned_after_messages_with_larger_offsets():
    gap = commit_order_gap()

    assert gap.x_offset < gap.y_offset
    assert gap.after == {gap.y_offset: 1, gap.x_offset: 2}


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_publisher_rolling_back_after_others_were_sequenced_leaves_no_gap():
    inserted = threading.Event()
    release = threading.Event()

    class Rollback(Exception):
        pass

    def doomed_publisher() -> None:
        try:
            with transaction.atomic():
                sqlqueue.publish("orders", "doomed", key="p")
                inserted.set()
                release.wait(10)
                raise Rollback
        except Rollback:
            pass

    thread = start_thread(doomed_publisher, name="doomed-publisher")
    try:
        assert inserted.wait(10)
        first = sqlqueue.publish("orders", "first", key="p").offset
        sequence_all()
    finally:
        release.set()
    outcomes([thread])
    second = sqlqueue.publish("orders", "second", key="p").offset

    sequence_all()

    assert positions_by_offset() == {first: 1, second: 2}


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_sequencer_numbers_nothing_past_a_committed_message_another_transaction_holds():
    first, second = publish_n(2)
    locked = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with transaction.atomic():
            list(QueueMessage.objects.select_for_update().filter(offset=first))
            locked.set()
            release.wait(10)

    thread = start_thread(holder, name="holder")
    try:
        assert locked.wait(10)
        started = time.monotonic()
        held_back = sequence_pending()
        elapsed = time.monotonic() - started
        while_held = positions_by_offset()
    finally:
        release.set()
    outcomes([thread])
    sequence_all()

    assert (held_back, while_held) == (0, {first: None, second: None})
    assert elapsed < 1.0  # skipped, not waited for
    assert positions_by_offset() == {first: 1, second: 2}


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's single-writer behaviour")
@pytest.mark.django_db(transaction=True)
def test_sqlite_publisher_waits_for_an_open_transaction_so_positions_follow_offsets():
    inserted = threading.Event()
    hold = 0.3

    def slow_publisher() -> int:
        with transaction.atomic():
            offset = sqlqueue.publish("orders", "x", key="p").offset
            inserted.set()
            time.sleep(hold)
        return offset

    thread = start_thread(slow_publisher, name="slow-publisher")
    assert inserted.wait(10)
    started = time.monotonic()
    y_offset = sqlqueue.publish("orders", "y", key="p").offset  # waits for the write lock
    waited = time.monotonic() - started
    [x_offset] = outcomes([thread])

    sequence_all()

    assert waited >= hold / 2
    assert x_offset < y_offset
    assert positions_by_offset() == {x_offset: 1, y_offset: 2}


# --------------------------------------------------------------------------- concurrent sequencers


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_busy_sequencer_makes_a_second_one_return_zero_at_once():
    LogSequencerFactory(last_position=0)
    offset = sqlqueue.publish("orders", {}).offset
    locked = threading.Event()
    release = threading.Event()

    def hold_counter() -> int | None:
        with transaction.atomic():
            position = LogSequencer.objects.lock_counter(connection.alias)
            locked.set()
            release.wait(3)
        return position

    thread = start_thread(hold_counter, name="busy-sequencer")
    try:
        assert locked.wait(10)
        started = time.monotonic()
        count = sequence_pending()
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert outcomes([thread]) == [0]

    assert (count, positions_by_offset()) == (0, {offset: None})
    assert elapsed < 1.0


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_a_waiting_sequencer_waits_for_a_busy_one_then_sequences_what_it_left():
    LogSequencerFactory(last_position=0)
    offset = sqlqueue.publish("orders", {}).offset
    locked = threading.Event()
    held = 0.3  # seconds

    def hold_counter() -> int | None:
        with transaction.atomic():
            position = LogSequencer.objects.lock_counter(connection.alias)
            locked.set()
            time.sleep(held)
        return position

    thread = start_thread(hold_counter, name="busy-sequencer")
    assert locked.wait(10)
    started = time.monotonic()
    batch = sequence_once(wait=True)
    elapsed = time.monotonic() - started
    assert outcomes([thread]) == [0]

    assert (batch.positioned, batch.last_position) == (1, 1)
    assert positions_by_offset() == {offset: 1}
    assert elapsed >= held / 2  # waited for the holder instead of returning


@pytest.mark.django_db(transaction=True)
def test_concurrent_sequencers_give_every_message_one_unique_position():
    publishers, per_publisher, sequencers = 4, 125, 2
    total = publishers * per_publisher
    start = threading.Barrier(publishers + sequencers, timeout=10)
    publishing_done = threading.Event()

    def publisher(n: int) -> int:
        start.wait()
        for i in range(per_publisher):
            sqlqueue.publish("orders", i, key=f"k{(n + i) % 5}")
        return per_publisher

    def sequencer(n: int) -> int:
        start.wait()
        sequenced = 0
        while not publishing_done.is_set():
            sequenced += sequence_pending(sequenced_by=f"sequencer-{n}", limit=25)
            time.sleep(0.001)
        return sequenced

    publisher_threads = [start_thread(publisher, n, name=f"publisher-{n}")
                         for n in range(publishers)]
    sequencer_threads = [start_thread(sequencer, n, name=f"sequencer-{n}")
                         for n in range(sequencers)]
    try:
        outcomes(publisher_threads)
    finally:
        publishing_done.set()
    by_sequencers = sum(outcomes(sequencer_threads))
    leftover = sequence_all()

    positions = [position for _, position in sorted(positions_by_offset().items())]
    assert len(positions) == total
    assert sorted(positions) == list(range(1, total + 1))
    assert by_sequencers + leftover == total
    assert by_sequencers > 0
    assert last_position() == total

