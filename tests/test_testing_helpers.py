"""The test helpers as a project's pytest suite uses them: the ``sqlqueue_captured`` and
``sqlqueue_drain`` fixtures of the package's pytest plugin, and ``captured()`` and
``drain()`` from ``django_sqlqueue.testing``.

The handlers below stand for a project's ``queues.py``; what each does is chosen by its
message's payload, and each run is recorded in the ``Handled`` table.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from unittest.mock import ANY

import pytest
from django.db import transaction
from django.utils import timezone

import django_sqlqueue as sqlqueue
from django_sqlqueue import signals
from django_sqlqueue.consuming.registry import unregister
from django_sqlqueue.models import QueueMessage
from django_sqlqueue.testing import DrainLimitExceeded, captured, drain
from tests.testapp.models import Handled

pytestmark = pytest.mark.django_db

ORDERS = "helpers.orders"
SHIPMENTS = "helpers.shipments"
LEDGER = "helpers.ledger"  # strict: one message of a key at a time, in order
ONE_MINUTE = sqlqueue.ExponentialBackoff(base=60, cap=60, jitter=False)


def record(message: sqlqueue.Message) -> None:
    """Record the run, whatever the payload asks (a dead letter's handler)."""
    Handled.objects.create(group=message.group, topic=message.topic, key=message.key,
                           offset=message.offset, message_id=message.id,
                           payload=message.payload, attempt=message.attempt, pid=0,
                           handled_at=0)


def run(message: sqlqueue.Message) -> None:
    """Record the run, then do what the payload asks."""
    record(message)
    payload = message.payload if isinstance(message.payload, dict) else {}
    if message.attempt <= payload.get("fail", 0):
        raise RuntimeError(f"attempt {message.attempt} fails")
    if "retry_in" in payload and message.attempt == 1:
        raise sqlqueue.Retry(delay=payload["retry_in"])
    if payload.get("dead"):
        raise sqlqueue.DeadLetter("not for us")
    if payload.get("echo"):
        sqlqueue.publish(ORDERS, {"echo": True})  # every run publishes another one


RATED = "helpers.rated"  # rate="2/m"

SUBSCRIPTIONS = [
    (RATED, "pacing", run, {"rate": "2/m"}),
    (ORDERS, "billing", run, {"max_attempts": 3, "backoff": ONE_MINUTE}),
    (ORDERS, "emails", run, {"max_attempts": 3, "backoff": ONE_MINUTE}),
    (SHIPMENTS, "billing", run, {}),
    (LEDGER, "books", run, {"batch_size": 1, "backoff": ONE_MINUTE}),
    (f"{ORDERS}_dlq", "support", record, {}),
]


@pytest.fixture(autouse=True, scope="module")
def queues():
    """The project's subscribers, registered as its queues.py would register them."""
    for topic, group, handler, options in SUBSCRIPTIONS:
        sqlqueue.subscriber(topic, group=group, **options)(handler)
    yield
    for topic, group, _, _ in SUBSCRIPTIONS:
        unregister(topic, group)


def runs(group: str | None = None, topic: str = ORDERS) -> list[tuple[object, int]]:
    """(payload, attempt) of each handler run, in order."""
    rows = Handled.objects.filter(topic=topic).order_by("id")
    if group is not None:
        rows = rows.filter(group=group)
    return [(row.payload, row.attempt) for row in rows]


# --------------------------------------------------------------------------- captured


def test_captured_records_a_committed_publish_with_its_topic_key_and_payload(sqlqueue_captured):
    with transaction.atomic():
        sqlqueue.publish(ORDERS, {"order_id": 42, "total": "9.90"}, key="customer-7")

    message = sqlqueue_captured.assert_published(ORDERS, key="customer-7",
                                                 payload={"order_id": 42, "total": ANY})
    assert message.payload["total"] == "9.90"
    assert len(sqlqueue_captured) == 1


def test_captured_records_a_publish_whose_transaction_rolled_back(sqlqueue_captured):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        sqlqueue.publish(ORDERS, {"order_id": 1})
        1 / 0  # noqa: B018 - the view fails after publishing

    sqlqueue_captured.assert_published(ORDERS, payload={"order_id": 1})
    assert not QueueMessage.objects.filter(topic=ORDERS).exists()


def test_captured_observes_and_does_not_replace_publishing(sqlqueue_captured):
    stored = sqlqueue.publish(ORDERS, {"order_id": 3})

    assert sqlqueue_captured.messages == [stored]
    assert QueueMessage.objects.filter(offset=stored.offset, topic=ORDERS).exists()


def test_captured_records_publish_many_and_filters_by_topic(sqlqueue_captured):
    sqlqueue.publish_many(ORDERS, [{"payload": n, "key": f"k{n}"} for n in range(3)])
    sqlqueue.publish(SHIPMENTS, "parcel")

    assert len(sqlqueue_captured) == 4
    assert sqlqueue_captured.payloads(ORDERS) == [0, 1, 2]
    assert [m.key for m in sqlqueue_captured.filter(ORDERS)] == ["k0", "k1", "k2"]
    assert sqlqueue_captured.payloads(SHIPMENTS) == ["parcel"]
    sqlqueue_captured.assert_published(ORDERS, count=3)
    sqlqueue_captured.assert_not_published(ORDERS, key="k9")


def test_a_duplicate_publish_is_captured_once(sqlqueue_captured):
    sqlqueue.publish(ORDERS, {"order_id": 5}, id="order-5")
    sqlqueue.publish(ORDERS, {"order_id": 5}, id="order-5")

    sqlqueue_captured.assert_published(ORDERS, count=1)


def test_a_publish_that_wrote_nothing_is_listed_as_a_duplicate_not_as_a_message():
    sqlqueue.publish(ORDERS, {"version": 1}, id="evt-1")  # before the block

    with captured() as box:
        again = sqlqueue.publish(ORDERS, {"version": 2}, id="evt-1")
        many = sqlqueue.publish_many(ORDERS, [{"payload": {"version": 3}, "id": "evt-1"},
                                              {"payload": {"version": 4}, "id": "evt-2"}])

    assert box.payloads(ORDERS) == [{"version": 4}]
    assert not again.written and again.payload == {"version": 1}
    assert [m.written for m in many] == [False, True]
    assert [m.id for m in box.duplicates] == ["evt-1", "evt-1"]
    box.assert_published(ORDERS, count=1, payload={"version": 4})
    with pytest.raises(AssertionError, match=r"2 publish\(es\) to 'helpers.orders' wrote "
                                             r"nothing.*id='evt-1'"):
        box.assert_published(ORDERS, payload={"version": 2})


def test_captured_records_a_task_enqueue():
    tasks = pytest.importorskip("tests.testapp.tasks")

    with captured() as box:
        tasks.add.enqueue(2, b=3)

    task = box.assert_enqueued(tasks.add, args=[2], kwargs={"b": 3})
    assert (task.queue_name, task.task_path) == ("default", "tests.testapp.tasks.add")
    box.assert_published("tasks.default")


def test_nested_blocks_each_record_what_was_published_inside_them():
    with captured() as outer:
        sqlqueue.publish(ORDERS, "before")
        with captured() as inner:
            sqlqueue.publish(ORDERS, "inside")
        sqlqueue.publish(ORDERS, "after")
    sqlqueue.publish(ORDERS, "outside")

    assert inner.payloads() == ["inside"]
    assert outer.payloads() == ["before", "inside", "after"]


@pytest.mark.django_db(transaction=True)
def test_captured_records_publishes_of_every_thread():
    def publish_some(thread: int) -> None:
        try:
            for n in range(5):
                sqlqueue.publish(ORDERS, {"thread": thread, "n": n})
        finally:
            from django.db import connection
            connection.close()

    with captured() as box:
        threads = [threading.Thread(target=publish_some, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert sorted((p["thread"], p["n"]) for p in box.payloads(ORDERS)) == [
        (t, n) for t in range(4) for n in range(5)]


def test_a_failed_assertion_lists_what_was_published(sqlqueue_captured):
    sqlqueue.publish(ORDERS, {"order_id": 1}, key="a")

    with pytest.raises(AssertionError) as failed:
        sqlqueue_captured.assert_published(ORDERS, payload={"order_id": 2})
    assert str(failed.value) == (
        f"expected a message of {ORDERS!r} with payload={{'order_id': 2}} to be published; "
        f"1 message(s) of {ORDERS!r} were: key='a' payload={{'order_id': 1}}")
    with pytest.raises(AssertionError, match=f"nothing was published to 'elsewhere'; topics "
                                             f"published to: {ORDERS}"):
        sqlqueue_captured.assert_published("elsewhere")


# --------------------------------------------------------------------------- drain


def test_drain_runs_every_group_subscribed_to_the_topic(sqlqueue_drain):
    sqlqueue.publish(ORDERS, {"order_id": 1}, key="a")
    sqlqueue.publish(ORDERS, {"order_id": 2}, key="b")

    result = sqlqueue_drain(ORDERS)

    for group in ("billing", "emails"):
        assert sorted(runs(group), key=repr) == [({"order_id": 1}, 1), ({"order_id": 2}, 1)]
    assert (result.delivered, result.handled, result.retried, result.dead_lettered) == (4, 4, 0, 0)
    assert result.topic(ORDERS).handled == 4
    assert result.next_due is None


def test_drain_picks_subscriptions_by_group_and_by_topic(sqlqueue_drain):
    sqlqueue.publish(ORDERS, "order")
    sqlqueue.publish(SHIPMENTS, "parcel")

    assert sqlqueue_drain(ORDERS, group="emails").handled == 1
    assert runs() == [("order", 1)]
    assert sqlqueue_drain(group="billing", topic=[ORDERS, SHIPMENTS]).handled == 2
    assert sorted(Handled.objects.values_list("topic", "group")) == [
        (ORDERS, "billing"), (ORDERS, "emails"), (SHIPMENTS, "billing")]
    assert sqlqueue_drain(ORDERS).delivered == 0  # everything was handled


def test_a_retry_waits_out_its_delay_unless_delays_are_advanced(sqlqueue_drain):
    sqlqueue.publish(ORDERS, {"retry_in": 30})
    before = timezone.now()

    first = sqlqueue_drain(ORDERS, group="billing")

    assert (first.handled, first.retried) == (0, 1)
    assert first.failures[0].error == "Retry: retry requested"
    assert first.next_due is not None and first.next_due >= before + timedelta(seconds=29)
    second = sqlqueue_drain(ORDERS, group="billing", advance_delays=True)
    assert (second.handled, second.retried, second.next_due) == (1, 0, None)
    assert runs() == [({"retry_in": 30}, 1), ({"retry_in": 30}, 2)]


def test_a_failing_handler_backs_off_and_succeeds_on_a_later_attempt(sqlqueue_drain):
    sqlqueue.publish(ORDERS, {"fail": 2})

    result = sqlqueue_drain(ORDERS, group="billing", advance_delays=True)

    assert runs() == [({"fail": 2}, 1), ({"fail": 2}, 2), ({"fail": 2}, 3)]
    assert (result.handled, result.retried, result.dead_lettered) == (1, 2, 0)
    assert [f.error for f in result.failures] == ["RuntimeError: attempt 1 fails",
                                                  "RuntimeError: attempt 2 fails"]


def test_a_message_failing_every_attempt_is_dead_lettered_after_max_attempts(sqlqueue_drain):
    stored = sqlqueue.publish(ORDERS, {"fail": 99}, key="k")

    result = sqlqueue_drain(ORDERS, group="billing", advance_delays=True)

    assert [attempt for _, attempt in runs()] == [1, 2, 3]
    assert (result.retried, result.dead_lettered) == (2, 1)
    assert result.failures[-1].dead_lettered
    copy = QueueMessage.objects.get(topic=f"{ORDERS}_dlq")
    assert (copy.original_offset, copy.consumer_group, copy.last_error) == (
        stored.offset, "billing", "RuntimeError: attempt 3 fails")


def test_dead_letter_goes_to_the_dead_letter_topic_whose_subscriber_the_same_drain_runs(
        sqlqueue_drain):
    sqlqueue.publish(ORDERS, {"dead": True})

    result = sqlqueue_drain([ORDERS, f"{ORDERS}_dlq"], group=["billing", "support"])

    assert result.topic(ORDERS).dead_lettered == 1
    assert result.topic(f"{ORDERS}_dlq").handled == 1
    assert runs("support", topic=f"{ORDERS}_dlq") == [({"dead": True}, 1)]


def test_a_delayed_message_runs_when_delays_are_advanced_or_the_clock_is_set_past_it(
        sqlqueue_drain):
    sqlqueue.publish(ORDERS, "in an hour", delay=timedelta(hours=1))
    sqlqueue.publish(ORDERS, "tomorrow", delay=timedelta(days=1))

    assert sqlqueue_drain(ORDERS, group="billing").delivered == 0
    result = sqlqueue_drain(ORDERS, group="billing", now=timezone.now() + timedelta(hours=2))
    assert runs() == [("in an hour", 1)]
    assert result.next_due is not None
    assert sqlqueue_drain(ORDERS, group="billing", advance_delays=True).handled == 1
    assert runs() == [("in an hour", 1), ("tomorrow", 1)]


def test_in_strict_mode_a_key_waits_for_its_failing_head_and_other_keys_do_not(
        sqlqueue_drain):
    sqlqueue.publish_many(LEDGER, [
        {"payload": {"n": 1, "fail": 1}, "key": "a"},
        {"payload": {"n": 2}, "key": "a"},
        {"payload": {"n": 3}, "key": "b"},
    ])

    first = sqlqueue_drain(LEDGER)

    assert sorted(p["n"] for p, _ in runs(topic=LEDGER)) == [1, 3]
    assert (first.handled, first.retried, first.next_due is not None) == (1, 1, True)
    sqlqueue_drain(LEDGER, advance_delays=True)
    assert [(p["n"], attempt) for p, attempt in runs(topic=LEDGER) if p["n"] < 3] == [
        (1, 1), (1, 2), (2, 1)]


def test_drain_runs_tasks_with_their_retries():
    tasks = pytest.importorskip("tests.testapp.tasks")
    added = tasks.add.enqueue(2, 3)
    flaky = tasks.flaky.enqueue("x")

    result = drain("tasks.default", advance_delays=True)

    assert tasks.add.get_result(added.id).return_value == 5
    flaky_result = tasks.flaky.get_result(flaky.id)
    assert (flaky_result.status, flaky_result.return_value) == ("SUCCESSFUL", 2)
    assert (result.handled, result.retried) == (2, 1)


def test_a_task_failing_every_attempt_ends_failed():
    tasks = pytest.importorskip("tests.testapp.tasks")
    failing = tasks.always_fails.enqueue("y")

    result = drain("tasks.default", advance_delays=True)

    final = tasks.always_fails.get_result(failing.id)
    assert (final.status, len(final.errors)) == ("FAILED", 3)
    assert (result.retried, result.dead_lettered) == (2, 1)


def test_a_handler_that_publishes_every_time_stops_the_drain_with_a_clear_error(sqlqueue_drain):
    sqlqueue.publish(ORDERS, {"echo": True})

    with pytest.raises(DrainLimitExceeded, match=(
            rf"ran 20 handlers \(max_messages\) and there was still work: handlers ran for "
            rf"'{ORDERS}' 20 time\(s\); a handler that publishes a message each time it runs "
            "never drains")):
        sqlqueue_drain(ORDERS, group="billing", max_messages=20)
    assert len(runs("billing")) == 20


def test_the_worker_signals_are_sent():
    acked = []

    def receiver(sender, message, subscription, **kwargs):  # type: ignore[no-untyped-def]
        acked.append((message.payload, subscription.group))

    signals.message_acked.connect(receiver)
    try:
        sqlqueue.publish(ORDERS, "signalled")
        drain(ORDERS)
    finally:
        signals.message_acked.disconnect(receiver)
    assert sorted(acked) == [("signalled", "billing"), ("signalled", "emails")]


def test_drain_holds_a_rate_limited_subscription_to_its_rate(sqlqueue_drain):
    sqlqueue.publish_many(RATED, [{"payload": {"n": n}} for n in range(5)])
    before = timezone.now()

    first = sqlqueue_drain(RATED)

    assert first.handled == 2  # the bucket's burst: two starts, then one every 30 s
    assert first.next_due is not None and first.next_due >= before + timedelta(seconds=25)
    assert sqlqueue_drain(RATED).handled == 0  # the same bucket, still empty
    rest = sqlqueue_drain(RATED, advance_delays=True)
    assert (rest.handled, rest.next_due) == (3, None)
    assert sorted(payload["n"] for payload, _ in runs(topic=RATED)) == [0, 1, 2, 3, 4]


def test_drain_refuses_a_topic_nobody_subscribes_to_and_bad_limits():
    with pytest.raises(ValueError, match="no subscriber or task queue matches topic nowhere; "
                                         "registered: "):
        drain("nowhere")
    with pytest.raises(ValueError, match="max_messages must be an int >= 1, got 0"):
        drain(ORDERS, max_messages=0)


@pytest.mark.django_db(transaction=True)
def test_drain_runs_committed_messages_outside_a_test_transaction(sqlqueue_drain):
    with transaction.atomic():
        sqlqueue.publish(ORDERS, {"fail": 1})

    result = sqlqueue_drain(ORDERS, group="billing", advance_delays=True)

    assert (result.handled, result.retried) == (1, 1)
    assert runs() == [({"fail": 1}, 1), ({"fail": 1}, 2)]
