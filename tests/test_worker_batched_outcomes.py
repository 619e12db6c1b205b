"""Retries and dead letters recorded together: one statement per subscription and cycle,
each row its own.

A poll cycle writes the retries its handlers asked for in one UPDATE per consumer group and
topic, each message with its own due time and error, and its dead letters in one INSERT of
copies and one UPDATE of delivery rows, each copy with its own error, attempts and origin.
If the database refuses such a statement, the cycle writes them one by one (each in a
savepoint), so only the message the database refuses is kept back and every other outcome
is recorded.
"""

from __future__ import annotations

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import DeadLetter, DeliveryState, QueueMessage
from tests.refusals import contains, refusing
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

COUNT = 60
SHORT, LONG = 1.0, 3.0  # seconds each half's retry asks for


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def attempts_by_offset(topic: str) -> dict[int, list[tuple[int, float]]]:
    runs: dict[int, list[tuple[int, float]]] = {}
    for offset, attempt, at in Handled.objects.filter(topic=topic).values_list(
            "offset", "attempt", "handled_at"):
        runs.setdefault(offset, []).append((attempt, at))
    return {offset: sorted(found) for offset, found in runs.items()}


def test_retries_recorded_together_keep_each_message_its_own_due_time(workers):
    delays = {}
    for n, message in enumerate(sqlqueue.publish_many("retried", [
            {"payload": {"retry_in": LONG if n % 2 else SHORT}, "key": f"k{n}"}
            for n in range(COUNT)])):
        delays[message.offset] = LONG if n % 2 else SHORT
    # Many handler threads: a cycle records many retries at once.
    worker = workers.start("retrier", "--topic", "retried", "--group", "billing",
                           "--concurrency", "32")

    # While they wait, their rows say so, each with its own due time and error: what a
    # worker taking the partition over would go by.
    def recorded_rows() -> dict[int, tuple[int, str]] | None:
        rows = {offset: (until, error) for offset, until, error in DeliveryState.objects.filter(
            topic="retried", consumer_group="billing", acked=False, last_error__contains="not yet",
        ).values_list("message_offset", "invisible_until", "last_error")}
        return rows if len(rows) == COUNT else None

    wait_until(lambda: len(attempts_by_offset("retried")) == COUNT, timeout=30,
               what="every message run once", watch=[worker])
    rows = wait_until(recorded_rows, timeout=SHORT / 2, interval=0.01,
                      what="every retry recorded", watch=[worker])
    firsts = {offset: at for offset, found in attempts_by_offset("retried").items()
              for attempt, at in found if attempt == 1}
    for offset, (until, _) in rows.items():
        due = firsts[offset] + delays[offset]
        assert due - 0.05 <= until / 1000 <= due + 0.5, (offset, until, due)

    def all_run_twice() -> dict[int, list[tuple[int, float]]] | None:
        found = attempts_by_offset("retried")
        done = len(found) == COUNT and all(len(r) >= 2 for r in found.values())
        return found if done else None

    runs = wait_until(all_run_twice, timeout=30, what="every message run twice",
                      watch=[worker])
    for offset, found in runs.items():
        (first, first_at), (second, second_at) = found[:2]
        assert (first, second) == (1, 2), (offset, found)
        waited = second_at - first_at
        assert delays[offset] - 0.05 <= waited < delays[offset] + 1.0, (offset, waited)
    assert all(len(found) == 2 for found in runs.values())


def test_a_retry_the_database_refuses_keeps_back_only_itself(workers):
    published = sqlqueue.publish_many("hostile", [
        {"payload": {"error": "refuse-me" if n == 7 else f"plain {n}"}, "key": f"k{n}"}
        for n in range(20)])
    refused = published[7].offset
    others = {m.offset for m in published} - {refused}
    with refusing("sqlqueue_test_refused_retry", "queue_delivery_state", "UPDATE",
                  contains("last_error", "refuse-me")):
        worker = workers.start("refusing", "--topic", "hostile", "--group", "billing",
                               "--concurrency", "32")
        # Three attempts each (max_attempts=3), the first two recorded as retries, then a
        # dead letter: every retry but the refused one's was written.
        wait_until(lambda: set(DeadLetter.objects.filter(original_topic="hostile")
                               .values_list("original_offset", flat=True)) >= others,
                   timeout=30, what="the 19 others dead-lettered after 3 attempts",
                   watch=[worker])
        runs = attempts_by_offset("hostile")
        assert all([a for a, _ in runs[o]] == [1, 2, 3] for o in others), runs
        # The refused one ran once: its retry could not be written, so it waits out its
        # visibility timeout (30 s) before it runs again.
        assert [a for a, _ in runs[refused]] == [1]


def test_dead_letters_recorded_together_keep_each_copy_its_own_error_and_origin(workers):
    published = sqlqueue.publish_many("hostile", [
        {"payload": {"error": f"broken number {n:02d}"}, "key": f"k{n % 7}", "id": f"order-{n}"}
        for n in range(COUNT)])
    worker = workers.start("doomed", "--topic", "hostile", "--group", "billing",
                           "--concurrency", "32")
    copies = wait_until(
        lambda: (found := list(QueueMessage.objects.filter(topic="hostile_dlq")))
        and len(found) == COUNT and found,
        timeout=60, what="every message dead-lettered", watch=[worker])
    by_origin = {copy.original_offset: copy for copy in copies}
    for n, message in enumerate(published):
        copy = by_origin[message.offset]
        errors = [e for e in (f"broken number {m:02d}" for m in range(COUNT)) if e in copy.last_error]
        assert errors == [f"broken number {n:02d}"], (n, copy.last_error)
        assert (copy.failure_count, copy.original_id, copy.original_topic) == (
            3, f"order-{n}", "hostile"), n
        assert (copy.message_key, copy.payload, copy.consumer_group) == (
            f"k{n % 7}", {"error": f"broken number {n:02d}"}, "billing"), n
        assert copy.message_id == f"billing:{message.offset}"


def test_dead_letters_whose_originals_were_collected_are_each_written_from_the_delivery(workers):
    published = sqlqueue.publish_many("vanishing", [
        {"payload": {"order": n}, "key": f"c-{n}", "id": f"order-{n}"} for n in range(20)])
    worker = workers.start("vanishing", "--topic", "vanishing", "--concurrency", "32")
    copies = wait_until(
        lambda: (found := list(QueueMessage.objects.filter(topic="vanishing_dlq")))
        and len(found) == len(published) and found,
        timeout=30, what="every message dead-lettered", watch=[worker])
    by_origin = {copy.original_offset: copy for copy in copies}
    for n, message in enumerate(published):
        copy = by_origin[message.offset]
        assert (copy.payload, copy.message_key, copy.original_id) == (
            {"order": n}, f"c-{n}", f"order-{n}")
        assert "gone" in copy.last_error
    assert not QueueMessage.objects.filter(topic="vanishing").exists()


def test_a_dead_letter_the_database_refuses_keeps_back_only_itself(workers):
    published = sqlqueue.publish_many("hostile", [
        {"payload": {"error": "refuse-me" if n == 7 else f"plain {n}"}, "key": f"k{n}"}
        for n in range(20)])
    refused = published[7].offset
    others = {m.offset for m in published} - {refused}
    with refusing("sqlqueue_test_refused_dead_letter", "queue_messages", "INSERT",
                  contains("last_error", "refuse-me")):
        worker = workers.start("refusing", "--topic", "hostile", "--group", "billing",
                               "--concurrency", "32")
        wait_until(lambda: set(DeadLetter.objects.filter(original_topic="hostile")
                               .values_list("original_offset", flat=True)) >= others,
                   timeout=30, what="the 19 others dead-lettered", watch=[worker])
        # The refused one's copy could not be written: it is not acked either, so it
        # runs again once its visibility runs out, and nothing is lost.
        assert not DeadLetter.objects.filter(original_offset=refused).exists()
        row = DeliveryState.objects.get(topic="hostile", consumer_group="billing",
                                        message_offset=refused)
        assert not row.acked
