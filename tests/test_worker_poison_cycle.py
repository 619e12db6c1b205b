"""A message that makes its poll cycle fail is found and dead-lettered; its partition goes on.

The database itself refuses one message's hand-out, for good (a trigger, as a value no
check foresaw would): every cycle that hands it out fails, whatever else it holds. The
worker narrows the failing partition's cycle down to that message, in halves, and
dead-letters it with the error as its reason, within a bounded number of cycles; every
other message of the partition is handled.
"""

from __future__ import annotations

import math

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import DeadLetter
from django_sqlqueue.worker.isolation import RELEASE_AFTER
from tests.refusals import REFUSAL, refusing
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TOPIC = "slow"  # one partition: every message shares the poisoned one's cycles


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def handed_out(offset: int) -> str:
    """SQL true for the delivery row that hands message ``offset`` out (a hold row, or
    the acked row of a dead letter, is no hand-out)."""
    in_flight = "NEW.in_flight" if connection.vendor == "postgresql" else "NEW.in_flight = 1"
    return f"NEW.message_offset = {offset} AND {in_flight}"


def handled_offsets() -> set[int]:
    return set(Handled.objects.filter(topic=TOPIC).values_list("offset", flat=True))


def test_one_message_failing_every_cycle_it_is_in_is_dead_lettered_and_the_other_99_handled(
        workers):
    offsets = [m.offset for m in sqlqueue.publish_many(
        TOPIC, [{"payload": {"n": n}} for n in range(100)])]
    poisoned = offsets[37]

    with refusing("sqlqueue_test_poison_cycle", "queue_delivery_state", "INSERT",
                  handed_out(poisoned)):
        worker = workers.start("poisoned", "--topic", TOPIC, "--group", "billing")
        [(error, group)] = wait_until(
            lambda: list(DeadLetter.objects.filter(original_offset=poisoned)
                         .values_list("last_error", "consumer_group")),
            timeout=30, what="the poisoned message dead-lettered", watch=[worker])
        wait_until(lambda: handled_offsets() == set(offsets) - {poisoned}, timeout=15,
                   what="the 99 other messages handled", watch=[worker])

    assert group == "billing"
    assert f"its poll cycle failed {RELEASE_AFTER} times with only this message in it" in error
    assert REFUSAL in error
    # Halves down to the message, then its failures alone: a bounded number of cycles.
    narrowed = worker.stderr.count("poll cycle narrowed to some messages of a partition failed")
    assert narrowed <= math.ceil(math.log2(100)) + RELEASE_AFTER + 1, worker.stderr
    assert "dead-lettering a message its worker cannot handle" in worker.stderr
    assert f"offset={poisoned} " in worker.stderr
    assert "releasing a partition" not in worker.stderr
    assert worker.alive
