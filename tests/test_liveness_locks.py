"""Liveness locks, in-process: a worker's lock is seen held by every other session until
its connection closes, and a lease or heartbeat whose holder's lock nobody holds counts as
gone, while one whose holder holds it, or never advertised one, is judged by its lease.

SQLite has no server session a lock could belong to: there workers are judged by their
leases alone (tests/test_worker_liveness.py shows it with processes).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_sqlqueue.db import liveness as locks
from django_sqlqueue.models import PartitionLease, SubscriberHeartbeat
from django_sqlqueue.worker.leasing import Leasing
from django_sqlqueue.worker.liveness import LivenessLock
from tests.factories import PartitionLeaseFactory, SubscriberHeartbeatFactory
from tests.helpers import now_ms
from tests.worker_harness import wait_until

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor == "sqlite",
                       reason="SQLite has no server sessions: leases alone (documented)"),
]

GROUP, TOPIC = "liveness", "liveness"


def new_token() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def held() -> Iterator[str]:
    """The token of a worker that is alive: its lock held on a connection of its own."""
    token = new_token()
    lock = LivenessLock(token, "default")
    lock.start()
    try:
        wait_until(lock.held, timeout=10, what="the liveness lock taken")
        yield token
    finally:
        lock.stop()


def lease(partition: str, holder: str, *, liveness: str, renewed: int | None = None) -> None:
    PartitionLeaseFactory(consumer_group=GROUP, topic=TOPIC, partition_key=partition,
                          leased_by=f"worker-{partition}", lease_token=holder,
                          liveness_token=liveness,
                          lease_renewed_at=now_ms() if renewed is None else renewed)


def claimable(judge: bool) -> list[str]:
    with transaction.atomic():
        return PartitionLease.objects.claimable(GROUP, TOPIC, now_ms() - 30_000, 100, "default",
                                                judge)


# --------------------------------------------------------------------------- the lock


def test_a_lock_is_seen_held_by_other_sessions_until_its_connection_closes():
    token = new_token()
    lock = LivenessLock(token, "default")
    assert not locks.seen_held(connection, token)
    lock.start()
    try:
        wait_until(lock.held, timeout=10, what="the liveness lock taken")
        assert locks.seen_held(connection, token)
    finally:
        lock.stop()
    assert not lock.held()
    wait_until(lambda: not locks.seen_held(connection, token), timeout=5,
               what="the server releasing the lock")


def test_a_lock_taken_again_after_its_session_was_ended_by_the_server():
    token = new_token()
    lock = LivenessLock(token, "default")
    lock.start()
    try:
        wait_until(lock.held, timeout=10, what="the liveness lock taken")
        changes = lock.changes
        end_session_holding(token)
        wait_until(lambda: lock.changes >= changes + 2 and lock.held(), timeout=10,
                   what="the lock lost and taken again")
        assert locks.seen_held(connection, token)
        assert not lock.settled()  # a new hold: no judging others until it settles
    finally:
        lock.stop()


def test_a_negative_advisory_key_is_found_like_a_positive_one():
    # Keys are signed 64-bit: half the tokens give a negative one (PostgreSQL).
    token = "f" + new_token()[1:]
    assert locks.advisory_key(token) < 0
    lock = LivenessLock(token, "default")
    lock.start()
    try:
        wait_until(lock.held, timeout=10, what="the liveness lock taken")
        assert locks.seen_held(connection, token)
    finally:
        lock.stop()


def test_a_token_that_is_not_32_hex_digits_is_refused():
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        locks.lock_name("not-a-token")


# --------------------------------------------------------------------------- leases


def test_a_fresh_lease_whose_holder_is_gone_is_claimable_when_judging(held):
    gone = new_token()
    lease("0", gone, liveness=gone)  # its lock: nobody holds it
    lease("1", held, liveness=held)  # alive
    lease("2", new_token(), liveness="")  # never advertised one: its lease decides
    other = new_token()
    lease("3", new_token(), liveness=other)  # taken by a release that does not write it

    assert claimable(judge=True) == ["0"]
    assert claimable(judge=False) == []


def test_a_stale_lease_is_claimable_whatever_its_holders_lock_says(held):
    lease("0", held, liveness=held, renewed=now_ms() - 60_000)

    assert claimable(judge=True) == ["0"]
    assert claimable(judge=False) == ["0"]


def test_taking_a_gone_holders_lease_fences_it_as_an_expired_one_does():
    gone = new_token()
    lease("0", gone, liveness=gone)
    taker = new_token()
    with transaction.atomic():
        assert PartitionLease.objects.claimable(GROUP, TOPIC, now_ms() - 30_000, 1, "default",
                                                True) == ["0"]
        PartitionLease.objects.take(GROUP, TOPIC, ["0"], "taker", taker, now_ms() - 30_000,
                                    now_ms(), "default", judge_liveness=True,
                                    liveness_token=taker)

    row = PartitionLease.objects.get(consumer_group=GROUP, topic=TOPIC, partition_key="0")
    assert (row.leased_by, row.lease_token, row.liveness_token, row.generation) == (
        "taker", taker, taker, 2)
    # The old holder's fence now finds nothing of its own.
    assert PartitionLease.objects.fence("worker-0", gone, [(GROUP, TOPIC, "0")],
                                        "default").owned == {}


def test_an_alive_holders_lease_is_not_taken_even_when_judging(held):
    lease("0", held, liveness=held)
    with transaction.atomic():
        PartitionLease.objects.take(GROUP, TOPIC, ["0"], "taker", new_token(),
                                    now_ms() - 30_000, now_ms(), "default",
                                    judge_liveness=True)

    row = PartitionLease.objects.get(consumer_group=GROUP, topic=TOPIC, partition_key="0")
    assert (row.lease_token, row.generation) == (held, 1)


# --------------------------------------------------------------------------- heartbeats


def test_a_worker_whose_lock_is_gone_is_not_counted_live_when_judging(held):
    gone = new_token()
    for name, token in (("alive", held), ("gone", gone), ("lease-only", "")):
        SubscriberHeartbeatFactory(consumer_group=GROUP, topic=TOPIC, subscriber_name=name,
                                   liveness_token=token)

    def counts(judge: bool) -> dict[tuple[str, str], int]:
        return SubscriberHeartbeat.objects.active_counts([TOPIC], now_ms() - 30_000, "default",
                                                         judge_liveness=judge)

    assert counts(judge=True) == {(GROUP, TOPIC): 2}
    assert counts(judge=False) == {(GROUP, TOPIC): 3}


# --------------------------------------------------------------------------- the worker's side


def test_a_worker_advertises_its_token_only_while_its_lock_is_held():
    leasing = Leasing("advertiser", "default", [], 30.0, liveness=True)
    assert leasing._liveness_token() == ""  # not started: nothing held
    assert leasing.liveness is not None
    leasing.liveness.start()
    try:
        wait_until(leasing.liveness.held, timeout=10, what="the liveness lock taken")
        assert leasing._liveness_token() == leasing.token
        assert leasing.liveness_changed()  # not yet written by a renewal
        assert not leasing._judging()  # held for less than SETTLE
    finally:
        leasing.liveness.stop()
    assert leasing._liveness_token() == ""


@override_settings(SQLQUEUE={"LIVENESS": False})
def test_liveness_off_means_leases_alone():
    assert locks.fallback_reason("default") == "SQLQUEUE['LIVENESS'] is False"


def end_session_holding(token: str) -> None:
    """End the server session that holds ``token``'s lock, as an operator or a failover
    would."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = "
                "'advisory' AND l.objsubid = 1 AND ((l.classid::int8 << 32) | l.objid::int8) = %s",
                [locks.advisory_key(token)])
        else:
            cursor.execute("SELECT IS_USED_LOCK(%s)", [locks.lock_name(token)])
            cursor.execute(f"KILL {int(cursor.fetchone()[0])}")
    time.sleep(0.05)
