"""Concurrent publishers of the same (topic, key, id) on separate connections.

Each thread has its own database connection. On MariaDB and PostgreSQL the second
publisher waits on the unique index until the first transaction ends; on SQLite it waits
for the database write lock (``transaction_mode=IMMEDIATE``, ``timeout=20``). Either way
exactly one row may result and nobody may see an IntegrityError.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from django.db import transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import QueueMessage
from tests.helpers import message_count, outcomes, start_thread

pytestmark = pytest.mark.django_db(transaction=True)

HOLD = 0.5  # seconds the first publisher keeps its transaction open after inserting


class Rollback(Exception):
    pass


@dataclass
class Race:
    first: sqlqueue.StoredMessage | None  # None when the first publisher rolled back
    second: sqlqueue.StoredMessage
    first_ended_at: float  # time.monotonic() just before the first transaction ended
    second_finished_at: float


def race_against_open_transaction(*, commit: bool) -> Race:
    """A publishes inside an open transaction and holds it; B publishes the same id."""
    barrier = threading.Barrier(2, timeout=10)
    ended: dict[str, float] = {}

    def first() -> sqlqueue.StoredMessage | None:
        try:
            with transaction.atomic():
                message = sqlqueue.publish("orders", {"by": "first"}, key="k", id="race")
                barrier.wait()
                time.sleep(HOLD)
                ended["at"] = time.monotonic()
                if not commit:
                    raise Rollback
        except Rollback:
            return None
        return message

    def second() -> sqlqueue.StoredMessage:
        barrier.wait()
        return sqlqueue.publish("orders", {"by": "second"}, key="k", id="race")

    first_thread = start_thread(first, name="first")
    second_thread = start_thread(second, name="second")
    # Re-raises an IntegrityError, if either publisher got one.
    first_result, second_result = outcomes([first_thread, second_thread])
    assert second_thread.finished_at is not None
    return Race(first_result, second_result, ended["at"], second_thread.finished_at)


def test_duplicate_publish_during_an_open_transaction_gets_the_committed_row():
    race = race_against_open_transaction(commit=True)

    assert race.first is not None
    assert race.second == race.first
    assert race.second.payload == {"by": "first"}


def test_duplicate_publish_during_an_open_transaction_stores_one_row():
    race_against_open_transaction(commit=True)

    assert list(QueueMessage.objects.values_list("message_id", "payload")) == [
        ("race", {"by": "first"})
    ]


def test_duplicate_publish_waits_until_the_first_transaction_ends():
    race = race_against_open_transaction(commit=True)

    assert race.second_finished_at >= race.first_ended_at


def test_duplicate_publish_stores_its_own_row_when_the_first_rolls_back():
    race = race_against_open_transaction(commit=False)

    assert race.first is None
    assert race.second.payload == {"by": "second"}
    stored = QueueMessage.objects.get()
    assert (stored.offset, stored.payload) == (race.second.offset, {"by": "second"})


def test_many_threads_publishing_one_id_store_exactly_one_row():
    threads_count = 8
    barrier = threading.Barrier(threads_count, timeout=10)

    def publish(n: int) -> sqlqueue.StoredMessage:
        barrier.wait()
        return sqlqueue.publish("orders", {"n": n}, key="k", id="stampede")

    threads = [start_thread(publish, n, name=f"publisher-{n}") for n in range(threads_count)]
    results = outcomes(threads)

    stored = QueueMessage.objects.get()
    assert {message.offset for message in results} == {stored.offset}
    assert all(message.payload == stored.payload for message in results)
    assert message_count() == 1


def test_many_threads_publishing_the_same_batch_store_each_id_once():
    threads_count = 4
    batch = [{"payload": n, "id": f"id-{n}"} for n in range(100)]
    barrier = threading.Barrier(threads_count, timeout=10)

    def publish_batch() -> list[sqlqueue.StoredMessage]:
        barrier.wait()
        return sqlqueue.publish_many("orders", batch)

    threads = [start_thread(publish_batch, name=f"batch-{n}") for n in range(threads_count)]
    results = outcomes(threads)

    assert message_count() == 100
    assert all(result == results[0] for result in results)
    assert [message.payload for message in results[0]] == list(range(100))


def test_concurrent_publishers_of_distinct_ids_lose_nothing():
    threads_count, per_thread = 4, 50
    barrier = threading.Barrier(threads_count, timeout=10)

    def publish_many_singly(n: int) -> list[int]:
        barrier.wait()
        return [
            sqlqueue.publish("orders", i, key=f"k{i % 3}", id=f"t{n}-{i}").offset
            for i in range(per_thread)
        ]

    threads = [start_thread(publish_many_singly, n, name=f"p{n}") for n in range(threads_count)]
    offsets = [offset for result in outcomes(threads) for offset in result]

    assert len(set(offsets)) == threads_count * per_thread
    assert message_count() == threads_count * per_thread


def test_concurrent_batches_sharing_ids_in_opposite_orders_do_not_deadlock():
    # Two callers publishing overlapping batches (e.g. a retried job and the original)
    # must not fail each other: the ids are the same, only their order differs. (Within
    # one key the given order is the consumption order and is kept, so this holds for
    # batches that spread over keys, as here.)
    threads_count, rounds = 4, 3
    for round_number in range(rounds):
        barrier = threading.Barrier(threads_count, timeout=10)

        def publish_batch(n: int, round_number: int = round_number,
                          barrier: threading.Barrier = barrier):
            batch = [{"payload": i, "id": f"r{round_number}-{i}", "key": f"k{i}"}
                     for i in range(100)]
            if n % 2:
                batch.reverse()
            barrier.wait()
            return sqlqueue.publish_many("orders", batch)

        threads = [start_thread(publish_batch, n, name=f"batch-{n}") for n in range(threads_count)]
        outcomes(threads)  # re-raises a deadlock error, if any

    assert message_count() == 100 * rounds
