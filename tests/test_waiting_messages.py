"""Waiting messages (delayed, backing off, or queued behind their key) are parked in the
database: they neither fill a partition's window nor hold its watermark and GC back, and
each is still delivered when due, in its key's order."""

from __future__ import annotations

import time

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import ConsumerOffset, DeliveryState, QueueMessage
from django_sqlqueue.operations.control import deliver_now
from django_sqlqueue.operations.names import database_now_ms
from tests.testapp.models import Handled
from tests.worker_harness import position_of, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

DAY = 24 * 3600
# A window of 100 unacked messages: a few hundred waiting ones are more than it holds.
SMALL_WINDOW = {"MAX_WINDOW": 100}


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def handled(topic: str, keys: list[str]) -> int:
    return Handled.objects.filter(topic=topic, key__in=keys).count()


def watermark(group: str, topic: str) -> int:
    return ConsumerOffset.objects.filter(consumer_group=group, topic=topic).values_list(
        "offset_acked", flat=True).get()


def test_due_messages_go_out_at_once_behind_more_delayed_ones_than_the_window_holds(workers):
    # "keyed" has one partition: 400 reminders for tomorrow, then 20 due messages of other
    # keys, all in it.
    sqlqueue.publish_many("keyed", [{"payload": {"n": n}, "key": f"reminder{n}", "delay": DAY}
                                    for n in range(400)])
    due_keys = [f"due{n}" for n in range(20)]
    sqlqueue.publish_many("keyed", [{"payload": {}, "key": key} for key in due_keys])
    worker = workers.start("reminders", "--topic", "keyed", settings=SMALL_WINDOW)

    wait_until(lambda: handled("keyed", due_keys) == 20, timeout=15,
               what="the 20 due messages behind 400 delayed ones", watch=[worker])
    assert not Handled.objects.filter(key__startswith="reminder").exists()
    # The watermark passed the reminders; each waits in a parked row of its own.
    last = QueueMessage.objects.filter(topic="keyed").order_by("-position").first()
    assert last is not None
    wait_until(lambda: watermark("ordered", "keyed") >= (last.position or 0), timeout=10,
               what="the watermark past the waiting reminders", watch=[worker])
    assert DeliveryState.objects.filter(topic="keyed", parked__gt=0, acked=False).count() == 400


def test_a_failing_key_does_not_hold_up_its_neighbours_however_many_wait_behind_it(workers):
    # Strict mode: "stuck" fails twice (retrying after 1.5 s each time) with 300 of its
    # messages behind it, more than the window holds; other keys go on meanwhile, and
    # "stuck" is handled in its order once its head succeeds.
    sqlqueue.publish("keyed", {"fail_attempts": 2, "retry_in": 1.5, "n": 0}, key="stuck")
    sqlqueue.publish_many("keyed", [{"payload": {"n": n}, "key": "stuck"}
                                    for n in range(1, 301)])
    other_keys = [f"other{n}" for n in range(20)]
    sqlqueue.publish_many("keyed", [{"payload": {}, "key": key} for key in other_keys])
    worker = workers.start("stuck", "--topic", "keyed", settings=SMALL_WINDOW)

    wait_until(lambda: handled("keyed", other_keys) == 20, timeout=15,
               what="the other keys handled while 'stuck' fails", watch=[worker])
    assert Handled.objects.filter(key="stuck").exclude(payload__n=0).count() == 0
    wait_until(lambda: Handled.objects.filter(key="stuck").count() >= 303, timeout=30,
               what="every message of 'stuck' handled", watch=[worker])
    order = [h.payload["n"] for h in Handled.objects.filter(key="stuck").order_by("id")]
    assert order == [0, 0, 0, *range(1, 301)]


def test_strict_mode_keeps_a_keys_later_messages_behind_its_delayed_head(workers):
    worker = workers.start("ordered", "--topic", "keyed")
    wait_until(lambda: worker.leases, what="the worker holding the partition", watch=[worker])
    # Due in an hour, so that no slowness of this machine can make it due during the test:
    # an operator makes it due once the other keys are done.
    head = sqlqueue.publish("keyed", {"n": 0}, key="k", delay=3600)
    sqlqueue.publish_many("keyed", [{"payload": {"n": n}, "key": "k"} for n in range(1, 4)])
    sqlqueue.publish_many("keyed", [{"payload": {}, "key": f"free{n}"} for n in range(5)])

    wait_until(lambda: handled("keyed", [f"free{n}" for n in range(5)]) == 5,
               what="the other keys", watch=[worker])
    time.sleep(0.5)  # a few polls: "k" must still wait
    assert not Handled.objects.filter(key="k").exists()  # all of "k" waits for its head
    assert deliver_now("ordered", "keyed", head.offset)
    wait_until(lambda: Handled.objects.filter(key="k").count() == 4, timeout=15,
               what="the delayed head and the messages behind it", watch=[worker])
    runs = list(Handled.objects.filter(key="k").order_by("id"))
    assert [r.payload["n"] for r in runs] == [0, 1, 2, 3]
    assert runs[0].offset == head.offset


def test_a_delayed_message_is_delivered_when_due_after_gc_and_a_restart(workers):
    # Due in an hour, so that however slow this machine is, it cannot come due while GC
    # runs; the test moves its due time once the first worker is gone.
    late = sqlqueue.publish("manykeys", {"n": "late"}, key="late", delay=3600)
    others = sqlqueue.publish_many("manykeys", [{"payload": {"n": n}, "key": f"k{n}"}
                                                for n in range(300)])
    fast_gc = {"GC_INTERVAL": 0.2}
    first = workers.start("first", "--topic", "manykeys", settings=fast_gc)
    wait_until(lambda: Handled.objects.filter(topic="manykeys").count() >= 300,
               what="the messages published after the delayed one", watch=[first])
    # GC deletes everything but the waiting message, whose delivery row alone is left.
    wait_until(lambda: set(QueueMessage.objects.filter(topic="manykeys")
                           .values_list("offset", flat=True)) == {late.offset},
               timeout=30, what="GC leaving only the delayed message", watch=[first])
    assert list(DeliveryState.objects.filter(topic="manykeys").values_list(
        "message_offset", "parked", "acked")) == [(late.offset, 1, False)]
    assert not Handled.objects.filter(offset=late.offset).exists()
    first.terminate()
    first.wait_exit(15)
    # An hour passes: the parked row comes due in a second.
    DeliveryState.objects.filter(topic="manykeys", message_offset=late.offset).update(
        invisible_until=database_now_ms("default") + 1000)

    second = workers.start("second", "--topic", "manykeys", settings=fast_gc)
    wait_until(lambda: Handled.objects.filter(offset=late.offset).exists(), timeout=15,
               what="the delayed message handled when due", watch=[second])
    assert Handled.objects.filter(offset=late.offset).get().attempt == 1
    assert position_of(others[0].offset) is None  # collected long before
    # Once handled, GC collects it too: nothing is left.
    wait_until(lambda: not QueueMessage.objects.filter(topic="manykeys").exists()
               and not DeliveryState.objects.filter(topic="manykeys").exists(),
               timeout=10, what="the handled delayed message collected", watch=[second])


def test_a_delayed_message_goes_out_when_due_ahead_of_what_was_published_after_it(workers):
    # A due message waits for the messages published before it (the log's order), never
    # for those published after it: here a backlog that takes seconds to drain.
    worker = workers.start("due-first", "--topic", "spread")
    wait_until(lambda: worker.leases() == 4, what="the worker's leases", watch=[worker])
    sqlqueue.publish("spread", {"delayed": True}, delay=2)
    backlog = 4000
    sqlqueue.publish_many("spread", [{"payload": {"n": n}} for n in range(backlog)])

    wait_until(lambda: Handled.objects.filter(topic="spread").count() == backlog + 1,
               timeout=60, what="the delayed message and the backlog", watch=[worker])
    runs = sorted(Handled.objects.filter(topic="spread").values_list("handled_at", "payload"),
                  key=lambda run: run[0])
    delayed_at = next(n for n, (_, payload) in enumerate(runs) if payload.get("delayed"))
    # In log order it would be handled after all 4,000; the backlog takes about four
    # seconds here (longer on a loaded machine), so most of it is still to go at its time.
    assert backlog - delayed_at > backlog // 4
