"""The worker run in-process (``Worker(...).run()`` with ``burst``): signals and outcomes.

Lifecycle behaviour is tested with real ``runqueueworker`` processes elsewhere; here the
worker runs in the test's own process so the signals it sends can be observed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue import signals
from django_sqlqueue.consuming.registry import Subscription, subscriptions, unregister
from django_sqlqueue.models import ConsumerOffset, DeliveryState, QueueMessage
from django_sqlqueue.worker.process import Worker

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "inprocess"


@pytest.fixture
def subscription() -> Iterator[Subscription]:
    """A handler whose behaviour each message's payload chooses."""
    seen: list[tuple[int, int]] = []

    @sqlqueue.subscriber(TOPIC, group="signals", max_attempts=3)
    def handle(message: sqlqueue.Message) -> None:
        seen.append((message.offset, message.attempt))
        action = message.payload["action"]
        if action == "retry" and message.attempt == 1:
            raise sqlqueue.Retry(delay=0)
        if action == "dead":
            raise sqlqueue.DeadLetter("not for us")

    [registered] = [s for s in subscriptions() if s.topic == TOPIC]
    handle.seen = seen  # type: ignore[attr-defined]
    try:
        yield registered
    finally:
        unregister(TOPIC, "signals")


@pytest.fixture
def received() -> Iterator[dict[str, list[tuple[int, int]]]]:
    """(offset, attempt) of every message each worker signal was sent for."""
    log: dict[str, list[tuple[int, int]]] = {}
    receivers = {}
    for name in ("message_delivered", "message_acked", "message_nacked",
                 "message_dead_lettered"):
        def receiver(sender, message, subscription, name=name, **kwargs):  # type: ignore[no-untyped-def]
            log.setdefault(name, []).append((message.offset, message.attempt))
        getattr(signals, name).connect(receiver, weak=False)
        receivers[name] = receiver
    try:
        yield log
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)


def run_burst(subscription: Subscription) -> None:
    worker = Worker([subscription], name="inprocess", burst=True)
    assert worker.run() == 0


def test_signals_report_each_delivery_and_its_outcome(subscription, received):
    ok, retry, dead = sqlqueue.publish_many(TOPIC, [
        {"payload": {"action": "ok"}, "key": "a"},
        {"payload": {"action": "retry"}, "key": "b"},
        {"payload": {"action": "dead"}, "key": "c"},
    ])

    run_burst(subscription)

    assert sorted(received["message_delivered"]) == sorted([
        (ok.offset, 1), (retry.offset, 1), (retry.offset, 2), (dead.offset, 1)])
    assert sorted(received["message_acked"]) == sorted([(ok.offset, 1), (retry.offset, 2)])
    assert received["message_nacked"] == [(retry.offset, 1)]
    assert received["message_dead_lettered"] == [(dead.offset, 1)]


def test_a_burst_run_leaves_every_partition_acked_and_cleaned_up(subscription, received):
    published = sqlqueue.publish_many(
        TOPIC, [{"payload": {"action": "ok"}, "key": f"k{n % 3}"} for n in range(30)]
    )

    run_burst(subscription)

    assert sorted(o for o, _ in received["message_acked"]) == sorted(m.offset for m in published)
    heads = {}
    for key, position in QueueMessage.objects.filter(topic=TOPIC).values_list(
            "partition_key", "position"):
        heads[key] = max(heads.get(key, 0), position)
    watermarks = dict(ConsumerOffset.objects.filter(consumer_group="signals", topic=TOPIC)
                      .values_list("partition_key", "offset_acked"))
    assert {p: w for p, w in watermarks.items() if p in heads} == heads
    assert all(w == 0 for p, w in watermarks.items() if p not in heads)
    # Delivery rows behind the watermark are removed.
    assert not DeliveryState.objects.filter(consumer_group="signals").exists()


def test_a_dead_letter_copy_names_the_group_the_error_and_the_original(subscription, received):
    dead = sqlqueue.publish(TOPIC, {"action": "dead"}, key="z", headers={"trace": "t-1"})

    run_burst(subscription)

    copy = QueueMessage.objects.get(topic=f"{TOPIC}_dlq")
    assert (copy.consumer_group, copy.original_topic, copy.original_offset) == (
        "signals", TOPIC, dead.offset)
    assert copy.message_id == f"signals:{dead.offset}"
    assert copy.failure_count == 1
    assert copy.last_error == "DeadLetter: not for us"
    assert (copy.message_key, copy.payload, copy.metadata) == ("z", {"action": "dead"},
                                                                {"trace": "t-1"})
    assert copy.failed_at > 0
    assert QueueMessage.objects.filter(offset=dead.offset, topic=TOPIC).exists()
