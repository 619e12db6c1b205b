"""Changing a topic's partition count: only once it is drained, in one transaction.

"orders" has 12 partitions in the test settings, other topics 4. A consumer group is
registered for a topic by its watermark rows (or, for older data, a heartbeat row), and its
progress is its watermarks.
"""

from __future__ import annotations

import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue import TopicNotDrained
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
    Topic,
)
from django_sqlqueue.partitioning import assign_partition, partition_names
from django_sqlqueue.repartition import RepartitionResult, repartition
from django_sqlqueue.sequencing import sequence_all, sequence_pending
from tests.helpers import outcomes, start_thread
from tests.worker_harness import partition_heads, run_manage, wait_until

pytestmark = pytest.mark.django_db

needs_row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no row locks: its single writer serializes every transaction",
)


# --------------------------------------------------------------------------- helpers


def publish_sequenced(topic: str = "orders", count: int = 6) -> list[int]:
    """Publish ``count`` messages with distinct keys and sequence them; return offsets."""
    offsets = [m.offset for m in sqlqueue.publish_many(
        topic, [{"payload": n, "key": f"key-{n}"} for n in range(count)])]
    sequence_all()
    return offsets


def register(group: str, topic: str = "orders") -> None:
    SubscriberHeartbeat.objects.create(consumer_group=group, topic=topic,
                                       subscriber_name=f"{group}-worker", heartbeat_at=1)


def set_watermark(group: str, topic: str, partition: str, position: int) -> None:
    ConsumerOffset.objects.update_or_create(
        consumer_group=group, topic=topic, partition_key=partition,
        defaults={"offset_acked": position, "offset_fetched": position, "updated_at": 1})


def consume_all(group: str, topic: str = "orders") -> None:
    """Register ``group`` and move its watermark past every sequenced message, with the
    lease and offset rows a worker would have for every partition of the topic."""
    register(group, topic)
    count = Topic.objects.partition_counts([topic], "default")[topic]
    PartitionLease.objects.ensure_partitions(group, topic, partition_names(count), "default")
    ConsumerOffset.objects.ensure(group, topic, partition_names(count), "default")
    for partition, head in partition_heads(topic).items():
        set_watermark(group, topic, partition, head)


def recorded(topic: str) -> int | None:
    return Topic.objects.partition_counts([topic], "default").get(topic)


def partitions_of(model: type, group: str, topic: str = "orders") -> set[str]:
    return set(model.objects.filter(consumer_group=group, topic=topic)
               .values_list("partition_key", flat=True))


# --------------------------------------------------------------------------- repartition()


def test_a_topic_without_a_record_just_gets_the_count_recorded():
    result = repartition("fresh", 7)

    assert result == RepartitionResult("fresh", None, 7, 0)
    assert recorded("fresh") == 7
    # The record wins over the configured default (4) when the topic is first sequenced.
    offset = sqlqueue.publish("fresh", {}, key="abc").offset
    sequence_all()
    assert QueueMessage.objects.get(offset=offset).partition_key == assign_partition("abc", offset, 7)


def test_the_same_count_changes_nothing():
    offsets = publish_sequenced()  # records 12, and nobody has consumed the messages

    result = repartition("orders", 12)

    assert result == RepartitionResult("orders", 12, 12, 0)
    assert not result.changed
    assert recorded("orders") == 12
    assert QueueMessage.objects.filter(offset__in=offsets).count() == len(offsets)


def test_refused_while_a_registered_group_has_unconsumed_messages():
    publish_sequenced(count=6)
    consume_all("billing")
    consume_all("shipping")
    heads = partition_heads("orders")
    behind = sorted(heads)[0]
    set_watermark("shipping", "orders", behind, 0)  # shipping has not consumed that partition
    unconsumed = QueueMessage.objects.filter(topic="orders", partition_key=behind).count()
    register("audit")  # registered, no watermarks at all: every message is unconsumed for it

    with pytest.raises(TopicNotDrained) as caught:
        repartition("orders", 6)

    assert caught.value.unconsumed == {"audit": 6, "shipping": unconsumed}
    message = str(caught.value)
    assert message.startswith("topic 'orders' is not drained: ")
    assert "group 'audit' has 6 unconsumed message(s)" in message
    assert f"group 'shipping' has {unconsumed} unconsumed message(s)" in message
    assert "billing" not in message
    assert "repartition again" in message and "\n" not in message
    # Nothing changed.
    assert recorded("orders") == 12
    assert QueueMessage.objects.filter(topic="orders").count() == 6
    assert partitions_of(PartitionLease, "billing") == set(partition_names(12))


def test_refused_for_a_group_whose_heartbeats_were_pruned_but_whose_watermarks_remain():
    publish_sequenced(count=3)
    count = Topic.objects.partition_counts(["orders"], "default")["orders"]
    ConsumerOffset.objects.ensure("audit", "orders", partition_names(count), "default")
    assert not SubscriberHeartbeat.objects.exists()

    with pytest.raises(TopicNotDrained) as caught:
        repartition("orders", 6)

    assert caught.value.unconsumed == {"audit": 3}
    assert recorded("orders") == 12


def test_refused_when_messages_wait_and_no_group_has_registered():
    publish_sequenced(count=3)

    with pytest.raises(TopicNotDrained) as caught:
        repartition("orders", 6)

    assert caught.value.unclaimed == 3
    assert str(caught.value).startswith(
        "topic 'orders' is not drained: 3 message(s) wait for a consumer and no consumer group "
        "has registered for the topic;")
    assert recorded("orders") == 12
    assert QueueMessage.objects.filter(topic="orders").count() == 3


def test_a_drained_topic_shrinks_and_loses_its_consumed_messages_and_removed_partitions():
    offsets = publish_sequenced(count=30)
    other = publish_sequenced("payments", count=5)  # another topic, not drained
    for group in ("billing", "shipping"):
        consume_all(group)
        DeliveryState.objects.create(consumer_group=group, topic="orders", partition_key="3",
                                     message_offset=offsets[0], acked=True)
    PartitionLease.objects.filter(topic="orders", partition_key="9").update(leased_by="w1")
    PartitionLease.objects.ensure_partitions("billing", "payments", ["3", "9"], "default")
    DeliveryState.objects.create(consumer_group="billing", topic="payments", partition_key="3",
                                 message_offset=other[0])
    kept_watermarks = dict(ConsumerOffset.objects.filter(
        consumer_group="billing", topic="orders", partition_key__in=partition_names(5),
    ).values_list("partition_key", "offset_acked"))

    result = repartition("orders", 5)

    assert result == RepartitionResult("orders", 12, 5, 30)
    assert result.changed
    assert recorded("orders") == 5
    assert not QueueMessage.objects.filter(topic="orders").exists()
    assert not DeliveryState.objects.filter(topic="orders").exists()
    for group in ("billing", "shipping"):
        assert partitions_of(PartitionLease, group) == set(partition_names(5))
        assert partitions_of(ConsumerOffset, group) == set(partition_names(5))
    # Watermarks of the remaining partitions are log positions: they stay.
    assert dict(ConsumerOffset.objects.filter(consumer_group="billing", topic="orders")
                .values_list("partition_key", "offset_acked")) == kept_watermarks
    # Other topics are untouched.
    assert QueueMessage.objects.filter(offset__in=other).count() == 5
    assert partitions_of(PartitionLease, "billing", "payments") == {"3", "9"}
    assert DeliveryState.objects.filter(topic="payments").count() == 1
    assert recorded("payments") == 4


def test_a_drained_topic_grows_and_keeps_its_lease_and_offset_rows():
    publish_sequenced("events", count=4)
    consume_all("billing", "events")

    assert repartition("events", 8) == RepartitionResult("events", 4, 8, 4)

    assert recorded("events") == 8
    assert partitions_of(PartitionLease, "billing", "events") == set(partition_names(4))
    assert partitions_of(ConsumerOffset, "billing", "events") == set(partition_names(4))


def test_messages_published_after_the_change_map_with_the_new_count():
    publish_sequenced(count=10)
    consume_all("billing")
    last_position = LogSequencer.objects.get(name="default").last_position

    repartition("orders", 5)
    stored = sqlqueue.publish_many("orders", [{"payload": n, "key": f"key-{n}"} for n in range(10)]
                                   + [{"payload": "keyless"}])
    sequence_all()

    rows = {row.offset: row for row in QueueMessage.objects.filter(topic="orders")}
    assert set(rows) == {m.offset for m in stored}
    for message in stored:
        assert rows[message.offset].partition_key == assign_partition(message.key, message.offset, 5)
        assert rows[message.offset].position > last_position


def test_messages_unsequenced_at_the_change_are_kept_and_get_the_new_mapping():
    publish_sequenced(count=4)
    consume_all("billing")
    waiting = sqlqueue.publish_many("orders", [{"payload": n, "key": f"late-{n}"} for n in range(8)])

    assert repartition("orders", 3).deleted_messages == 4

    rows = QueueMessage.objects.filter(topic="orders")
    assert {(row.offset, row.position, row.partition_key) for row in rows} == {
        (m.offset, None, "") for m in waiting}
    sequence_all()
    for message in waiting:
        assert (QueueMessage.objects.get(offset=message.offset).partition_key
                == assign_partition(message.key, message.offset, 3))


def test_only_unsequenced_messages_and_no_group_is_drained():
    publish_sequenced(count=1)
    consume_all("billing")
    repartition("orders", 6)
    SubscriberHeartbeat.objects.all().delete()  # no group registered any more
    sqlqueue.publish("orders", {}, key="k")  # committed, not sequenced

    assert repartition("orders", 2) == RepartitionResult("orders", 6, 2, 0)


@pytest.mark.parametrize("partitions", [0, -1, 4097, True, "3", 2.0])
def test_bad_partition_counts_are_refused(partitions):
    with pytest.raises(ValueError, match=r"partitions must be a whole number from 1 to 4096, got "):
        repartition("orders", partitions)
    assert recorded("orders") == 12  # as migrate recorded it from SQLQUEUE["TOPICS"]


def test_a_bad_topic_name_is_refused():
    with pytest.raises(ValueError, match="contains ' '"):
        repartition("bad topic", 3)


# --------------------------------------------------------------------------- the sequencer lock


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_repartition_waits_for_a_running_sequencer_and_stops_sequencing_while_it_runs():
    publish_sequenced(count=2)
    consume_all("billing")
    locked, release = threading.Event(), threading.Event()

    def busy_sequencer() -> int | None:
        with transaction.atomic():
            position = LogSequencer.objects.lock_counter(connection.alias)
            locked.set()
            release.wait(5)
        return position

    thread = start_thread(busy_sequencer, name="busy-sequencer")
    assert locked.wait(10)
    timer = threading.Timer(0.5, release.set)
    timer.start()
    started = time.monotonic()
    try:
        result = repartition("orders", 6)
    finally:
        release.set()
        timer.cancel()
    assert time.monotonic() - started >= 0.4  # it waited instead of skipping
    assert outcomes([thread]) == [2]
    assert result == RepartitionResult("orders", 12, 6, 2)

    # And while a repartition holds the counter, sequencers skip instead of mapping.
    offset = sqlqueue.publish("orders", {}, key="k").offset
    locked.clear()
    release.clear()

    def repartitioner() -> int:
        with transaction.atomic():
            position = LogSequencer.objects.lock_counter_wait(connection.alias)
            locked.set()
            release.wait(5)
        return position

    thread = start_thread(repartitioner, name="repartitioner")
    try:
        assert locked.wait(10)
        assert sequence_pending() == 0
    finally:
        release.set()
    assert outcomes([thread]) == [2]
    assert QueueMessage.objects.get(offset=offset).position is None


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_repartition_deletes_in_short_transactions_holding_no_lease_row_or_the_sequencer(
        monkeypatch):
    """While it deletes the consumed messages, the new count is recorded, the removed
    partitions' lease and watermark rows are gone and the sequencer runs: a worker waits
    for none of them. Here a message row held elsewhere stops the deletes meanwhile."""
    from django.db import connections

    import django_sqlqueue.repartition as module

    offsets = publish_sequenced(count=30)
    consume_all("billing")
    monkeypatch.setattr(module, "DELETE_BATCH", 10)
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    q = holder.ops.quote_name
    with holder.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {q('queue_messages')} WHERE {q('offset')} = %s FOR UPDATE",
                       [min(offsets)])
    thread = start_thread(repartition, "orders", 3, name="repartition")
    try:
        wait_until(lambda: recorded("orders") == 3 and (
            partitions_of(PartitionLease, "billing") == set(partition_names(3))
            == partitions_of(ConsumerOffset, "billing")),
            timeout=10, what="the new count and the removed partitions' rows committed")
        fresh = sqlqueue.publish("orders", {}, key="k")
        assert sequence_pending() == 1  # the sequencer is not held
        assert QueueMessage.objects.get(offset=fresh.offset).partition_key == assign_partition(
            "k", fresh.offset, 3)
        assert thread.is_alive()  # still waiting for the held row
    finally:
        holder.rollback()
        holder.close()
    assert outcomes([thread]) == [RepartitionResult("orders", 12, 3, 30)]
    # Only what was consumed at the change is deleted.
    assert list(QueueMessage.objects.filter(topic="orders").values_list("offset", flat=True)) == [
        fresh.offset]


def test_lock_counter_wait_creates_a_missing_counter_row():
    LogSequencer.objects.all().delete()
    with transaction.atomic():
        assert LogSequencer.objects.lock_counter_wait("default") == 0
    assert LogSequencer.objects.get(name="default").last_position == 0


# --------------------------------------------------------------------------- manage.py sqlqueue


def run(*args: str) -> str:
    out = StringIO()
    call_command("sqlqueue", *args, stdout=out)
    return out.getvalue()


def command_error(*args: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 2
    assert "\n" not in str(caught.value)
    return caught.value


def test_the_command_prints_one_line_on_success():
    publish_sequenced(count=3)
    consume_all("billing")

    assert run("repartition", "--topic", "orders", "--partitions", "6") == (
        "topic 'orders': 12 -> 6 partitions; deleted 3 consumed messages\n")
    assert run("repartition", "--topic", "orders", "--partitions", "6", "--database", "default") == (
        "topic 'orders' already has 6 partitions; nothing changed\n")
    assert run("repartition", "--topic", "fresh", "--partitions", "9") == (
        "topic 'fresh': recorded 9 partitions\n")
    assert recorded("orders") == 6


def test_the_command_refuses_a_topic_that_is_not_drained_in_one_line():
    publish_sequenced(count=3)
    register("billing")

    error = command_error("repartition", "--topic", "orders", "--partitions", "6")

    assert str(error).startswith(
        "topic 'orders' is not drained: group 'billing' has 3 unconsumed message(s);")
    assert recorded("orders") == 12


@pytest.mark.parametrize("value", ["0", "5000", "x", "", "-3", "1.5"])
def test_the_command_refuses_bad_partition_counts(value):
    error = command_error("repartition", "--topic", "orders", "--partitions", value)

    assert str(error) == f"--partitions must be a whole number from 1 to 4096, got {value!r}"
    assert recorded("orders") == 12  # as migrate recorded it from SQLQUEUE["TOPICS"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["repartition", "--topic", "bad/topic", "--partitions", "3"], "contains '/'"),
        (["repartition", "--topic", "orders", "--partitions", "3", "--database", "nope"],
         "unknown database alias 'nope'"),
        (["repartition", "--partitions", "3"], "Error: the following arguments are required: --topic"),
        (["frobnicate"], "Error: argument SUBCOMMAND: invalid choice: 'frobnicate'"),
        ([], "Error: the following arguments are required: SUBCOMMAND"),
    ],
    ids=["bad-topic", "unknown-database", "missing-topic", "unknown-subcommand", "no-subcommand"],
)
def test_the_command_reports_bad_input_in_one_line(args, expected):
    assert expected in str(command_error(*args))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--topic", "orders", "--partitions", "6"],
         "CommandError: topic 'orders' is not drained: group 'billing' has 2 unconsumed message(s);"),
        (["--topic", "orders", "--partitions", "x"],
         "CommandError: --partitions must be a whole number from 1 to 4096, got 'x'"),
        (["--topic", "orders"],
         "sqlqueue repartition: error: the following arguments are required: --partitions"),
    ],
    ids=["not-drained", "bad-partitions", "missing-partitions"],
)
def test_the_command_line_exits_2_with_one_line_on_stderr(args, line):
    publish_sequenced(count=2)
    register("billing")

    result = run_manage("sqlqueue", "repartition", *args)

    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr
    assert recorded("orders") == 12


@pytest.mark.django_db(transaction=True)
def test_the_command_line_repartitions_a_drained_topic():
    publish_sequenced(count=2)
    consume_all("billing")

    result = run_manage("sqlqueue", "repartition", "--topic", "orders", "--partitions", "24")

    assert (result.returncode, result.stdout, result.stderr) == (
        0, "topic 'orders': 12 -> 24 partitions; deleted 2 consumed messages\n", "")
    assert recorded("orders") == 24


# --------------------------------------------------------------------------- running workers


def test_a_worker_that_saw_the_old_count_removes_lease_rows_it_recreated_after_a_shrink():
    """A worker starting while "orders" shrinks from 12 to 3 partitions reads the old count,
    then inserts lease rows for partitions 0..11 after the repartition deleted 3..11. At its
    next renewal it sees the new count and removes them again, so no worker leases (or
    keeps) a partition the topic no longer has."""
    from django_sqlqueue.consuming.registry import autodiscover, subscriptions
    from django_sqlqueue.worker.leasing import Leasing

    autodiscover()
    billing = [s for s in subscriptions() if (s.topic, s.group) == ("orders", "billing")]
    assert billing
    leasing = Leasing("late-starter", "default", billing, lease_duration=30)
    Topic.objects.record({"orders": 12}, "default")
    leasing.prepare()  # reads 12 and creates 12 lease rows
    register("billing")
    assert repartition("orders", 3).old_partitions == 12
    # The late insert of the race: rows for the removed partitions reappear.
    PartitionLease.objects.ensure_partitions("billing", "orders", partition_names(12), "default")
    ConsumerOffset.objects.ensure("billing", "orders", partition_names(12), "default")
    now_ms = int(time.time() * 1000)
    leasing.maintain(now_ms)

    rows = PartitionLease.objects.filter(consumer_group="billing", topic="orders")
    assert sorted(rows.values_list("partition_key", flat=True)) == ["0", "1", "2"]
    assert sorted(ConsumerOffset.objects.filter(topic="orders")
                  .values_list("partition_key", flat=True)) == ["0", "1", "2"]
    assert sorted(p.number for p in leasing.partitions.values()) == ["0", "1", "2"]
