"""Migration 0006: groups known only by heartbeat rows become registered groups that GC waits for."""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import ConsumerOffset, QueueMessage, SubscriberHeartbeat, Topic
from django_sqlqueue.sequencing import sequence_all
from django_sqlqueue.worker.collector import collect_garbage

pytestmark = pytest.mark.django_db

migration = import_module("django_sqlqueue.migrations.0006_register_heartbeat_groups")


def run_migration() -> None:
    # The function reads only ``schema_editor.connection`` (and SQLite refuses a real
    # schema editor inside the test's transaction).
    migration.register_heartbeat_groups(apps, SimpleNamespace(connection=connection))


def watermarks(group: str, topic: str) -> dict[str, int]:
    return dict(ConsumerOffset.objects.filter(consumer_group=group, topic=topic)
                .values_list("partition_key", "offset_acked"))


def test_a_group_known_only_by_heartbeats_gets_a_watermark_on_every_partition():
    sqlqueue.publish("orders", {"n": 1}, key="k")
    sequence_all()  # records orders' partition count (12)
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic="orders",
                                       subscriber_name="old-host:1", heartbeat_at=1)
    ConsumerOffset.objects.create(consumer_group="billing", topic="orders", partition_key="3",
                                  offset_acked=42)

    run_migration()

    marks = watermarks("billing", "orders")
    assert sorted(marks, key=int) == [str(n) for n in range(12)]
    assert marks["3"] == 42  # an existing watermark is kept
    assert {v for p, v in marks.items() if p != "3"} == {0}


def test_a_topic_without_a_partition_count_and_a_second_run_change_nothing():
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic="never-published",
                                       subscriber_name="old-host:1", heartbeat_at=1)
    assert not Topic.objects.filter(topic="never-published").exists()

    run_migration()
    run_migration()

    assert watermarks("billing", "never-published") == {}


def test_after_the_upgrade_gc_waits_for_a_group_whose_workers_are_down():
    sqlqueue.publish_many("orders", [{"payload": n, "key": "k"} for n in range(5)])
    sequence_all()
    head = QueueMessage.objects.filter(topic="orders").order_by("-position")[0].position
    # ledger consumed everything; audit's workers ran once (heartbeat) and are down now.
    for n in range(12):
        ConsumerOffset.objects.create(consumer_group="ledger", topic="orders",
                                      partition_key=str(n), offset_acked=head)
    SubscriberHeartbeat.objects.create(consumer_group="audit", topic="orders",
                                       subscriber_name="old-host:2", heartbeat_at=1,
                                       deregistered_at=2)

    run_migration()

    assert collect_garbage(["orders"], {}, "default") == 0
    assert QueueMessage.objects.filter(topic="orders").count() == 5
