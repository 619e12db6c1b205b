"""Watermarks and delivery rows stay flat whatever sits at a partition's head."""

from __future__ import annotations

import signal

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import ConsumerOffset, DeliveryState
from django_sqlqueue.operations.control import deliver_now
from tests.testapp.models import Handled
from tests.worker_harness import keys_in_partition, partition_of, position_of, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def progress(group: str, topic: str, partition: str) -> tuple[int, int]:
    return ConsumerOffset.objects.filter(
        consumer_group=group, topic=topic, partition_key=partition,
    ).values_list("offset_acked", "offset_fetched").get()


def test_the_watermark_passes_a_delayed_head_which_waits_in_its_row_alone(workers):
    head = sqlqueue.publish("manykeys", {"n": "head"}, key="head", delay=3600)
    partition = partition_of("manykeys", "head")
    behind = sqlqueue.publish_many("manykeys", [
        {"payload": {"n": n}, "key": key}
        for n, key in enumerate(keys_in_partition("manykeys", partition, 300))])
    worker = workers.start("watermarks", "--topic", "manykeys")

    wait_until(lambda: Handled.objects.filter(topic="manykeys").count() >= 300,
               what="the 300 messages behind the delayed head", watch=[worker])
    last = max(position_of(m.offset) or 0 for m in behind)
    # While the head waits, the watermark is past everything, and of the delivery rows
    # only the head's is left: parked until it is due.
    wait_until(lambda: progress("bulk", "manykeys", partition)[0] >= last,
               what="the watermark past the waiting head", watch=[worker])
    assert not Handled.objects.filter(offset=head.offset).exists()
    assert list(DeliveryState.objects.filter(topic="manykeys").values_list(
        "message_offset", "parked", "acked")) == [(head.offset, 1, False)]
    # Made due by an operator, it is handled, and its row acked (GC deletes both).
    assert deliver_now("bulk", "manykeys", head.offset)
    wait_until(lambda: Handled.objects.filter(offset=head.offset).exists(),
               what="the delayed head handled once due", watch=[worker])
    wait_until(lambda: list(DeliveryState.objects.filter(topic="manykeys").values_list(
        "message_offset", "acked")) == [(head.offset, True)],
        what="the head's row acked", watch=[worker])


def test_acked_rows_a_killed_worker_left_behind_are_cleaned_up(workers):
    slow_head = sqlqueue.publish("slow", {"sleep": 3}, key="head")
    partition = partition_of("slow", "head")
    behind = sqlqueue.publish_many("slow", [
        {"payload": {"sleep": 0}, "key": key}
        for key in keys_in_partition("slow", partition, 50)])
    first = workers.start("first", "--topic", "slow", "--concurrency", "4")
    wait_until(lambda: DeliveryState.objects.filter(topic="slow", acked=True).count() >= 50,
               what="the messages behind the slow head acked", watch=[first])
    first.send(signal.SIGKILL)
    first.kill()
    assert DeliveryState.objects.filter(topic="slow", acked=True).count() >= 50

    second = workers.start("second", "--topic", "slow")
    last = max(position_of(m.offset) or 0 for m in behind)
    wait_until(lambda: progress("billing", "slow", partition)[0] >= last, timeout=30,
               what="the new owner's watermark passing everything", watch=[second])
    wait_until(lambda: not DeliveryState.objects.filter(topic="slow").exists(),
               what="the left-behind delivery rows deleted", watch=[second])
    assert Handled.objects.filter(offset=slow_head.offset).count() == 2  # redelivered once
