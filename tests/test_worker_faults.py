"""Workers under trouble: database faults, and handlers that ask for a retry."""

from __future__ import annotations

import sqlite3
import time

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import QueueMessage
from tests.testapp.models import Handled
from tests.worker_harness import (
    TcpForwarder,
    end_sessions,
    other_sessions,
    partition_heads,
    partition_watermark,
    position_of,
    wait_until,
    watermark,
    worker_pool,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def handled_offsets(topic: str = "orders") -> set[int]:
    return set(Handled.objects.filter(group="billing", topic=topic)
               .values_list("offset", flat=True))


def hold_sqlite_write_lock(seconds: float) -> None:
    """Keep the database's write lock, as a long writing transaction would."""
    locker = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=20)
    try:
        locker.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        locker.execute("COMMIT")
    finally:
        locker.close()


def test_a_worker_rides_out_a_database_fault_and_loses_nothing(workers):
    batch = [{"payload": {"n": n}, "key": f"k{n % 5}"} for n in range(100)]
    first = sqlqueue.publish_many("orders", batch)
    # A delivery whose COMMIT was cut off may have committed anyway: it comes back after the
    # visibility timeout, kept short here.
    worker = workers.start("faulty", "--group", "billing", "--topic", "orders",
                           settings={"VISIBILITY_TIMEOUT": 2.0})
    wait_until(handled_offsets, what="the worker consuming", watch=[worker])

    if connection.vendor == "sqlite":
        hold_sqlite_write_lock(1.0)
    else:
        assert end_sessions(other_sessions()) >= 1
    second = sqlqueue.publish_many("orders", batch)

    offsets = {m.offset for m in first + second}
    wait_until(lambda: handled_offsets() >= offsets, timeout=30,
               what="all 200 messages handled", watch=[worker])
    heads = partition_heads("orders")
    wait_until(lambda: all(partition_watermark("billing", "orders", p) == h for p, h in heads.items()),
               what="watermarks at the partition heads", watch=[worker])
    assert worker.alive
    assert not QueueMessage.objects.filter(topic="orders_dlq").exists()
    if connection.vendor != "sqlite":
        # The worker noticed, said so in one line, and carried on.
        wait_until(lambda: "transient database error" in worker.stderr,
                   what="a log line about the fault", watch=[worker])
        assert "database recovered" in worker.stderr


def test_retry_with_a_delay_redelivers_after_that_delay(workers):
    worker = workers.start("retrying", "--topic", "retried")
    # Longer than the handler's backoff (FAST_RETRY, at most 0.2 s): the Retry's delay rules.
    message = sqlqueue.publish("retried", {"retry_in": 0.4}, key="r")

    first, second = wait_until(
        lambda: list(Handled.objects.filter(offset=message.offset).order_by("attempt"))[:2]
        if Handled.objects.filter(offset=message.offset).count() >= 2 else None,
        what="two attempts", watch=[worker],
    )
    wait_until(lambda: watermark("billing", "retried", "r") >= position_of(message.offset),
               what="the retried message acked", watch=[worker])

    assert (first.attempt, second.attempt) == (1, 2)
    waited = second.handled_at - first.handled_at
    assert waited >= 0.4 - 0.02
    # Redelivered when the delay ran out, not after the visibility timeout (5 s).
    assert waited < 0.4 + 2.0
    assert Handled.objects.filter(offset=message.offset).count() == 2


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no server to wait for")
def test_a_worker_started_while_the_database_is_down_waits_for_it(workers):
    """A supervisor restarts everything at once after an outage: the worker must not die
    in its start-up checks because the server is not back yet."""
    db = connection.settings_dict
    forwarder = TcpForwarder(str(db.get("HOST") or "127.0.0.1"),
                             int(db.get("PORT") or (3306 if connection.vendor == "mysql" else 5432)))
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    user = db.get("USER") or ("root" if connection.vendor == "mysql" else "postgres")
    url = f"{scheme}://{user}@127.0.0.1:{forwarder.port}/{db['NAME']}"
    worker = workers.start("late-db", "--topic", "orders", extra_env={"DATABASE_URL": url})
    try:
        wait_until(lambda: "step=connect transient database error" in worker.stderr,
                   what="the worker noticing the database is down", watch=[worker])
        message = sqlqueue.publish("orders", {"n": 1}, key="late")
        forwarder.start()
        wait_until(lambda: Handled.objects.filter(offset=message.offset).exists(), timeout=30,
                   what="the message handled once the database answers", watch=[worker])
        assert "Traceback" not in worker.stderr
    finally:
        worker.terminate()
        worker.wait_exit(timeout=15)
        forwarder.stop()
