"""Garbage collection deletes only what every consumer group has acked past."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.message import Message
from django_sqlqueue.consuming.registry import subscriptions, unregister
from django_sqlqueue.exceptions import TopicNotDrained
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
)
from django_sqlqueue.operations.stats import overview
from django_sqlqueue.partitioning import partition_for
from django_sqlqueue.repartition import repartition
from django_sqlqueue.sequencing import sequence_all
from django_sqlqueue.worker.collector import GarbageCollector, collect_garbage
from django_sqlqueue.worker.process import Worker
from tests.worker_harness import end_sessions, other_sessions, wait_until

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
        defaults={"offset_acked": position, "updated_at": int(time.time() * 1000)})


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


# --------------------------------------------------------------------------- registration


DAY_MS = 86_400_000


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_registered_group_whose_workers_are_all_gone_still_holds_gc_back():
    positions = publish_sequenced(5)
    set_watermark("billing", "k", positions[-1])
    set_watermark("shipping", "k", positions[1])
    SubscriberHeartbeat.objects.all().delete()  # no worker of any group left, rows pruned

    assert collect_garbage(["orders"], {}, "default", retention=7 * 86400) == 2
    assert remaining() == positions[2:]


def test_a_group_silent_for_longer_than_the_retention_stops_holding_gc_back(caplog):
    positions = publish_sequenced(5)
    set_watermark("billing", "k", positions[-1])
    set_watermark("shipping", "k", positions[0])
    # shipping's last ack and last heartbeat: two days ago.
    ConsumerOffset.objects.filter(consumer_group="shipping").update(updated_at=now_ms() - 2 * DAY_MS)
    retired: set[tuple[str, str]] = set()

    with caplog.at_level(logging.WARNING, logger="django_sqlqueue.worker"):
        assert collect_garbage(["orders"], {}, "default", retention=86400,
                               retired=retired) == 5
    assert retired == {("shipping", "orders")}
    assert "consumer group shipping of topic orders has had no worker and no ack" in caplog.text
    # A heartbeat within the retention keeps it counted.
    more = publish_sequenced(2)
    SubscriberHeartbeat.objects.filter(consumer_group="shipping").update(heartbeat_at=now_ms())
    set_watermark("billing", "k", more[-1])
    assert collect_garbage(["orders"], {}, "default", retention=86400) == 0


def test_pruning_heartbeats_keeps_each_groups_newest_row_and_what_gc_waits_for():
    positions = publish_sequenced(3)
    set_watermark("billing", "k", positions[-1])
    set_watermark("shipping", "k", positions[0])
    old = now_ms() - 2 * DAY_MS
    SubscriberHeartbeat.objects.all().delete()
    for n in range(50):  # 50 restarts of shipping's worker under host:pid names
        SubscriberHeartbeat.objects.create(consumer_group="shipping", topic="orders",
                                           subscriber_name=f"host:{n}", heartbeat_at=old + n,
                                           deregistered_at=old + n)

    assert SubscriberHeartbeat.objects.prune(now_ms() - 3_600_000, "default") == 49
    [kept] = SubscriberHeartbeat.objects.values_list("subscriber_name", flat=True)
    assert kept == "host:49"
    # shipping's workers are gone and pruned, but the group still holds GC at its watermark.
    assert collect_garbage(["orders"], {}, "default", retention=7 * 86400) == 1
    assert remaining() == positions[1:]


@pytest.mark.skipif(connection.vendor != "mysql", reason="reads MariaDB's EXPLAIN")
# ANALYZE TABLE commits the test's transaction on MariaDB, so the rows would outlive a
# rolled-back test: a transactional test empties the tables afterwards instead.
@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_queries_use_an_index():
    SubscriberHeartbeat.objects.bulk_create(
        SubscriberHeartbeat(consumer_group=f"g{n % 20}", topic=f"t{n % 50}",
                            subscriber_name=f"host:{n}", heartbeat_at=n, deregistered_at=n)
        for n in range(5000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE queue_subscriber_heartbeats")
        cursor.fetchall()
    live = SubscriberHeartbeat.objects.filter(
        topic__in=["t1", "t2"], deregistered_at=0, heartbeat_at__gt=100)
    named = SubscriberHeartbeat.objects.filter(subscriber_name="host:7", deregistered_at=0,
                                               heartbeat_at__gt=100)
    for queryset in (live, named):
        plan = queryset.explain()
        assert "ALL" not in plan.split(), plan


# --------------------------------------------------------------------------- forget


def forget(*args: str) -> str:
    out = io.StringIO()
    call_command("sqlqueue", "forget", *args, stdout=out)
    return out.getvalue().strip()


def test_forgetting_a_group_lets_gc_collect_what_only_it_still_needed():
    positions = publish_sequenced(4)
    set_watermark("billing", "k", positions[-1])
    set_watermark("shipping", "k", positions[0])
    SubscriberHeartbeat.objects.filter(consumer_group="shipping").update(deregistered_at=5)
    DeliveryState.objects.create(consumer_group="shipping", topic="orders",
                                 partition_key=partition("k"), message_offset=1)
    PartitionLease.objects.create(consumer_group="shipping", topic="orders",
                                  partition_key=partition("k"))
    assert collect_garbage(["orders"], {}, "default") == 1

    line = forget("--group", "shipping", "--topic", "orders")

    assert line == ("forgot consumer group 'shipping' on 'orders': 1 watermark(s), "
                    "1 delivery row(s), 1 lease(s), 1 heartbeat(s) deleted")
    assert not ConsumerOffset.objects.filter(consumer_group="shipping").exists()
    assert collect_garbage(["orders"], {}, "default") == 3
    assert remaining() == []


def test_forget_refuses_while_a_worker_of_the_group_runs():
    set_watermark("shipping", "k", 0)
    SubscriberHeartbeat.objects.filter(consumer_group="shipping").update(
        heartbeat_at=now_ms() + 60_000)  # alive by any clock

    with pytest.raises(CommandError) as caught:
        forget("--group", "shipping")
    assert caught.value.returncode == 2
    assert str(caught.value) == ("consumer group 'shipping' has 1 running worker(s) "
                                 "(shipping-worker); stop them first")
    assert ConsumerOffset.objects.filter(consumer_group="shipping").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--group", "nobody"], "consumer group 'nobody' has no state to forget"),
    (["--group", "billing", "--topic", "nope"],
     "consumer group 'billing' has no state for topic 'nope' to forget"),
    (["--group", " "], "--group and --topic must not be empty"),
])
def test_forget_with_nothing_to_forget_is_one_line(args, message):
    set_watermark("billing", "k", 0)
    with pytest.raises(CommandError) as caught:
        forget(*args)
    assert caught.value.returncode == 2
    assert str(caught.value) == message


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no sessions to end")
@pytest.mark.django_db(transaction=True)
def test_gc_goes_on_collecting_after_its_connection_was_lost():
    """A database restart ends the GC thread's session: it must open a new one."""
    collector = GarbageCollector(["orders"], {}, "default", interval=0.1, retention=None)
    set_watermark("billing", "k", publish_sequenced(3)[-1])
    collector.start()
    try:
        wait_until(lambda: not remaining(), what="the first collection")
        assert end_sessions(other_sessions()) == 1  # the GC thread's
        set_watermark("billing", "k", publish_sequenced(3)[-1])
        wait_until(lambda: not remaining(), timeout=10,
                   what="a collection after the connection was lost")
    finally:
        collector.stop()


# ----------------------------------------------------------------- waiting messages

def drain_keyed(publish_first: Callable[[], None], handler: Callable[[Message], None]) -> None:
    """Publish with ``publish_first``, then 2,000 messages of other keys to "keyed" (one
    partition), and drain it with a burst worker of group "g3" running ``handler``."""
    sqlqueue.subscriber("keyed", group="g3", backoff=sqlqueue.ExponentialBackoff(base=0.05))(
        handler)
    subs = [s for s in subscriptions() if (s.topic, s.group) == ("keyed", "g3")]
    try:
        publish_first()
        for start in range(0, 2000, 500):
            sqlqueue.publish_many("keyed", [{"payload": n, "key": f"k{n}"}
                                            for n in range(start, start + 500)])
        assert Worker(subs, name="burst", burst=True).run() == 0
    finally:
        unregister("keyed", "g3")


@pytest.mark.django_db(transaction=True)
def test_a_message_delayed_a_year_leaves_only_itself_and_its_row_after_a_drain_and_gc():
    late: list[int] = []
    drain_keyed(lambda: late.append(sqlqueue.publish(
        "keyed", {"remind": "next year"}, key="late", delay=365 * 86400).offset),
        lambda message: None)

    assert collect_garbage(["keyed"], {"keyed": {"g3"}}, "default") == 2000
    assert list(QueueMessage.objects.filter(topic="keyed").values_list("offset", flat=True)) \
        == late
    assert list(DeliveryState.objects.filter(topic="keyed").values_list(
        "message_offset", "acked", "parked")) == [(late[0], False, 1)]


@pytest.mark.django_db(transaction=True)
def test_a_parked_message_counts_as_lag_and_keeps_its_topic_from_being_repartitioned():
    drain_keyed(lambda: sqlqueue.publish("keyed", {}, key="late", delay=86400),
                lambda message: None)

    row = overview(topic="keyed", group="g3")[0]
    assert row.lag == 1
    with pytest.raises(TopicNotDrained):
        repartition("keyed", 2)
    assert QueueMessage.objects.filter(topic="keyed", message_key="late").exists()


@pytest.mark.django_db(transaction=True)
def test_a_retry_backing_off_for_days_leaves_only_itself_and_its_row_after_a_drain_and_gc():
    def handler(message: Message) -> None:
        if message.key == "flaky":
            raise sqlqueue.Retry(delay=3 * 86400, reason="try again in three days")

    flaky: list[int] = []
    drain_keyed(lambda: flaky.append(sqlqueue.publish("keyed", {}, key="flaky").offset), handler)

    assert collect_garbage(["keyed"], {"keyed": {"g3"}}, "default") == 2000
    assert list(QueueMessage.objects.filter(topic="keyed").values_list("offset", flat=True)) \
        == flaky
    row = DeliveryState.objects.get(topic="keyed")
    assert (row.message_offset, row.acked, row.parked, row.retry_count) == (flaky[0], False, 1, 0)
    assert row.last_error.endswith("try again in three days")


def test_gc_keeps_a_message_any_group_has_parked_and_collects_it_once_acked():
    positions = publish_sequenced(3)
    waiting = QueueMessage.objects.get(topic="orders", position=positions[1])
    for group in ("billing", "shipping"):
        set_watermark(group, "k", positions[-1])
    park(waiting, "shipping")

    assert collect_garbage(["orders"], {}, "default") == 2
    assert remaining() == [positions[1]]
    assert collect_garbage(["orders"], {}, "default") == 0  # still waiting

    DeliveryState.objects.filter(message_offset=waiting.offset).update(acked=True)
    assert collect_garbage(["orders"], {}, "default") == 1
    assert remaining() == []
    assert not DeliveryState.objects.exists()  # the acked parked row goes with it


def test_gc_keeps_an_acked_parked_message_another_group_has_not_passed():
    positions = publish_sequenced(3)
    waiting = QueueMessage.objects.get(topic="orders", position=positions[1])
    set_watermark("billing", "k", positions[-1])
    set_watermark("shipping", "k", positions[0])
    park(waiting, "billing", acked=True)

    assert collect_garbage(["orders"], {}, "default") == 1  # positions[0] only
    assert remaining() == positions[1:]
    set_watermark("shipping", "k", positions[-1])
    assert collect_garbage(["orders"], {}, "default") == 2
    assert remaining() == []
    assert not DeliveryState.objects.exists()


def park(message: QueueMessage, group: str, acked: bool = False) -> None:
    DeliveryState.objects.create(
        consumer_group=group, topic=message.topic, partition_key=message.partition_key,
        message_offset=message.offset, acked=acked, invisible_until=2**40, retry_count=-1,
        parked=1, message_key=message.message_key, message_position=message.position or 0)
