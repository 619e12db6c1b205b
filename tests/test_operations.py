"""The operations layer behind the CLI, the admin and the metrics, on rows arranged
directly (worker behaviour is in test_operations_workers.py)."""

from __future__ import annotations

import json
import time

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations as ops
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
    Throughput,
)
from django_sqlqueue.models.messages import DeadLetterSource
from django_sqlqueue.models.throughput import MINUTE_MS
from django_sqlqueue.partitioning import partition_for, partition_names
from django_sqlqueue.replays import GROUP_HEADER, ORIGINAL_ID_HEADER, replay_target
from django_sqlqueue.sequencing import sequence_all
from tests.helpers import now_ms

pytestmark = pytest.mark.django_db

TOPIC = "orders"  # 12 partitions in the test settings


def register(group: str, topic: str = TOPIC, partitions: int = 12) -> None:
    ConsumerOffset.objects.ensure(group, topic, partition_names(partitions), "default")


def publish(n: int, key: str = "k", topic: str = TOPIC) -> list[sqlqueue.StoredMessage]:
    stored = sqlqueue.publish_many(topic, [{"payload": {"n": i}, "key": key} for i in range(n)])
    sequence_all()
    return stored


def position(offset: int) -> int:
    return int(QueueMessage.objects.get(offset=offset).position)


def ack_up_to(group: str, key: str, offset: int, topic: str = TOPIC) -> None:
    ConsumerOffset.objects.filter(
        consumer_group=group, topic=topic, partition_key=str(partition_for(key, 12)),
    ).update(offset_acked=position(offset))


def dead_letter(group: str, message: sqlqueue.StoredMessage, error: str = "boom",
                topic: str = TOPIC) -> QueueMessage:
    """What a worker does when ``group`` gives up on ``message``: a copy in the dead-letter
    topic (the original is left alone)."""
    source = DeadLetterSource(message.offset, topic, message.key, message.id,
                              json.dumps(message.payload), json.dumps(message.headers),
                              now_ms())
    QueueMessage.objects.copy_to_dead_letters(source, topic + "_dlq", group, 3, error, "default")
    sequence_all()
    return QueueMessage.objects.get(topic=topic + "_dlq", message_id=f"{group}:{message.offset}")


# --------------------------------------------------------------------------- overview


def test_overview_reports_lag_above_the_watermarks_with_json_types():
    register("billing")
    register("shipping")
    stored = publish(5)
    ack_up_to("billing", "k", stored[2].offset)

    rows = {r.group: r.as_json() for r in ops.overview(topic=TOPIC)}

    assert rows["billing"]["lag"] == 2 and rows["shipping"]["lag"] == 5
    for row in rows.values():
        assert type(row["lag"]) is int and type(row["in_flight"]) is int
        assert type(row["dead_letters"]) is int and type(row["workers"]) is int
        assert type(row["paused"]) is bool
        assert isinstance(row["oldest_pending_age_seconds"], float)
        assert len(row["handled_per_minute"]) == 60
    json.dumps(list(rows.values()))  # serialisable as it is


def test_overview_counts_a_dead_lettered_message_as_consumed():
    register("billing")
    stored = publish(3)
    # The first is dead-lettered (acked out of order, above the watermark), the rest wait.
    DeliveryState.objects.create(consumer_group="billing", topic=TOPIC,
                                 partition_key=str(partition_for("k", 12)),
                                 message_offset=stored[0].offset, acked=True)
    dead_letter("billing", stored[0])

    [row] = ops.overview(topic=TOPIC, group="billing")

    assert row.lag == 2
    assert row.dead_letters == 1


def test_overview_counts_messages_no_worker_has_sequenced_yet_as_lag():
    register("billing")
    register("shipping")
    publish(2)  # sequenced
    sqlqueue.publish_many(TOPIC, [{"payload": {"n": i}, "key": "k"} for i in range(3)])
    sqlqueue.publish("payments", {"n": 0})  # another topic's backlog is not this one's lag

    rows = {r.group: r for r in ops.overview(topic=TOPIC)}

    assert rows["billing"].lag == 5 and rows["shipping"].lag == 5
    assert rows["billing"].oldest_pending_age_seconds is not None
    assert not rows["billing"].lag_estimated
    sequence_all()
    assert ops.overview(topic=TOPIC, group="billing")[0].lag == 5  # counted once, either way


def test_overview_has_no_pending_age_when_nothing_is_pending():
    register("billing")
    stored = publish(2)
    ack_up_to("billing", "k", stored[-1].offset)

    [row] = ops.overview(topic=TOPIC)

    assert row.lag == 0 and row.oldest_pending_age_seconds is None


def test_overview_counts_live_workers_in_flight_and_paused():
    register("billing")
    stored = publish(2)
    part = str(partition_for("k", 12))
    DeliveryState.objects.create(consumer_group="billing", topic=TOPIC, partition_key=part,
                                 message_offset=stored[0].offset, acked=False, retry_count=0,
                                 invisible_until=now_ms() + 60_000)
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic=TOPIC,
                                       subscriber_name="w1", heartbeat_at=now_ms())
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic=TOPIC,
                                       subscriber_name="gone", heartbeat_at=now_ms() - 3_600_000)
    ops.pause("billing", TOPIC)

    [row] = ops.overview(topic=TOPIC)

    assert (row.in_flight, row.workers, row.paused) == (1, 1, True)


def test_overview_reads_handled_per_minute_from_the_workers_counters():
    register("billing")
    minute = now_ms() // MINUTE_MS * MINUTE_MS
    Throughput.objects.add("w1", minute, {("billing", TOPIC): (7, 1)}, "default")
    Throughput.objects.add("w1", minute, {("billing", TOPIC): (3, 0)}, "default")
    Throughput.objects.add("w2", minute - 5 * MINUTE_MS, {("billing", TOPIC): (4, 0)}, "default")
    Throughput.objects.add("w2", minute - 61 * MINUTE_MS, {("billing", TOPIC): (99, 0)}, "default")

    [row] = ops.overview(topic=TOPIC)

    assert row.handled_per_minute[-1] == 10 and row.failed_per_minute[-1] == 1
    assert row.handled_per_minute[-6] == 4
    assert sum(row.handled_per_minute) == 14  # the hour before is not shown


def test_overview_refuses_a_name_no_group_can_have():
    with pytest.raises(ops.UnknownSubscription):
        ops.overview(group="no such group")


# --------------------------------------------------------------------------- health


def test_health_needs_a_live_worker_and_nothing_pending_too_long():
    register("billing")
    publish(1)
    assert not ops.health().ok
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic=TOPIC,
                                       subscriber_name="w1", heartbeat_at=now_ms())
    assert ops.health().ok
    time.sleep(1.1)
    report = ops.health(max_age=1)
    assert not report.ok and "billing/orders" in report.line and "\n" not in report.line
    assert ops.health(max_age=3600).ok


def test_health_of_an_unknown_group_is_an_error():
    with pytest.raises(ops.UnknownSubscription):
        ops.health(group="nobody")


# --------------------------------------------------------------------------- dead letters


def test_replay_reserves_the_copy_for_the_failed_group_and_removes_the_dead_letter():
    register("billing")
    register("shipping")
    [original] = publish(1)
    dead = dead_letter("billing", original, error="Boom: card declined")

    outcome = ops.replay(ops.DeadLetterFilter(topic=TOPIC))

    assert (outcome.matched, outcome.replayed, outcome.skipped) == (1, 1, 0)
    assert not QueueMessage.objects.filter(offset=dead.offset).exists()
    replay = QueueMessage.objects.get(topic=TOPIC, message_id=f"replay:{dead.offset}")
    assert replay.message_key == original.key and replay.payload == {"n": 0}
    assert replay.metadata[GROUP_HEADER] == "billing"
    assert replay.metadata[ORIGINAL_ID_HEADER] == original.id
    assert replay.offset > original.offset and replay.consumer_group == ""
    assert replay_target(replay.metadata) == "billing"
    assert replay_target(json.dumps(replay.metadata)) == "billing"


def test_replay_works_after_the_original_was_collected():
    register("billing")
    [original] = publish(1)
    dead = dead_letter("billing", original)
    QueueMessage.objects.filter(offset=original.offset).delete()

    assert ops.replay(ops.DeadLetterFilter(ids=(dead.offset,))).replayed == 1
    assert QueueMessage.objects.filter(topic=TOPIC, message_id=f"replay:{dead.offset}").exists()


def test_replay_leaves_dead_letters_of_a_group_that_is_gone():
    register("billing")
    [original] = publish(1)
    dead_letter("shipping", original)  # shipping is not registered (forgotten)

    outcome = ops.replay(ops.DeadLetterFilter())

    assert (outcome.replayed, outcome.skipped) == (0, 1)
    assert QueueMessage.objects.filter(topic=TOPIC + "_dlq").count() == 1


def test_filters_select_by_group_error_age_and_id():
    register("billing")
    register("shipping")
    stored = publish(4)
    a = dead_letter("billing", stored[0], error="Timeout talking to bank")
    dead_letter("billing", stored[1], error="ValueError: 100% wrong_thing")
    dead_letter("shipping", stored[2], error="Timeout at carrier")
    publish(1, topic="spread")  # another topic, no dead letters

    f = ops.DeadLetterFilter
    assert ops.count(f()) == 3
    assert ops.count(f(group="billing")) == 2
    assert ops.count(f(error_contains="timeout")) == 2
    assert ops.count(f(error_contains="100%")) == 1
    assert ops.count(f(error_contains="0% w")) == 1
    assert ops.count(f(error_contains="_")) == 1  # a literal underscore, not a wildcard
    assert ops.count(f(older_than=3600)) == 0
    assert ops.count(f(ids=(a.offset,), group="shipping")) == 0
    assert ops.count(f(topic="spread")) == 0
    assert [s.id for s in ops.sample(f(ids=(a.offset,)))] == [a.offset]


def test_a_dry_run_changes_nothing_and_shows_a_sample():
    register("billing")
    stored = publish(3)
    for message in stored:
        dead_letter("billing", message, error="first line\nsecond line")

    outcome = ops.discard(ops.DeadLetterFilter(), dry_run=True)

    assert outcome.matched == 3 and outcome.discarded == 0 and outcome.dry_run
    assert [s.error for s in outcome.sample] == ["first line"] * 3
    assert QueueMessage.objects.filter(topic=TOPIC + "_dlq").count() == 3


def test_discard_in_small_batches_reports_progress_and_deletes_everything_selected():
    register("billing")
    stored = publish(7)
    for message in stored:
        dead_letter("billing", message)
    seen = []

    outcome = ops.discard(ops.DeadLetterFilter(group="billing"), batch_size=3,
                          progress=lambda done, total: seen.append((done, total)))

    assert outcome.discarded == 7
    assert seen == [(3, 7), (6, 7), (7, 7)]
    assert not QueueMessage.objects.filter(topic=TOPIC + "_dlq").exists()
    assert QueueMessage.objects.filter(topic=TOPIC).count() == 7  # originals untouched


@pytest.mark.parametrize("flt", [
    ops.DeadLetterFilter(ids=(0,)), ops.DeadLetterFilter(older_than=-1),
    ops.DeadLetterFilter(topic="bad topic"), ops.DeadLetterFilter(group="x" * 101),
    ops.DeadLetterFilter(error_contains=""),
])
def test_bad_filters_are_refused(flt):
    with pytest.raises(ops.OperationError):
        ops.count(flt)


# --------------------------------------------------------------------------- control


def test_pause_and_resume_report_whether_anything_changed_and_bump_the_version():
    register("billing")
    assert ops.pause("billing", TOPIC) is True
    assert ops.pause("billing", TOPIC) is False
    assert GroupControl.objects.state("billing", TOPIC, "default").paused
    assert ops.resume("billing", TOPIC) is True
    assert ops.resume("billing", TOPIC) is False
    state = GroupControl.objects.state("billing", TOPIC, "default")
    assert state is not None and not state.paused and state.version == 2


def test_pause_refuses_a_group_not_registered_for_the_topic():
    register("billing")
    with pytest.raises(ops.UnknownSubscription, match="billing"):
        ops.pause("shipping", TOPIC)


def test_release_leases_frees_only_the_named_subscriber():
    register("billing")
    PartitionLease.objects.ensure_partitions("billing", TOPIC, ["0", "1", "2"], "default")
    PartitionLease.objects.filter(partition_key__in=["0", "1"]).update(leased_by="w1",
                                                                       lease_token="t")
    PartitionLease.objects.filter(partition_key="2").update(leased_by="w2", lease_token="u")

    assert ops.release_leases(subscriber="w1").leases == 2
    owners = dict(PartitionLease.objects.values_list("partition_key", "leased_by"))
    assert owners == {"0": "", "1": "", "2": "w2"}
    with pytest.raises(ops.UnknownSubscriber):
        ops.release_leases(subscriber="nobody")


def test_deliver_now_makes_a_backed_off_message_due_and_nudges_the_workers():
    register("billing")
    [message] = publish(1)
    part = str(partition_for("k", 12))
    DeliveryState.objects.create(consumer_group="billing", topic=TOPIC, partition_key=part,
                                 message_offset=message.offset, retry_count=1,
                                 invisible_until=now_ms() + 600_000, last_error="boom")

    assert ops.deliver_now("billing", TOPIC, message.offset) is True
    row = DeliveryState.objects.get(message_offset=message.offset)
    assert row.invisible_until <= now_ms() + 1000
    assert GroupControl.objects.state("billing", TOPIC, "default").version == 1


def test_deliver_now_makes_a_delayed_unread_message_due():
    register("billing")
    message = sqlqueue.publish(TOPIC, {"later": True}, key="k", delay=3600)
    sequence_all()

    assert ops.deliver_now("billing", TOPIC, message.offset) is True
    row = DeliveryState.objects.get(message_offset=message.offset)
    assert row.retry_count == -1 and row.invisible_until <= now_ms() + 1000


def test_deliver_now_refuses_a_consumed_or_unknown_message():
    register("billing")
    [message] = publish(1)
    ack_up_to("billing", "k", message.offset)
    with pytest.raises(ops.AlreadyHandled):
        ops.deliver_now("billing", TOPIC, message.offset)
    with pytest.raises(ops.UnknownMessage):
        ops.deliver_now("billing", TOPIC, message.offset + 1000)


def test_forget_also_drops_the_pause_state():
    register("billing")
    ops.pause("billing", TOPIC)
    done = ops.forget("billing")
    assert done.topics == [TOPIC]
    assert not GroupControl.objects.exists()


def test_forget_refuses_an_empty_topic_instead_of_forgetting_every_topic():
    register("billing")
    register("billing", topic="invoices")

    with pytest.raises(ops.OperationError, match="the topic is empty"):
        ops.forget("billing", "")

    assert ConsumerOffset.objects.filter(consumer_group="billing").count() == 24


def test_forget_retires_a_group_whose_worker_was_killed():
    register("billing")
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic=TOPIC,
                                       subscriber_name="w-killed", heartbeat_at=now_ms() - 600_000)

    done = ops.forget("billing", TOPIC)

    assert done.heartbeats == 1 and done.watermarks == 12


def test_run_gc_reports_what_it_deleted_per_topic():
    register("billing")
    stored = publish(4)
    ack_up_to("billing", "k", stored[2].offset)

    collected = ops.run_gc()

    assert collected.deleted == {TOPIC: 3} and collected.total == 3


def test_group_and_topic_names_in_the_new_tables_compare_byte_for_byte():
    for group in ("billing", "Billing", "billing "):
        GroupControl.objects.create(consumer_group=group, topic=TOPIC, paused=True)
        Throughput.objects.add("w", 0, {(group, TOPIC): (1, 0)}, "default")
    assert GroupControl.objects.count() == 3
    assert Throughput.objects.count() == 3


def test_a_large_lag_is_estimated_from_a_sample_per_partition(monkeypatch):
    monkeypatch.setattr("django_sqlqueue.operations.stats.LAG_SAMPLE", 10)
    register("billing")
    sqlqueue.publish_many(TOPIC, [{"payload": n, "key": f"k{n % 7}"} for n in range(300)])
    sequence_all()

    [row] = ops.overview(topic=TOPIC)

    assert row.lag_estimated
    assert 240 <= row.lag <= 360, row.lag  # an estimate: within 20% here


def test_a_lag_under_the_sample_in_every_partition_is_exact(monkeypatch):
    monkeypatch.setattr("django_sqlqueue.operations.stats.LAG_SAMPLE", 20)
    register("billing")
    sqlqueue.publish_many(TOPIC, [{"payload": n, "key": f"k{n % 3}"} for n in range(15)])
    sequence_all()
    [row] = ops.overview(topic=TOPIC)
    assert (row.lag, row.lag_estimated) == (15, False)
