"""Which poll cycles wait for their commit's flush (PostgreSQL).

A cycle that records no outcome only hands messages out: a database crash that undid it
would deliver them again, which at-least-once allows, so it commits without waiting for the
WAL flush (a round trip of the disk fewer between a commit and its handler). A cycle that
records outcomes (acks, retries, dead letters) waits, as every other transaction does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import DeliveryState
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="synchronous_commit is PostgreSQL's"),
]

TRIGGER = "sqlqueue_test_commit_modes"


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


@pytest.fixture
def commit_modes() -> Iterator[None]:
    """Record, for every write of a delivery row, the writing transaction's commit mode."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TRIGGER} (op text, mode text)")
        cursor.execute(
            f"CREATE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO {TRIGGER} VALUES (TG_OP, current_setting('synchronous_commit')); "
            "RETURN NULL; END $$")
        cursor.execute(f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON "
                       f"queue_delivery_state FOR EACH ROW EXECUTE FUNCTION {TRIGGER}()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON queue_delivery_state")
            cursor.execute(f"DROP FUNCTION IF EXISTS {TRIGGER}()")
            cursor.execute(f"DROP TABLE IF EXISTS {TRIGGER}")


def recorded() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT op, mode FROM {TRIGGER}")  # noqa: S608 - a fixed name
        return [(op, mode) for op, mode in cursor.fetchall()]


def test_hand_outs_alone_commit_without_the_flush_and_acks_with_it(workers, commit_modes):
    worker = workers.start("modes", "--topic", "orders", "--group", "billing")
    for n in range(5):
        # One at a time: each is handed out by a cycle with nothing else to record.
        message = sqlqueue.publish("orders", {"n": n}, key=f"k{n}")
        wait_until(lambda offset=message.offset: Handled.objects.filter(
            offset=offset, group="billing").exists() and not DeliveryState.objects
            .filter(message_offset=offset, consumer_group="billing", acked=False).exists(),
            timeout=30, what=f"message {n} handled and acked", watch=[worker])

    writes = recorded()
    hand_outs = [mode for op, mode in writes if op == "INSERT"]
    acks = [mode for op, mode in writes if op != "INSERT"]
    assert len(hand_outs) >= 5 and acks, writes
    assert "off" in hand_outs, writes
    assert set(acks) == {"on"}, writes
