"""Wake-up on commit (PostgreSQL): publishing notifies, idle workers start the message at
once instead of at their next poll, and polling still finds whatever a notification missed.

The workers poll every 5 s here, so a message handled within a second was woken up for.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_sqlqueue as sqlqueue
from django_sqlqueue.db import notify
from django_sqlqueue.worker.wakeup import COALESCE, Listener
from tests.testapp.models import Handled
from tests.worker_harness import lease_counts, wait_until, worker_pool

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="LISTEN/NOTIFY is PostgreSQL's"),
]

SLOW_POLL = 5.0  # seconds between two polls of the workers
WOKEN = 1.5  # seconds: handled this soon after publishing means woken, not polled
PARTITIONS = 12  # of "orders" (tests/settings.py)


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


@pytest.fixture
def listening():
    """A LISTEN connection of this test's own; yields a function draining what arrived."""
    conn = notify.listener_connection("default", "sqlqueue test listener")

    def received(wait: float = 0.5) -> list[str]:
        return [n.payload for n in conn.notifies(timeout=wait)]

    yield received
    conn.close()


def handled_at(offset: int) -> float | None:
    row = Handled.objects.filter(group="billing", offset=offset).order_by("handled_at").first()
    return row.handled_at if row else None


def listeners(name: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database()", [f"sqlqueue listener {name}"])
        return [row[0] for row in cursor.fetchall()]


def start_idle_worker(workers, name: str, **settings):
    worker = workers.start(name, "--topic", "orders", "--group", "billing",
                           settings={"POLL_INTERVAL": SLOW_POLL, **settings})
    wait_until(lambda: lease_counts([name]) == [PARTITIONS], what="the worker leasing",
               watch=[worker], timeout=30)
    return worker


def publish_and_time(key: str = "k") -> tuple[int, float]:
    stored = sqlqueue.publish("orders", {"n": 1}, key=key)
    return stored.offset, time.time()


# --------------------------------------------------------------------------- publishing


def test_a_transaction_notifies_once_per_topic_however_many_messages(listening):
    with transaction.atomic():
        for n in range(3):
            sqlqueue.publish("orders", {"n": n}, key="k")
        sqlqueue.publish_many("orders", [{"payload": {"n": n}} for n in range(2)])
        sqlqueue.publish("poison", {"n": 1})
        assert listening(0.2) == []  # nothing before the commit
    assert sorted(listening()) == ["orders", "poison"]


def test_a_transaction_sends_one_statement_per_topic(listening):
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        for n in range(5):
            sqlqueue.publish("orders", {"n": n}, key="k")
    assert sum("pg_notify" in q["sql"] for q in queries.captured_queries) == 1


def test_a_rolled_back_transaction_notifies_nobody(listening):
    with pytest.raises(RuntimeError), transaction.atomic():
        sqlqueue.publish("orders", {"n": 1}, key="k")
        raise RuntimeError("rolled back")
    assert listening() == []


def test_a_rolled_back_savepoint_does_not_count_as_announced(listening):
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            sqlqueue.publish("orders", {"n": 1}, key="k")
            raise RuntimeError("savepoint rolled back")
        sqlqueue.publish("orders", {"n": 2}, key="k")
    assert listening() == ["orders"]


def test_each_autocommit_publish_notifies_from_its_insert(listening):
    with CaptureQueriesContext(connection) as queries:
        sqlqueue.publish("orders", {"n": 1}, key="k")
        sqlqueue.publish("orders", {"n": 2}, key="k")
    assert listening() == ["orders", "orders"]
    assert len(queries.captured_queries) == 2  # the INSERTs, nothing more


def test_a_duplicate_autocommit_publish_notifies_nobody(listening):
    sqlqueue.publish("orders", {"n": 1}, key="k", id="once")
    listening()
    sqlqueue.publish("orders", {"n": 1}, key="k", id="once")
    assert listening() == []


def test_notify_off_sends_nothing(listening, settings):
    settings.SQLQUEUE = {"NOTIFY": False}
    sqlqueue.publish("orders", {"n": 1}, key="k")
    assert listening() == []


def test_replaying_dead_letters_notifies_their_original_topic(listening):
    from django_sqlqueue import operations as ops
    from tests.test_operations import dead_letter, register

    register("billing")
    original = sqlqueue.publish("orders", {"n": 1}, key="k")
    dead_letter("billing", original)
    listening()  # the publish's own notification

    assert ops.replay(ops.DeadLetterFilter(topic="orders")).replayed == 1
    assert listening() == ["orders"]


# --------------------------------------------------------------------------- workers


@pytest.mark.worker
def test_an_idle_worker_starts_a_message_long_before_its_next_poll(workers):
    worker = start_idle_worker(workers, "woken")
    wait_until(lambda: listeners("woken"), what="the listener connection", watch=[worker])
    time.sleep(1.0)  # idle: past the polls of its start
    for n in range(3):
        offset, published = publish_and_time(key=f"k{n}")
        wait_until(lambda o=offset: handled_at(o), what="the message handled", watch=[worker],
                   timeout=SLOW_POLL * 2)
        assert handled_at(offset) - published < WOKEN
        time.sleep(0.3)


@pytest.mark.worker
def test_a_lost_notification_costs_at_most_one_poll_interval(workers):
    worker = start_idle_worker(workers, "unnotified", POLL_INTERVAL=2.0)
    wait_until(lambda: listeners("unnotified"), what="the listener connection", watch=[worker])
    with override_settings(SQLQUEUE={"NOTIFY": False}):  # published without a notification
        offset, published = publish_and_time()
    wait_until(lambda: handled_at(offset), what="the message handled by polling",
               watch=[worker], timeout=10)
    assert handled_at(offset) - published < 2.0 + WOKEN


@pytest.mark.worker
def test_a_killed_listener_connection_is_reopened_and_polling_covers_the_gap(workers):
    worker = start_idle_worker(workers, "severed", POLL_INTERVAL=2.0)
    [first] = wait_until(lambda: listeners("severed"), what="the listener connection",
                         watch=[worker])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    offset, published = publish_and_time(key="gap")
    wait_until(lambda: handled_at(offset), what="the message published meanwhile",
               watch=[worker], timeout=10)
    assert handled_at(offset) - published < 2.0 + WOKEN

    [second] = wait_until(lambda: [p for p in listeners("severed") if p != first],
                          what="a new listener connection", watch=[worker])
    assert second != first
    time.sleep(0.5)
    offset, published = publish_and_time(key="after")
    wait_until(lambda: handled_at(offset), what="the message after the reconnect",
               watch=[worker], timeout=10)
    assert handled_at(offset) - published < WOKEN
    assert worker.alive


@pytest.mark.worker
def test_with_notify_off_a_worker_opens_no_listener_and_polls(workers):
    worker = start_idle_worker(workers, "polling", NOTIFY=False, POLL_INTERVAL=1.0)
    offset, published = publish_and_time()
    wait_until(lambda: handled_at(offset), what="the message handled by polling",
               watch=[worker], timeout=10)
    assert handled_at(offset) - published < 1.0 + WOKEN
    assert listeners("polling") == []


# --------------------------------------------------------------------------- at volume


class CountedEvent(threading.Event):
    """A wake event that counts how often it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def notify_burst(count: int, topic: str = "orders") -> None:
    """``count`` notifications, each committed on its own, as fast as the server goes
    (what ``count`` autocommit publishers' commits would send)."""
    with connection.cursor() as cursor:
        cursor.execute(f"DO $$ BEGIN FOR i IN 1..{int(count)} LOOP "
                       f"PERFORM pg_notify('{notify.CHANNEL}', '{topic}'); COMMIT; END LOOP; END $$")


def test_the_listener_drains_a_burst_in_one_go_and_wakes_once_per_fold():
    wake = CountedEvent()
    listener = Listener(["orders"], wake, "default", "burst test")
    listener.start()
    try:
        wait_until(listener.listening.is_set, what="the listener connection", timeout=10)
        time.sleep(0.2)
        woken_before = wake.sets  # the look it takes once connected
        started = time.monotonic()
        notify_burst(2000)
        # Read as fast as they come: the wake-ups stop within seconds of the burst, not
        # after the minute that one notification per COALESCE pause would take.
        wait_until(lambda: wake.sets > woken_before, what="a wake-up", timeout=5)
        sets, still_since = wake.sets, time.monotonic()
        while time.monotonic() - still_since < 1.0:
            assert time.monotonic() - started < 6.0, "the listener still wakes the loop"
            time.sleep(0.05)
            if wake.sets != sets:
                sets, still_since = wake.sets, time.monotonic()
        elapsed = still_since - started
        assert listener.received == 2000
        assert wake.sets - woken_before == listener.wakeups
        # One wake-up per fold: at most one per COALESCE pause, however many arrived.
        assert 1 <= listener.wakeups <= elapsed / COALESCE + 2
        assert listener.wakeups < 200
    finally:
        listener.stop()


@pytest.mark.worker
def test_concurrent_publishers_notify_less_than_they_commit_and_nothing_waits_for_a_poll(
        workers, listening):
    worker = start_idle_worker(workers, "busy")
    wait_until(lambda: listeners("busy"), what="the listener connection", watch=[worker])
    time.sleep(1.0)  # idle: past the polls of its start
    listening(0.1)
    threads, each, rounds = 8, 5, 4
    commits = notifications = 0
    for round_ in range(rounds):
        published: list[tuple[int, float]] = []

        def publisher(n: int, round_: int = round_,
                      published: list[tuple[int, float]] = published) -> None:
            try:
                for i in range(each):
                    published.append(publish_and_time(key=f"r{round_}-p{n}-{i}"))
            finally:
                connections.close_all()

        pool = [threading.Thread(target=publisher, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        last_commit = max(at for _, at in published)
        commits += len(published)
        # Every message of the round handled long before the next poll (5 s): the
        # commits whose notification was skipped were announced by an owed one.
        for offset, _ in published:
            wait_until(lambda o=offset: handled_at(o), what="the round's messages handled",
                       watch=[worker], timeout=SLOW_POLL * 2)
        assert max(handled_at(o) for o, _ in published) - last_commit < WOKEN
        notifications += len(listening(0.5))  # the owed ones come within notify.INTERVAL
        time.sleep(0.5)
    assert commits == threads * each * rounds
    assert 0 < notifications < commits
