"""Cancelling a message that has not started: it is never handed to the cancelled groups'
handlers, counts as consumed (watermarks pass it, GC collects it), and a message already
running is reported as such and runs to its end. Real worker processes throughout."""

from __future__ import annotations

import random
import signal
import time

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue import CancelStatus
from django_sqlqueue.models import Cancellation, DeliveryState, QueueMessage
from django_sqlqueue.operations import (
    AlreadyHandled,
    AmbiguousMessage,
    UnknownMessage,
    UnknownSubscription,
)
from django_sqlqueue.operations.control import deliver_now
from django_sqlqueue.sequencing import sequence_all
from tests.testapp.models import Handled
from tests.worker_harness import partition_watermark, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TOPIC = "cancels"
FAST_GC = {"GC_INTERVAL": 0.2}
HOUR = 3600


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def started(offset: int, group: str | None = None) -> bool:
    runs = Handled.objects.filter(topic=TOPIC, offset=offset)
    return (runs.filter(group=group) if group else runs).exists()


def ended(offset: int, group: str | None = None) -> bool:
    runs = Handled.objects.filter(topic=f"{TOPIC}.end", offset=offset)
    return (runs.filter(group=group) if group else runs).exists()


def passed(group: str, message: sqlqueue.StoredMessage) -> bool:
    """The group's watermark is at or past the message."""
    row = QueueMessage.objects.filter(offset=message.offset).values_list(
        "partition_key", "position").first()
    if row is None:
        return True  # collected: every group passed it
    return bool(row[1]) and partition_watermark(group, TOPIC, row[0]) >= row[1]


def collected(message: sqlqueue.StoredMessage) -> bool:
    return (not QueueMessage.objects.filter(offset=message.offset).exists()
            and not DeliveryState.objects.filter(message_offset=message.offset).exists())


def answers(topic: str, id: str) -> dict[str, CancelStatus] | None:  # noqa: A002
    """What cancel() answers per group; None once the message is collected."""
    try:
        return sqlqueue.cancel(topic, id).groups
    except UnknownMessage:
        return None


def start_both(workers, name: str = "w", **settings):  # type: ignore[no-untyped-def]
    worker = workers.start(name, "--topic", TOPIC, "--group", "alpha", "--group", "beta",
                           settings={**FAST_GC, **settings})
    wait_until(lambda: worker.leases() == 8, what="the worker's leases for both groups",
               watch=[worker])
    return worker


def test_a_message_cancelled_for_all_groups_before_any_registered_is_skipped_by_them(workers):
    doomed = sqlqueue.publish(TOPIC, {"n": "doomed"}, key="k", id="order-1")
    after = sqlqueue.publish(TOPIC, {"n": "after"}, key="k")

    result = sqlqueue.cancel(TOPIC, "order-1", by="ops")
    assert result.for_all_groups and result.groups == {} and result.cancelled
    worker = start_both(workers)
    wait_until(lambda: sorted(Cancellation.objects.filter(message_offset=doomed.offset)
                              .values_list("consumer_group", "cancelled_by"))
               == [("", "ops"), ("alpha", "ops"), ("beta", "ops")],
               what="each group recording the cancellation as its own", watch=[worker])

    wait_until(lambda: ended(after.offset, "alpha") and ended(after.offset, "beta"),
               what="the message published after the cancelled one", watch=[worker])
    assert not started(doomed.offset)
    wait_until(lambda: collected(doomed), timeout=30,
               what="GC collecting the cancelled message", watch=[worker])
    # Each group skipped it in its own name; once the message is gone, so are the records.
    wait_until(lambda: not Cancellation.objects.filter(message_offset=doomed.offset).exists(),
               timeout=40, what="the records of the collected message pruned", watch=[worker])


def test_a_message_cancelled_for_all_groups_never_runs_and_is_collected(workers):
    worker = start_both(workers)
    doomed = sqlqueue.publish(TOPIC, {"n": 0}, key="k", id="late", delay=HOUR)
    after = sqlqueue.publish(TOPIC, {"n": 1}, key="k")
    wait_until(lambda: ended(after.offset, "alpha") and ended(after.offset, "beta"),
               what="the next message", watch=[worker])

    result = sqlqueue.cancel(TOPIC, "late", by="ops")

    assert result.groups == {"alpha": CancelStatus.CANCELLED, "beta": CancelStatus.CANCELLED}
    assert result.offset == doomed.offset and result.key == "k"
    records = Cancellation.objects.filter(message_offset=doomed.offset)
    assert sorted(records.values_list("consumer_group", "cancelled_by")) == [
        ("", "ops"), ("alpha", "ops"), ("beta", "ops")]
    # A delayed message: parked past the watermark; cancelled, GC collects it.
    wait_until(lambda: collected(doomed), timeout=30, what="GC collecting it", watch=[worker])
    assert not started(doomed.offset)


def test_cancelling_for_one_group_leaves_the_others_delivery_alone(workers):
    worker = start_both(workers)
    message = sqlqueue.publish(TOPIC, {"n": 0}, key="k", id="one", delay=HOUR)
    wait_until(lambda: DeliveryState.objects.filter(message_offset=message.offset).count() == 2,
               what="both groups parking the delayed message", watch=[worker])

    result = sqlqueue.cancel(TOPIC, "one", group="alpha")

    assert result.groups == {"alpha": CancelStatus.CANCELLED} and not result.for_all_groups
    assert deliver_now("beta", TOPIC, message.offset)
    with pytest.raises(AlreadyHandled):
        deliver_now("alpha", TOPIC, message.offset)
    wait_until(lambda: ended(message.offset, "beta"), what="beta running it", watch=[worker])
    wait_until(lambda: collected(message), timeout=30, what="GC collecting it", watch=[worker])
    assert not started(message.offset, "alpha")


def test_a_running_message_is_reported_and_runs_to_its_end(workers):
    worker = start_both(workers)
    message = sqlqueue.publish(TOPIC, {"sleep": 2}, key="k", id="busy")
    wait_until(lambda: started(message.offset, "alpha") and started(message.offset, "beta"),
               what="both groups running it", watch=[worker])

    result = sqlqueue.cancel(TOPIC, "busy")

    assert result.groups == {"alpha": CancelStatus.RUNNING, "beta": CancelStatus.RUNNING}
    assert not result.cancelled
    wait_until(lambda: ended(message.offset, "alpha") and ended(message.offset, "beta"),
               what="both runs ending", watch=[worker])
    # Once their outcomes are recorded, the message is done for both (or collected).
    wait_until(lambda: answers(TOPIC, "busy") in ({"alpha": CancelStatus.DONE,
                                                   "beta": CancelStatus.DONE}, None),
               what="both outcomes recorded", watch=[worker], interval=0.2)
    assert not Cancellation.objects.filter(message_offset=message.offset,
                                           consumer_group__in=["alpha", "beta"]).exists()


def test_cancelling_again_answers_the_same_and_records_once(workers):
    worker = start_both(workers)
    message = sqlqueue.publish(TOPIC, {}, key="k", id="twice", delay=HOUR)
    wait_until(lambda: DeliveryState.objects.filter(message_offset=message.offset).count() == 2,
               what="both groups parking it", watch=[worker])

    first = sqlqueue.cancel(TOPIC, "twice", group="beta", by="first")
    again = sqlqueue.cancel(TOPIC, "twice", group="beta", by="second")

    assert first.groups == again.groups == {"beta": CancelStatus.CANCELLED}
    assert list(Cancellation.objects.filter(message_offset=message.offset)
                .values_list("consumer_group", "cancelled_by")) == [("beta", "first")]


def test_a_retry_waiting_for_its_next_attempt_is_cancelled_and_not_retried(workers):
    worker = start_both(workers)
    message = sqlqueue.publish(TOPIC, {"retry_in": HOUR}, key="k", id="retrying")
    wait_until(lambda: Handled.objects.filter(offset=message.offset, topic=TOPIC).count() == 2,
               what="the first attempt of both groups", watch=[worker])
    wait_until(lambda: DeliveryState.objects.filter(message_offset=message.offset, parked=1)
               .count() == 2, what="both retries parked", watch=[worker])

    result = sqlqueue.cancel(TOPIC, "retrying")

    assert result.groups == {"alpha": CancelStatus.CANCELLED, "beta": CancelStatus.CANCELLED}
    wait_until(lambda: collected(message), timeout=30, what="GC collecting it", watch=[worker])
    assert Handled.objects.filter(offset=message.offset).count() == 2  # the first attempts


def test_a_message_waiting_in_a_workers_memory_is_dropped_from_it(workers):
    # Strict mode: a key's later messages wait in the window, in memory, behind its head.
    worker = workers.start("w", "--topic", TOPIC, "--group", "gamma", settings=FAST_GC)
    wait_until(lambda: worker.leases() == 4, what="the worker's leases", watch=[worker])
    head = sqlqueue.publish(TOPIC, {"sleep": 2}, key="k")
    wait_until(lambda: started(head.offset), what="the key's head running", watch=[worker])
    queued = sqlqueue.publish_many(TOPIC, [{"payload": {}, "key": "k", "id": f"q{n}"}
                                           for n in range(5)])
    wait_until(lambda: DeliveryState.objects.filter(
        message_offset__in=[m.offset for m in queued]).count() == 5,
        what="the worker reading them behind the head", watch=[worker])

    result = sqlqueue.cancel(TOPIC, "q2", group="gamma")

    assert result.groups == {"gamma": CancelStatus.CANCELLED}
    wait_until(lambda: all(ended(m.offset) for n, m in enumerate(queued) if n != 2),
               what="the other queued messages", watch=[worker])
    wait_until(lambda: passed("gamma", queued[-1]), what="the watermark past them all",
               watch=[worker])
    assert not started(queued[2].offset)
    runs = Handled.objects.filter(topic=TOPIC, key="k").order_by("id").values_list("offset",
                                                                                   flat=True)
    assert list(runs) == [head.offset, *[m.offset for n, m in enumerate(queued) if n != 2]]


def test_a_strict_keys_parked_head_cancelled_lets_the_messages_behind_it_go(workers):
    worker = workers.start("w", "--topic", TOPIC, "--group", "gamma", settings=FAST_GC)
    wait_until(lambda: worker.leases() == 4, what="the worker's leases", watch=[worker])
    head = sqlqueue.publish(TOPIC, {}, key="k", id="head", delay=HOUR)
    behind = sqlqueue.publish_many(TOPIC, [{"payload": {}, "key": "k"} for _ in range(3)])
    wait_until(lambda: DeliveryState.objects.filter(topic=TOPIC, parked__gt=0).count() == 4,
               what="the head and the messages behind it parked", watch=[worker])

    assert sqlqueue.cancel(TOPIC, "head").groups == {"gamma": CancelStatus.CANCELLED}

    wait_until(lambda: all(ended(m.offset) for m in behind), what="the messages behind it",
               watch=[worker])
    assert not started(head.offset)
    runs = Handled.objects.filter(topic=TOPIC, key="k").order_by("id").values_list("offset",
                                                                                   flat=True)
    assert list(runs) == [m.offset for m in behind]


def test_cancel_refuses_unknown_topics_ids_groups_and_ambiguous_ids():
    sqlqueue.publish(TOPIC, {}, key="a", id="same")
    sqlqueue.publish(TOPIC, {}, key="b", id="same")
    sequence_all()
    with pytest.raises(UnknownMessage, match="no message with id 'nope'"):
        sqlqueue.cancel(TOPIC, "nope")
    with pytest.raises(UnknownSubscription, match="not a topic name"):
        sqlqueue.cancel("no such topic", "x")
    with pytest.raises(UnknownSubscription, match="not registered"):
        sqlqueue.cancel(TOPIC, "same", group="nobody", key="a")
    with pytest.raises(AmbiguousMessage, match="under several keys"):
        sqlqueue.cancel(TOPIC, "same")
    assert isinstance(AmbiguousMessage("x"), sqlqueue.SQLQueueError)
    result = sqlqueue.cancel(TOPIC, "same", key="b")
    assert result.key == "b" and result.cancelled


def test_cancel_races_a_worker_starting_the_message(workers):
    # Cancel each message while the worker may be handing it out: each either runs from
    # start to end, or never starts, and "cancelled" is answered exactly for the latter.
    worker = workers.start("racer", "--topic", TOPIC, "--group", "alpha", "--concurrency", "2",
                           settings=FAST_GC)
    wait_until(lambda: worker.leases() == 4, what="the worker's leases", watch=[worker])
    rng = random.Random(21)
    answers: dict[int, CancelStatus] = {}
    messages = []
    for n in range(60):
        message = sqlqueue.publish(TOPIC, {"sleep": 0.01}, key=f"k{n % 7}", id=f"race{n}")
        messages.append(message)
        time.sleep(rng.uniform(0, 0.03))
        target = messages[max(0, n - rng.randint(0, 3))]
        if target.offset not in answers:
            try:
                answers[target.offset] = sqlqueue.cancel(
                    TOPIC, target.id, group="alpha", key=target.key).groups["alpha"]
            except UnknownMessage:  # handled and collected already
                answers[target.offset] = CancelStatus.DONE
    wait_until(lambda: all(passed("alpha", m) for m in messages), timeout=60,
               what="the watermark past every message", watch=[worker])
    time.sleep(0.5)  # a handler still finishing would write its end marker now
    for message in messages:
        assert started(message.offset) == ended(message.offset), message
        answer = answers.get(message.offset)
        if answer is CancelStatus.CANCELLED:
            assert not started(message.offset), message
        else:
            assert ended(message.offset), (message, answer)
    counts = {status: list(answers.values()).count(status) for status in CancelStatus}
    print("race answers:", counts)
    assert counts[CancelStatus.CANCELLED] > 0


def test_cancel_races_a_strict_worker_whose_keys_wait_in_its_memory(workers):
    # Strict mode, three keys: most messages wait in the window behind their key's head
    # when they are cancelled, so the worker must drop them from memory, not hand them out.
    worker = workers.start("racer", "--topic", TOPIC, "--group", "gamma", settings=FAST_GC)
    wait_until(lambda: worker.leases() == 4, what="the worker's leases", watch=[worker])
    rng = random.Random(11)
    answers: dict[int, CancelStatus] = {}
    messages = []
    for n in range(45):
        message = sqlqueue.publish(TOPIC, {"sleep": 0.02}, key=f"k{n % 3}", id=f"strict{n}")
        messages.append(message)
        time.sleep(rng.uniform(0, 0.02))
        if rng.random() < 0.5:
            target = messages[max(0, n - rng.randint(0, 6))]
            if target.offset not in answers:
                try:
                    answers[target.offset] = sqlqueue.cancel(
                        TOPIC, target.id, group="gamma", key=target.key).groups["gamma"]
                except UnknownMessage:
                    answers[target.offset] = CancelStatus.DONE
    wait_until(lambda: all(passed("gamma", m) for m in messages), timeout=60,
               what="the watermark past every message", watch=[worker])
    time.sleep(0.5)
    for message in messages:
        assert started(message.offset) == ended(message.offset), message
        if answers.get(message.offset) is CancelStatus.CANCELLED:
            assert not started(message.offset), message
        else:
            assert ended(message.offset), (message, answers.get(message.offset))
    for key in ("k0", "k1", "k2"):  # each key's messages ran in log order
        runs = list(Handled.objects.filter(topic=TOPIC, key=key).order_by("id")
                    .values_list("offset", flat=True))
        assert runs == sorted(runs), key
    print("strict race answers:", {s: list(answers.values()).count(s) for s in CancelStatus})


# A worker whose main loop stalls past its messages' visibility timeout but not past its
# leases: nothing redelivers them, nothing extends them, and a cancellation must still
# tell a started handler from one that has not started.
STALL = {**FAST_GC, "VISIBILITY_TIMEOUT": 1.0, "LEASE_DURATION": 20.0, "RENEW_INTERVAL": 1.0}
STALL_SECONDS = 2.5


def stalled_cancel(worker, message: sqlqueue.StoredMessage) -> CancelStatus:  # type: ignore[no-untyped-def]
    """Cancel ``message`` for group alpha while ``worker`` is stopped past the message's
    visibility; the worker goes on once the answer is in."""
    worker.send(signal.SIGSTOP)
    try:
        time.sleep(STALL_SECONDS)
        return sqlqueue.cancel(TOPIC, message.id, group="alpha", key=message.key).groups["alpha"]
    finally:
        worker.send(signal.SIGCONT)


def start_stalling(workers):  # type: ignore[no-untyped-def]
    worker = workers.start("stalling", "--topic", TOPIC, "--group", "alpha", "--concurrency",
                           "1", settings=STALL)
    wait_until(lambda: worker.leases() == 4, what="the worker's leases", watch=[worker])
    return worker


def test_a_handler_running_through_a_stall_past_its_visibility_is_reported_running(workers):
    worker = start_stalling(workers)
    message = sqlqueue.publish(TOPIC, {"sleep": 4}, key="k1", id="stalled-running")
    wait_until(lambda: started(message.offset), what="its handler starting", watch=[worker])

    answer = stalled_cancel(worker, message)

    assert answer is CancelStatus.RUNNING
    wait_until(lambda: ended(message.offset), what="the handler ending", watch=[worker])
    wait_until(lambda: passed("alpha", message), what="its outcome recorded", watch=[worker])
    assert not Cancellation.objects.filter(message_offset=message.offset).exists()


def test_a_message_waiting_for_a_thread_through_a_stall_is_reported_running_and_runs(workers):
    worker = start_stalling(workers)
    busy = sqlqueue.publish(TOPIC, {"sleep": 4}, key="k1", id="stalled-busy")
    wait_until(lambda: started(busy.offset), what="the busy handler starting", watch=[worker])
    queued = sqlqueue.publish(TOPIC, {"sleep": 0}, key="k2", id="stalled-queued")
    wait_until(lambda: DeliveryState.objects.filter(
        consumer_group="alpha", message_offset=queued.offset, retry_count__gte=0).exists(),
        what="the second message handed out to wait for the one thread", watch=[worker])

    answer = stalled_cancel(worker, queued)

    wait_until(lambda: ended(busy.offset), what="the busy handler ending", watch=[worker])
    wait_until(lambda: passed("alpha", queued), what="the watermark past the queued message",
               watch=[worker])
    time.sleep(0.5)  # a handler starting late would have recorded its start by now
    if answer is CancelStatus.CANCELLED:
        assert not started(queued.offset)
    else:
        assert answer is CancelStatus.RUNNING and ended(queued.offset), answer
    # Handed out, it starts as soon as a thread is free: it counts as started.
    assert answer is CancelStatus.RUNNING
