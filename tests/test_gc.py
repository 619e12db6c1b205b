"""Garbage collection deletes only what every consumer group has acked past."""

from __future__ import annotations

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import ConsumerOffset, QueueMessage, SubscriberHeartbeat
from django_sqlqueue.partitioning import partition_for
from django_sqlqueue.sequencing import sequence_all
from django_sqlqueue.worker.collector import collect_garbage

pytestmark = pytest.mark.django_db


def publish_sequenced(count: int, key: str = "k") -> list[int]:
    """Publish ``count`` messages to "orders"/key; return their positions, in order."""
    offsets = [m.offset for m in sqlqueue.publish_many(
        "orders", [{"payload": n, "key": key} for n in range(count)])]
    sequence_all()
    positions = dict(QueueMessage.objects.filter(offset__in=offsets)
                     .values_list("offset", "position"))
    return [positions[o] for o in offsets]


def partition(key: str) -> str:
    """The partition of "orders" that ``key`` maps to (12 partitions in the test settings)."""
    return str(partition_for(key, 12))


def set_watermark(group: str, key: str, position: int) -> None:
    SubscriberHeartbeat.objects.update_or_create(
        consumer_group=group, topic="orders", subscriber_name=f"{group}-worker",
        defaults={"heartbeat_at": 1})
    ConsumerOffset.objects.update_or_create(
        consumer_group=group, topic="orders", partition_key=partition(key),
        defaults={"offset_acked": position, "updated_at": 1})


def remaining(key: str = "k") -> list[int]:
    return sorted(QueueMessage.objects.filter(topic="orders", message_key=key)
                  .values_list("position", flat=True))


def test_gc_deletes_up_to_the_lowest_watermark_of_all_groups():
    positions = publish_sequenced(10)
    set_watermark("billing", "k", positions[7])
    set_watermark("shipping", "k", positions[3])

    deleted = collect_garbage(["orders"], {}, "default")

    assert deleted == 4
    assert remaining() == positions[4:]


def test_gc_keeps_a_partition_that_a_known_group_has_not_started():
    positions = publish_sequenced(5)
    set_watermark("billing", "k", positions[-1])
    # shipping consumes the topic (a registered worker) but has no watermark for "k" yet.
    set_watermark("shipping", "other", 0)

    assert collect_garbage(["orders"], {}, "default") == 0
    assert remaining() == positions


def test_gc_counts_the_groups_a_worker_is_configured_for_even_before_they_register():
    positions = publish_sequenced(5)
    set_watermark("billing", "k", positions[-1])

    assert collect_garbage(["orders"], {"orders": {"billing", "audit"}}, "default") == 0
    assert collect_garbage(["orders"], {"orders": {"billing"}}, "default") == 5
    assert remaining() == []


def test_gc_never_deletes_unsequenced_messages_or_dead_letters():
    positions = publish_sequenced(3)
    late = sqlqueue.publish("orders", {"late": True}, key="k")  # committed, not sequenced yet
    dead = sqlqueue.publish("orders_dlq", {"dead": True}, key="k")
    set_watermark("billing", "k", positions[-1])

    assert collect_garbage(["orders"], {}, "default") == 3
    assert list(QueueMessage.objects.values_list("offset", flat=True).order_by("offset")) == [
        late.offset, dead.offset]


def test_gc_skips_partitions_whose_horizon_it_already_collected():
    positions = publish_sequenced(4)
    set_watermark("billing", "k", positions[1])
    collected: dict[tuple[str, str], int] = {}

    assert collect_garbage(["orders"], {}, "default", collected) == 2
    assert collected == {("orders", partition("k")): positions[1]}
    set_watermark("billing", "k", positions[3])
    assert collect_garbage(["orders"], {}, "default", collected) == 2
    assert remaining() == []
