"""``SQLQUEUE["READ_DATABASE"]`` on a real PostgreSQL streaming replica.

A primary and a synchronous replica of this machine (clusters/pg.py, on ports of their
own) are started once for the module. The ``queue`` alias reaches the primary, the
``queue_replica`` alias the replica, with the settings docs/operating.md ("Read replicas")
tells a project to use. Each test pauses the replica's replay (``pg_wal_replay_pause()``),
changes the queue on the primary, and shows what reads the replica still shows the old
view (the admin's pages, ``sqlqueue stats``, the metrics, a Spark batch read) while what
writes acts on the primary; once replay resumes, the replica shows the change too.

PostgreSQL suite only: elsewhere the module is skipped, saying why. A cluster that cannot
be started fails the module under CI=true and skips it otherwise.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client, override_settings
from django.urls import reverse

import django_sqlqueue as sqlqueue
from clusters.common import ClusterError, base_directory, env_port
from clusters.pg import DATABASE, PgCluster
from django_sqlqueue.conf import read_database
from django_sqlqueue.metrics.database import DatabaseCollector
from django_sqlqueue.models import DeadLetter, QueueMessage, Topic
from django_sqlqueue.models.messages import DeadLetterSource
from django_sqlqueue.operations import overview
from django_sqlqueue.testing import drain
from tests import backends

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="the read replica is a PostgreSQL streaming replica: this module "
                              "runs in the PostgreSQL suite"),
    pytest.mark.django_db(databases=["default", "queue", "queue_replica"], transaction=True),
]

PORT_VARIABLE = "SQLQUEUE_READ_REPLICA_PORT"
DEFAULT_PORT = 25442  # and the next one; the failover's pair uses 25432-25433
CATCH_UP_TIMEOUT = 10.0  # seconds


@pytest.fixture(scope="module")
def pair(django_db_setup: Any, django_db_blocker: Any) -> Iterator[PgCluster]:
    """The primary and its replica, the ``queue`` and ``queue_replica`` aliases on them and
    the tables migrated (on the primary; the replica receives them), for this module."""
    cluster = PgCluster(directory=base_directory() / "read-replica",
                        port=env_port(PORT_VARIABLE, DEFAULT_PORT))
    try:
        cluster.start(fresh=True)
    except ClusterError as exc:
        cluster.stop()
        if backends.is_ci():
            raise  # CI=true: every database the suite names must run
        pytest.skip(f"could not start a PostgreSQL primary and replica ({PORT_VARIABLE} "
                    f"chooses this module's ports): {exc}")
    default = settings.DATABASES["default"]
    base = {**default, "HOST": "127.0.0.1", "USER": "postgres", "PASSWORD": "",
            "NAME": DATABASE, "OPTIONS": {}}
    aliases = {
        "queue": {**base, "PORT": cluster.primary.port, "TEST": {"NAME": DATABASE}},
        # As a project's test settings would set it, so its tests need no replica. Here the
        # alias is added after the test databases were set up, so nothing makes it a
        # mirror: it connects to the replica, and only the flush after each test skips it.
        "queue_replica": {**base, "PORT": cluster.replica.port,
                          "TEST": {"NAME": DATABASE, "MIRROR": "queue"}},
    }
    configured = connections.configure_settings({"default": default, **aliases})
    for alias in aliases:
        settings.DATABASES[alias] = configured[alias]
    try:
        with django_db_blocker.unblock():
            call_command("migrate", database="queue", verbosity=0, interactive=False)
        caught_up(cluster)
        yield cluster
    finally:
        for alias in aliases:
            connections[alias].close()
            del connections[alias]
            del settings.DATABASES[alias]
        cluster.stop()


def caught_up(cluster: PgCluster) -> None:
    """Wait until the replica has replayed everything the primary has written."""
    lsn = cluster.query(cluster.primary, "SELECT pg_current_wal_lsn()")
    deadline = time.monotonic() + CATCH_UP_TIMEOUT
    while cluster.query(cluster.replica, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") != "t":
        assert time.monotonic() < deadline, "the replica did not catch up"
        time.sleep(0.05)


@pytest.fixture
def replica_settings(pair: PgCluster) -> Iterator[PgCluster]:
    """The settings docs/operating.md gives for a read replica, replay running again after
    the test."""
    with override_settings(DATABASE_ROUTERS=["django_sqlqueue.routers.QueueRouter"],
                           SQLQUEUE={**settings.SQLQUEUE, "DATABASE": "queue",
                                     "READ_DATABASE": "queue_replica"}):
        try:
            yield pair
        finally:
            pair.query(pair.replica, "SELECT pg_wal_replay_resume()")


def pause(cluster: PgCluster) -> None:
    """The replica stops replaying once it has caught up (it keeps receiving): it shows the
    queue as it is now. A commit on the primary still returns, as ``synchronous_commit =
    on`` waits for the replica to write the transaction, not to apply it."""
    caught_up(cluster)
    cluster.query(cluster.replica, "SELECT pg_wal_replay_pause()")
    deadline = time.monotonic() + CATCH_UP_TIMEOUT
    while cluster.query(cluster.replica, "SELECT pg_get_wal_replay_pause_state()") != "paused":
        assert time.monotonic() < deadline, "replay did not pause"
        time.sleep(0.05)


def resume(cluster: PgCluster) -> None:
    cluster.query(cluster.replica, "SELECT pg_wal_replay_resume()")
    caught_up(cluster)


def stats(*args: str) -> list[tuple[str, str, int]]:
    out = io.StringIO()
    call_command("sqlqueue", "stats", "--json", *args, stdout=out)
    return [(row["topic"], row["group"], row["lag"]) for row in json.loads(out.getvalue())]


def registered_group() -> None:
    """Group billing consumes orders, its one message handled: lag 0."""
    sqlqueue.publish("orders", {"n": 0}, key="k")
    assert drain("orders", "billing").handled == 1


def dead_letter() -> DeadLetter:
    """A message of orders that billing gave up on, made as a worker makes it."""
    stored = sqlqueue.publish("orders", {"n": "dead"}, key="d")
    QueueMessage.objects.copy_to_dead_letters(
        DeadLetterSource(stored.offset, "orders", "d", stored.id, json.dumps(stored.payload),
                         json.dumps(stored.headers), 0),
        "orders_dlq", "billing", 5, "RuntimeError: boom", using="queue")
    Topic.objects.record({"orders_dlq": 4}, using="queue")
    return DeadLetter.objects.using("queue").get(original_offset=stored.offset)


# --------------------------------------------------------------------------- reads


def test_read_database_names_the_replica_of_the_queue_alias(replica_settings):
    assert read_database() == "queue_replica"
    assert read_database("queue") == "queue_replica"
    assert read_database("default") == "default"  # no replica of its own
    from django.db import router

    # The router keeps reads on the primary: publish() and the worker read what they write.
    assert router.db_for_read(QueueMessage) == "queue"


def test_stats_and_the_metrics_read_the_replica(replica_settings):
    registered_group()
    pause(replica_settings)
    sqlqueue.publish_many("orders", [{"payload": {"n": n}} for n in range(3)])
    assert [lag for _, _, lag in stats("--database", "queue")] == [3]  # the primary
    assert stats() == [("orders", "billing", 0)]  # the replica, replay paused
    assert [row.lag for row in DatabaseCollector().rows()] == [0]
    assert [row.lag for row in overview(using="queue")] == [3]
    resume(replica_settings)
    assert stats() == [("orders", "billing", 3)]
    assert [row.lag for row in DatabaseCollector().rows()] == [3]


def test_admin_pages_read_the_replica_and_actions_act_on_the_primary(replica_settings):
    cluster = replica_settings
    registered_group()
    letter = dead_letter()
    pause(cluster)
    newer = sqlqueue.publish("orders", {"n": "newer"}, id="published-while-paused")
    admin = User.objects.create_superuser("admin", password="pw")
    looking, acting = Client(), Client()
    looking.force_login(admin)
    acting.force_login(admin)
    messages_url = reverse("admin:django_sqlqueue_queuemessage_changelist")
    dead_letters_url = reverse("admin:django_sqlqueue_deadletter_changelist")

    # Pages read the replica: the message published since the pause is not there yet.
    page = looking.get(messages_url).content.decode()
    assert "published-while-paused" not in page and letter.message_id in page
    assert looking.get(reverse("admin:django_sqlqueue_queuemessage_change",
                               args=[newer.offset])).status_code == 302  # not found there
    # Every page renders from the replica, which refuses any write: none of them writes.
    for name, args in [("overview", []), ("partition_changelist", []),
                       ("subscriber_changelist", []), ("schedule_changelist", []),
                       ("queuemessage_change", [letter.original_offset]),
                       ("deadletter_change", [letter.offset])]:
        assert looking.get(reverse(f"admin:django_sqlqueue_{name}", args=args)).status_code == 200
    assert f"deadletter/{letter.offset}/change/" in looking.get(dead_letters_url).content.decode()

    # The replay acts on the primary (the replica would refuse a write), and the page it
    # redirects to reads the primary: the dead letter is gone there.
    done = acting.post(dead_letters_url, {
        "action": "replay_dead_letters", "index": "0", "select_across": "0",
        "_selected_action": [str(letter.offset)], "sqlqueue_confirm": "yes"}, follow=True)
    assert "Replayed 1 dead letter" in done.content.decode()
    assert not DeadLetter.objects.using("queue").exists()
    assert f"deadletter/{letter.offset}/change/" not in done.content.decode()
    assert "published-while-paused" in acting.get(messages_url).content.decode()
    # Another operator's pages still read the replica, which has not replayed it yet.
    assert DeadLetter.objects.using("queue_replica").filter(offset=letter.offset).exists()
    assert f"deadletter/{letter.offset}/change/" in looking.get(dead_letters_url).content.decode()

    resume(cluster)
    assert f"deadletter/{letter.offset}/change/" not in looking.get(dead_letters_url).content.decode()
    assert "published-while-paused" in looking.get(messages_url).content.decode()


def test_a_spark_batch_read_reads_the_read_url_and_a_stream_the_url(replica_settings):
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    pytest.importorskip("pyarrow", reason="the spark extra is not installed")
    from pyspark.sql.types import StructType

    from django_sqlqueue.spark.source import SqlQueueDataSource

    cluster = replica_settings
    registered_group()
    pause(cluster)
    urls = cluster.urls()
    before = QueueMessage.objects.using("queue_replica").filter(topic="orders").count()
    sqlqueue.publish("orders", {"n": "after the pause"}, id="spark-after-pause")
    source = SqlQueueDataSource({"url": urls["primary"], "readUrl": urls["replica"],
                                 "topic": "orders"})
    reader = source.reader(StructType())
    ids = [row["id"] for partition in reader.partitions()
           for batch in reader.read(partition) for row in batch.to_pylist()]
    assert len(ids) == before and "spark-after-pause" not in ids  # the replica's view
    # A stream sequences its topics and registers its group: it writes, so it uses url.
    stream = SqlQueueDataSource({"url": urls["primary"], "readUrl": urls["replica"],
                                 "topic": "orders", "group": "spark"}).streamReader(StructType())
    try:
        assert stream.initialOffset() is not None
    finally:
        stream.stop()
    resume(cluster)
    ids = [row["id"] for partition in reader.partitions()
           for batch in reader.read(partition) for row in batch.to_pylist()]
    assert "spark-after-pause" in ids
