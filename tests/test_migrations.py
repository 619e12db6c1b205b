"""The tables: migrations match the models, names, keys and indexes, and the models' rows."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from django_sqlqueue.models import (
    ArchiveMark,
    Cancellation,
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    Schedule,
    SubscriberHeartbeat,
    TaskResultRecord,
    Throughput,
    Topic,
)
from tests.factories import (
    ConsumerOffsetFactory,
    DeliveryStateFactory,
    LogSequencerFactory,
    PartitionLeaseFactory,
    QueueMessageFactory,
    SubscriberHeartbeatFactory,
)

pytestmark = pytest.mark.django_db

TABLES = {
    "queue_messages": QueueMessage,
    "queue_delivery_state": DeliveryState,
    "queue_partition_leases": PartitionLease,
    "queue_offsets": ConsumerOffset,
    "queue_subscriber_heartbeats": SubscriberHeartbeat,
    "queue_sequencer": LogSequencer,
    "queue_topics": Topic,
    "queue_group_controls": GroupControl,
    "queue_throughput": Throughput,
    "queue_task_results": TaskResultRecord,
    "queue_archive": ArchiveMark,
    "queue_cancellations": Cancellation,
    "queue_schedules": Schedule,
}


def constraints(table: str) -> dict[str, dict]:
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, table)


def primary_key_columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        return connection.introspection.get_primary_key_columns(cursor, table)


def column_names(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


# --------------------------------------------------------------------------- migrations


def test_no_migrations_are_missing():
    out = StringIO()

    call_command("makemigrations", "django_sqlqueue", "--check", "--dry-run", stdout=out)

    assert "No changes detected" in out.getvalue()


def test_all_twelve_tables_exist():
    assert set(TABLES) <= set(connection.introspection.table_names())


@pytest.mark.parametrize(("table", "model"), TABLES.items(), ids=list(TABLES))
def test_model_uses_its_table(table, model):
    assert model._meta.db_table == table


def test_idempotency_id_is_stored_in_the_id_column():
    assert {"offset", "topic", "partition_key", "message_key", "id", "position",
            "deliver_at"} <= column_names("queue_messages")


def test_unique_index_on_topic_message_key_and_id_exists():
    unique = [
        (name, info["columns"]) for name, info in constraints("queue_messages").items()
        if info["unique"] and not info["primary_key"]
    ]

    assert unique == [("queue_msg_key_idempotency", ["topic", "message_key", "id"])]


def test_the_database_enforces_the_idempotency_index():
    QueueMessageFactory(topic="orders", message_key="k", message_id="same")

    with pytest.raises(IntegrityError), transaction.atomic():
        QueueMessageFactory(topic="orders", message_key="k", message_id="same")


def test_one_partition_may_hold_the_same_id_under_two_keys():
    QueueMessageFactory(topic="orders", partition_key="3", message_key="a", message_id="same")
    QueueMessageFactory(topic="orders", partition_key="3", message_key="b", message_id="same")

    assert QueueMessage.objects.filter(topic="orders", partition_key="3").count() == 2


@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("queue_msg_partition", ["topic", "partition_key", "offset"]),
        ("queue_msg_position", ["topic", "partition_key", "position"]),
        ("queue_msg_sequencing", ["position", "offset"]),
    ],
)
def test_message_index_exists(name, columns):
    info = constraints("queue_messages").get(name)

    assert info is not None, f"index {name} is missing"
    assert info["columns"] == columns


@pytest.mark.parametrize(
    ("table", "columns"),
    [
        ("queue_messages", ["offset"]),
        ("queue_delivery_state", ["consumer_group", "topic", "partition_key", "message_offset"]),
        ("queue_partition_leases", ["consumer_group", "topic", "partition_key"]),
        ("queue_offsets", ["consumer_group", "topic", "partition_key"]),
        ("queue_subscriber_heartbeats", ["consumer_group", "topic", "subscriber_name"]),
        ("queue_sequencer", ["name"]),
    ],
)
def test_primary_key_columns(table, columns):
    assert primary_key_columns(table) == columns


# --------------------------------------------------------------------------- factories and rows


@pytest.mark.parametrize(
    "factory",
    [
        QueueMessageFactory,
        DeliveryStateFactory,
        PartitionLeaseFactory,
        ConsumerOffsetFactory,
        SubscriberHeartbeatFactory,
        LogSequencerFactory,
    ],
    ids=lambda factory: factory._meta.model.__name__,
)
def test_factory_row_reads_back_by_primary_key(factory):
    obj = factory()
    model = factory._meta.model

    assert model.objects.get(pk=obj.pk) == obj


def test_composite_primary_key_rows_differ_by_any_key_column():
    DeliveryStateFactory(consumer_group="g", topic="t", partition_key="p", message_offset=1)
    DeliveryStateFactory(consumer_group="g", topic="t", partition_key="p", message_offset=2)
    DeliveryStateFactory(consumer_group="g", topic="t", partition_key="q", message_offset=1)
    DeliveryStateFactory(consumer_group="h", topic="t", partition_key="p", message_offset=1)

    assert DeliveryState.objects.filter(topic="t").count() == 4


def test_composite_primary_key_rejects_a_duplicate():
    PartitionLeaseFactory(consumer_group="g", topic="t", partition_key="p")

    with pytest.raises(IntegrityError), transaction.atomic():
        PartitionLeaseFactory(consumer_group="g", topic="t", partition_key="p")


def test_message_payload_keeps_json_types():
    message = QueueMessageFactory(payload={"list": [1, 2.5, None, True], "text": "Zoë"})

    assert QueueMessage.objects.get(offset=message.offset).payload == {
        "list": [1, 2.5, None, True], "text": "Zoë"
    }


def test_message_columns_hold_epoch_milliseconds():
    value = 4_102_444_800_000  # 2100-01-01 in ms: needs a 64-bit column
    message = QueueMessageFactory(created_at=value, published_at=value, deliver_at=value)

    assert QueueMessage.objects.get(offset=message.offset).deliver_at == value


def test_new_message_row_defaults_to_unsequenced_and_not_a_dead_letter():
    message = QueueMessageFactory()
    row = QueueMessage.objects.get(offset=message.offset)

    assert row.position is None
    assert (row.failed_at, row.failure_count, row.original_offset, row.consumer_group) == (
        0, 0, 0, ""
    )


@pytest.mark.parametrize(
    ("factory", "kwargs", "expected"),
    [
        (QueueMessageFactory, {"topic": "orders", "partition_key": "3", "message_key": "eu"},
         "orders/3/eu@{offset}"),
        (DeliveryStateFactory,
         {"consumer_group": "billing", "topic": "orders", "partition_key": "eu",
          "message_offset": 12},
         "billing:orders/eu@12"),
        (PartitionLeaseFactory,
         {"consumer_group": "billing", "topic": "orders", "partition_key": "eu",
          "leased_by": "host-1:42"},
         "billing:orders/eu -> host-1:42"),
        (PartitionLeaseFactory,
         {"consumer_group": "billing", "topic": "orders", "partition_key": "eu", "leased_by": ""},
         "billing:orders/eu -> -"),
        (ConsumerOffsetFactory,
         {"consumer_group": "billing", "topic": "orders", "partition_key": "eu",
          "offset_acked": 99},
         "billing:orders/eu = 99"),
        (SubscriberHeartbeatFactory,
         {"consumer_group": "billing", "topic": "orders", "subscriber_name": "host-1:42"},
         "billing:orders host-1:42"),
        (LogSequencerFactory, {"name": "default", "last_position": 314}, "default @ 314"),
    ],
    ids=["message", "delivery", "lease", "free-lease", "offset", "heartbeat", "sequencer"],
)
def test_model_str(factory, kwargs, expected):
    obj = factory(**kwargs)

    assert str(obj) == expected.format(offset=getattr(obj, "offset", ""))
