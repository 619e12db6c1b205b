"""Nothing one message does stalls the rest of a worker.

Each test makes a single message (or handler, or signal receiver) misbehave in a way that
once stopped every partition of its worker, and checks that the worker's other messages
are handled meanwhile and that the bad one ends somewhere defined.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import DeliveryState, QueueMessage
from tests.testapp.models import Handled
from tests.worker_harness import position_of, wait_until, watermark, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def handled(topic: str) -> set[int]:
    return set(Handled.objects.filter(topic=topic).values_list("offset", flat=True))


def attempts(offset: int) -> list[int]:
    return sorted(Handled.objects.filter(offset=offset).values_list("attempt", flat=True))


def good_messages(topic: str, count: int = 5) -> set[int]:
    return {m.offset for m in sqlqueue.publish_many(
        topic, [{"payload": {"n": n}, "key": f"good-{n}"} for n in range(count)])}


def test_outcomes_with_unstorable_delays_or_errors_do_not_stall_other_keys(workers):
    bad = {
        "infinite": sqlqueue.publish("hostile", {"retry_delay": "inf"}, key="inf"),
        "nan": sqlqueue.publish("hostile", {"retry_delay": "nan"}, key="nan"),
        "huge": sqlqueue.publish("hostile", {"retry_delay": 1e300}, key="huge"),
        "nul": sqlqueue.publish("hostile", {"error": "a NUL <NUL> in the text"}, key="nul"),
        "surrogate": sqlqueue.publish("hostile", {"error": "file <SURROGATE>.txt"}, key="sur"),
        "backoff": sqlqueue.publish("badbackoff", {"fail": True}, key="nan-backoff"),
    }
    worker = workers.start("hostile", "--topic", "hostile", "--topic", "badbackoff")
    wait_until(lambda: all(handled("hostile") >= {m.offset} for m in bad.values()
                           if m.topic == "hostile"), what="the bad messages' first runs",
               watch=[worker])
    good = good_messages("hostile") | good_messages("badbackoff")

    wait_until(lambda: handled("hostile") | handled("badbackoff") >= good,
               what="the other keys' messages", watch=[worker])
    # The failing texts run out of attempts and reach the dead-letter topic, stored
    # with the offending characters made visible instead of rejected by the database.
    for name in ("nul", "surrogate"):
        wait_until(lambda name=name: QueueMessage.objects.filter(
            topic="hostile_dlq", original_offset=bad[name].offset).exists(),
            what=f"the {name} message dead-lettered", watch=[worker])
    nul_error = QueueMessage.objects.get(original_offset=bad["nul"].offset).last_error
    assert "\x00" not in nul_error and "a NUL" in nul_error
    surrogate_error = QueueMessage.objects.get(original_offset=bad["surrogate"].offset).last_error
    assert "file" in surrogate_error
    surrogate_error.encode("utf-8")  # storable: no lone surrogate left
    # A retry asked for after an impossible delay is a handler error: retried with backoff
    # until it is dead-lettered like any failure.
    for name in ("infinite", "nan"):
        wait_until(lambda name=name: QueueMessage.objects.filter(
            topic="hostile_dlq", original_offset=bad[name].offset).exists(),
            what=f"the {name}-delay retry dead-lettered", watch=[worker])
    # A huge delay is capped: the message waits, and keeps its row, instead of failing.
    state = DeliveryState.objects.get(topic="hostile", message_offset=bad["huge"].offset)
    assert not state.acked and state.invisible_until > time.time() * 1000 + 86_400_000
    # A backoff that returns NaN or raises falls back to the default backoff.
    wait_until(lambda: len(attempts(bad["backoff"].offset)) >= 2,
               what="the message with a broken backoff retried", timeout=30, watch=[worker])
    assert "unexpected error" not in worker.stderr


def test_signal_receivers_that_raise_do_not_stop_delivery(workers):
    messages = sqlqueue.publish_many("loud", [
        {"payload": {"n": 1}, "key": "a"}, {"payload": {"n": 2}, "key": "b"},
        {"payload": {"fail": True}, "key": "c"},
    ])
    worker = workers.start("loud", "--topic", "loud")

    wait_until(lambda: handled("loud") >= {m.offset for m in messages},
               what="every message handled", watch=[worker])
    failing = messages[2]
    wait_until(lambda: QueueMessage.objects.filter(topic="loud_dlq",
                                                   original_offset=failing.offset).exists(),
               what="the failing message dead-lettered", watch=[worker])
    for message in messages[:2]:
        wait_until(lambda m=message: watermark("billing", "loud", m.key) >= position_of(m.offset),
                   what="the handled messages acked", watch=[worker])
    assert attempts(messages[0].offset) == [1]
    wait_until(lambda: "signal receiver failed" in worker.stderr,
               what="the receivers' failures logged", watch=[worker])


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer at a time")
def test_extend_visibility_inside_the_handlers_own_transaction_stalls_nothing(workers):
    worker = workers.start("txextend", "--topic", "txextend", "--concurrency", "4")
    # Extended by 1 s from inside a transaction held for 4 s: the worker's own extension of
    # it (visibility 2 s) is due while that transaction is still open.
    holder = sqlqueue.publish("txextend", {"hold": 4, "extend": 1}, key="holder")
    # (Its Handled row commits with its transaction: watch its delivery row instead.)
    wait_until(lambda: DeliveryState.objects.filter(message_offset=holder.offset).exists(),
               what="the holding handler", watch=[worker])
    time.sleep(1.5)
    others = good_messages("txextend")

    wait_until(lambda: handled("txextend") >= others, what="the other keys' messages",
               watch=[worker])
    wait_until(lambda: watermark("billing", "txextend", "holder") >= position_of(holder.offset),
               what="the holder acked", watch=[worker])
    started = Handled.objects.get(offset=holder.offset).handled_at
    finished_others = max(Handled.objects.filter(offset__in=others)
                          .values_list("handled_at", flat=True))
    assert finished_others < started + 4  # handled while the holder's transaction was open
    assert attempts(holder.offset) == [1]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite case")
def test_extend_visibility_inside_a_transaction_on_sqlite_is_a_clear_error(workers):
    worker = workers.start("txextend", "--topic", "txextend")
    sqlqueue.publish("txextend", {"hold": 0.1, "extend": 1}, key="holder")
    wait_until(lambda: "cannot extend visibility inside transaction.atomic on SQLite"
               in worker.stderr, what="the error in the log", watch=[worker])


def test_a_handler_past_max_handler_time_is_no_longer_extended(workers):
    worker = workers.start("capped", "--topic", "slow", "--concurrency", "2",
                           settings={"MAX_HANDLER_TIME": 1.0})
    message = sqlqueue.publish("slow", {"sleep": 6}, key="hung")

    # Visibility 2 s, extension stops after 1 s: redelivered while the first run still runs.
    wait_until(lambda: attempts(message.offset) == [1, 2], timeout=15,
               what="the message redelivered", watch=[worker])
    assert "MAX_HANDLER_TIME" in worker.stderr


def test_sigterm_ends_the_worker_after_the_grace_period_despite_a_hung_handler(workers):
    worker = workers.start("hung", "--topic", "slow", settings={"SHUTDOWN_GRACE": 2.0})
    message = sqlqueue.publish("slow", {"sleep": 120}, key="hung")
    wait_until(lambda: attempts(message.offset), what="the hung handler", watch=[worker])

    worker.terminate()
    assert worker.wait_exit(timeout=10) == 3
    assert "still running" in worker.stderr


def test_without_auto_extend_time_queued_in_the_worker_does_not_count(workers):
    messages = sqlqueue.publish_many("unextended", [
        {"payload": {"sleep": 0.25}, "key": f"k{n}"} for n in range(30)])
    # One thread, visibility 1 s: 30 messages of 0.25 s only fit if none waits in a queue
    # with its visibility running.
    worker = workers.start("single", "--topic", "unextended", "--concurrency", "1")

    wait_until(lambda: handled("unextended") >= {m.offset for m in messages}, timeout=40,
               what="every message handled", watch=[worker])
    time.sleep(1.5)  # a redelivery would have happened by now
    runs = Handled.objects.filter(topic="unextended").count()
    assert runs == 30
    assert not QueueMessage.objects.filter(topic="unextended_dlq").exists()


def test_a_late_failure_of_a_superseded_run_does_not_dead_letter_an_acked_message(workers):
    worker = workers.start("late", "--topic", "latefail", "--concurrency", "2")
    message = sqlqueue.publish("latefail", {}, key="late")

    wait_until(lambda: attempts(message.offset) == [1, 2], what="the redelivery",
               watch=[worker])
    wait_until(lambda: watermark("billing", "latefail", "late") >= position_of(message.offset),
               what="the second run's ack", watch=[worker])
    time.sleep(1.5)  # the first run fails after 1.6 s
    assert not QueueMessage.objects.filter(topic="latefail_dlq").exists()
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(timeout=10) == 0


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no row locks")
def test_gc_meeting_a_row_another_transaction_holds_stalls_nothing(workers):
    from django.db import connections

    settings = {"GC_INTERVAL": 1.0, "LEASE_DURATION": 6.0, "RENEW_INTERVAL": 2.0}
    first = sqlqueue.publish_many("manykeys", [
        {"payload": {"n": n}, "key": f"a{n}"} for n in range(20)])
    worker = workers.start("collector", "--topic", "manykeys", settings=settings)
    wait_until(lambda: all(position_of(m.offset) for m in first), what="the messages sequenced",
               watch=[worker])
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:  # hold a collectable row, as a forgotten transaction does
            cursor.execute(f"SELECT * FROM queue_messages WHERE {holder.ops.quote_name('offset')}"
                           " = %s FOR UPDATE", [first[0].offset])
        wait_until(lambda: handled("manykeys") >= {m.offset for m in first},
                   what="the first messages handled", watch=[worker])
        time.sleep(2.5)  # GC has met the held row by now, more than once
        later = sqlqueue.publish_many("manykeys", [
            {"payload": {"n": n}, "key": f"b{n}"} for n in range(30)])
        wait_until(lambda: handled("manykeys") >= {m.offset for m in later}, timeout=8,
                   what="new messages handled while GC waits", watch=[worker])
        time.sleep(5)  # past the lease: it was renewed meanwhile
        assert "lease lost" not in worker.stderr
        assert "gc postponed" in worker.stderr
    finally:
        holder.rollback()
        holder.close()
    # Once the row is free, GC collects it.
    wait_until(lambda: not QueueMessage.objects.filter(offset=first[0].offset).exists(),
               what="the row collected once free", watch=[worker])
    assert Handled.objects.filter(topic="manykeys").count() == 50


def keys_of_each_partition(topic: str, partitions: int, prefix: str) -> list[str]:
    """One key per partition of ``topic``, in partition order."""
    from django_sqlqueue.partitioning import partition_for

    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        key = f"{prefix}{n}"
        found.setdefault(partition_for(key, partitions), key)
        n += 1
    return [found[p] for p in range(partitions)]


def test_a_hung_handler_does_not_keep_a_partition_being_handed_over(workers):
    """A worker asked to give a partition away (a peer joined) waits for its handlers;
    one hung past MAX_HANDLER_TIME must not make it keep the partition for good."""
    fast = {"MAX_HANDLER_TIME": 1.0, "VISIBILITY_TIMEOUT": 2.0}
    first = workers.start("stuck-a", "--topic", "stuck", settings=fast)
    hung = [sqlqueue.publish("stuck", {"hang": 60}, key=key)
            for key in keys_of_each_partition("stuck", 2, "hung-")]  # one in each partition
    wait_until(lambda: all(attempts(m.offset) for m in hung), what="both hung handlers",
               watch=[first])
    second = workers.start("stuck-b", "--topic", "stuck", settings=fast)

    # The partition given away reaches the peer once its hung handler is given up on.
    wait_until(lambda: second.leases() == 1, timeout=20,
               what="the peer taking the partition given away", watch=[first, second])
    later = sqlqueue.publish_many("stuck", [{"payload": {"n": n}, "key": key}
                                            for n, key in enumerate(
                                                keys_of_each_partition("stuck", 2, "later-") * 3)])
    wait_until(lambda: handled("stuck") >= {m.offset for m in later}, timeout=20,
               what="the later messages of both partitions", watch=[first, second])
    wait_until(lambda: any(attempts(m.offset) == [1, 2] for m in hung), timeout=15,
               what="the hung message of the handed-over partition redelivered",
               watch=[first, second])
