"""Publishing and real workers through PgBouncer in transaction pooling mode (PostgreSQL).

PgBouncer runs once for the module on a port of its own with a pool of 5 server
connections, so publishers' and workers' transactions really share server sessions. The
subprocesses' ``default`` alias goes through it (``DISABLE_SERVER_SIDE_CURSORS``), and
``direct`` reaches the same test database without it: with ``DIRECT_DATABASE`` the
wake-up listener and the liveness lock use that; without it the worker polls and judges
others by their leases alone, and still handles, retries and dead-letters every message.
MariaDB and SQLite have no PgBouncer: skipped there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from clusters.pgbouncer import PgBouncer, base_directory
from django_sqlqueue.models import DeadLetter, PartitionLease, QueueMessage
from django_sqlqueue.worker.liveness import SETTLE
from tests.testapp.models import Handled
from tests.worker_harness import (
    REPO_ROOT,
    lease_counts,
    wait_until,
    worker_env,
    worker_pool,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="PgBouncer pools PostgreSQL connections only"),
    pytest.mark.skipif(shutil.which("pgbouncer") is None
                       and not os.path.exists("/usr/sbin/pgbouncer"),
                       reason="pgbouncer is not installed (.ci/provision installs it)"),
]

POOL_SIZE = 5
DIRECT = {"DIRECT_DATABASE": "direct"}


@pytest.fixture(scope="module")
def bouncer():  # type: ignore[no-untyped-def]
    # Under .test-data, not pytest's tmp_path: pgbouncer runs as another user when the
    # tests run as root, and must reach its directory.
    with PgBouncer(base_directory() / "tests", pool_size=POOL_SIZE) as running:
        yield running


@pytest.fixture
def pooled_env(bouncer):  # type: ignore[no-untyped-def]
    return {"SQLQUEUE_TEST_POOLER_PORT": str(bouncer.port)}


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


PUBLISHERS = textwrap.dedent("""
    import threading, django
    django.setup()
    from django.db import connection, connections
    import django_sqlqueue as sqlqueue
    assert connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"]
    def publish(n):
        for i in range(10):
            # Ten same statements on one client connection: psycopg would prepare them
            # from the fifth on, if prepared statements were on.
            sqlqueue.publish("orders", {"thread": n, "i": i}, key=f"k{n}")
        sqlqueue.publish_many("orders", [{"payload": {"thread": n, "many": i}, "key": f"k{n}"}
                                         for i in range(5)])
        connections.close_all()
        done.append(n)
    done = []
    threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert sorted(done) == list(range(8)), done
""")


def test_publishing_from_threads_through_the_pooler(pooled_env, transactional_db):
    done = subprocess.run([sys.executable, "-c", PUBLISHERS], cwd=REPO_ROOT,
                          env={**worker_env(), **pooled_env}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert QueueMessage.objects.filter(topic="orders").count() == 8 * 15
    for n in range(8):  # each thread's messages in its own order on its key
        offsets = list(QueueMessage.objects.filter(topic="orders", message_key=f"k{n}")
                       .order_by("offset").values_list("payload", flat=True))
        assert [p.get("i", p.get("many")) for p in offsets] == [*range(10), *range(5)]


def run_through_the_pooler(workers, pooled_env, settings):  # type: ignore[no-untyped-def]
    worker = workers.start("pooled", "--topic", "orders", "--topic", "poison",
                           settings=settings, extra_env=pooled_env)
    wait_until(lambda: "started" in worker.stderr or "listening" in worker.stderr,
               what="the worker started", watch=[worker])
    sqlqueue.publish_many("orders", [{"payload": {"n": n}} for n in range(20)])
    sqlqueue.publish("orders", {"n": "retried", "fail_for": "billing"}, key="r")
    sqlqueue.publish("poison", {"n": "dead"})
    # 20 handled by each group, the failing one retried up to MAX_ATTEMPTS, both
    # dead-lettered after their attempts.
    wait_until(lambda: DeadLetter.objects.count() == 2, what="two dead letters", watch=[worker])
    wait_until(lambda: Handled.objects.filter(topic="orders").exclude(key="r").count() == 40,
               what="every order handled by both groups", watch=[worker])
    assert Handled.objects.filter(topic="poison").count() == 3
    assert Handled.objects.filter(topic="orders", key="r", group="billing").count() == 5
    return worker


def test_a_worker_through_the_pooler_listens_and_locks_on_the_direct_connection(
        workers, pooled_env):
    worker = run_through_the_pooler(workers, pooled_env, DIRECT)
    assert "listening for notifications" in worker.stderr
    assert "liveness=lock" in worker.stderr
    with connection.cursor() as cursor:  # the listener's session is a direct one
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name "
                       "LIKE 'sqlqueue listener%%' AND datname = current_database()")
        assert cursor.fetchone()[0] == 1


def test_without_a_direct_connection_the_worker_polls_and_judges_by_leases(
        workers, pooled_env):
    worker = run_through_the_pooler(workers, pooled_env, {})
    assert "polling only" in worker.stderr
    assert "listening for notifications" not in worker.stderr
    assert "liveness=lease" in worker.stderr


def test_the_direct_listener_wakes_a_pooled_worker_long_before_its_poll(workers, pooled_env):
    worker = workers.start("woken", "--topic", "orders", extra_env=pooled_env,
                           settings={**DIRECT, "POLL_INTERVAL": 5.0})
    wait_until(lambda: "listening for notifications" in worker.stderr,
               what="the listener on the direct connection", watch=[worker])
    time.sleep(0.3)  # past the wake-up and poll that follow the listener's start
    published = time.time()
    sqlqueue.publish("orders", {"n": "woken"})
    wait_until(lambda: Handled.objects.filter(topic="orders").count() == 2, timeout=10,
               what="the message handled by both groups", watch=[worker])
    took = max(Handled.objects.values_list("handled_at", flat=True)) - published
    assert took < 2.0, f"took {took:.2f}s: polled, not woken"


def test_a_killed_pooled_workers_partitions_are_taken_over_by_its_direct_lock(
        workers, pooled_env):
    settings = {**DIRECT, "LEASE_DURATION": 30.0, "RENEW_INTERVAL": 0.5}
    a = workers.start("live-a", "--topic", "spread", settings=settings, extra_env=pooled_env)
    b = workers.start("live-b", "--topic", "spread", settings=settings, extra_env=pooled_env)
    wait_until(lambda: lease_counts(["live-a", "live-b"]) == [2, 2], what="a 2/2 share",
               watch=[a, b])
    wait_until(lambda: not PartitionLease.objects.filter(topic="spread", liveness_token="")
               .exists(), what="both workers' tokens on their leases", watch=[a, b])
    time.sleep(SETTLE)
    b.kill()
    killed = time.monotonic()
    wait_until(lambda: lease_counts(["live-a"]) == [4], timeout=10,
               what="the survivor holding every partition", watch=[a])
    took = time.monotonic() - killed
    assert took <= 2.0, f"took {took:.2f}s with a 30 s lease"
