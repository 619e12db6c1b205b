"""Partition counts and the sequencer: the topics of ``SQLQUEUE["TOPICS"]`` are recorded by
``migrate`` and by a worker's start, and a topic without a count stalls nothing else.

The worker and a Spark driver run one sequencer (``django_sqlqueue.store.sequencer``), on a
Django connection and on a plain DB-API connection: both are exercised here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.core.management import call_command

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.registry import subscriptions, unregister
from django_sqlqueue.models import Topic
from django_sqlqueue.sequencing import sequence_all
from django_sqlqueue.store import sequencer
from django_sqlqueue.store.connection import Connection, django_connection, open_connection
from django_sqlqueue.worker.process import Worker
from tests.helpers import positions_by_offset
from tests.spark_support import database_url

pytestmark = pytest.mark.django_db(transaction=True)

CONFIGURED = {"orders": 12, "slow": 1, "stuck": 2, "keyed": 1}  # tests/settings.py


@pytest.fixture(params=["django", "db-api"])
def conn(request) -> Iterator[Connection]:  # type: ignore[no-untyped-def]
    """The worker's connection kind, then the Spark driver's."""
    if request.param == "django":
        yield django_connection("default")
        return
    with open_connection(database_url()) as opened:
        yield opened


def recorded() -> dict[str, int]:
    return dict(Topic.objects.values_list("topic", "partitions"))


def test_migrate_records_the_partition_count_of_every_configured_topic():
    Topic.objects.all().delete()
    Topic.objects.create(topic="slow", partitions=5)  # recorded before: it stands

    call_command("migrate", verbosity=0)

    assert recorded() == {**CONFIGURED, "slow": 5}


def test_a_worker_start_records_the_partition_count_of_every_configured_topic():
    Topic.objects.all().delete()

    @sqlqueue.subscriber("unlisted", group="billing")
    def handle(message: sqlqueue.Message) -> None:
        pass

    try:
        registered = [s for s in subscriptions() if s.topic == "unlisted"]
        assert Worker(registered, name="starting", burst=True).run() == 0
    finally:
        unregister("unlisted", "billing")

    assert recorded() == {**CONFIGURED, "unlisted": 4}  # its own: the default count


def test_sequencing_passes_over_a_topic_without_a_partition_count(conn, caplog):
    Topic.objects.filter(topic="unrecorded").delete()
    waiting = sqlqueue.publish_many("unrecorded", [{"payload": n, "key": "u"} for n in range(3)])
    orders = sqlqueue.publish("orders", {"n": 1}, key="k")

    with caplog.at_level(logging.WARNING, logger="django_sqlqueue.sequencer"):
        sequencer._warned.clear()
        done = sequencer.sequence_all(conn, "test")

    assert (done.positioned, done.unpartitioned) == (1, frozenset({"unrecorded"}))
    positions = positions_by_offset()
    assert positions[orders.offset] == 1
    assert [positions[m.offset] for m in waiting] == [None, None, None]
    assert "topic=unrecorded" in caplog.text

    Topic.objects.record({"unrecorded": 2}, "default")
    assert sequencer.sequence_all(conn, "test").positioned == 3
    positions = positions_by_offset()
    assert [positions[m.offset] for m in waiting] == [2, 3, 4]  # in publish order, after


def test_a_full_batch_of_a_topic_without_a_count_does_not_hide_the_rest(conn):
    Topic.objects.filter(topic="unrecorded").delete()
    sqlqueue.publish_many("unrecorded", [{"payload": n} for n in range(sequencer.SEQUENCE_BATCH + 5)])
    orders = sqlqueue.publish_many("orders", [{"payload": n, "key": "k"} for n in range(3)])

    done = sequencer.sequence_all(conn, "test")

    assert done.positioned == 3
    assert [positions_by_offset()[m.offset] for m in orders] == [1, 2, 3]


def test_the_worker_sequences_a_new_topic_with_its_configured_count():
    stored = sqlqueue.publish("brand-new", {"n": 1}, key="k")

    assert sequence_all(sequenced_by="test") == 1

    assert recorded()["brand-new"] == 4  # SQLQUEUE["PARTITIONS"] in the test settings
    assert positions_by_offset()[stored.offset] == 1
