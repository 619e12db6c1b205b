"""Dead letters a person or a program can work with."""

from __future__ import annotations

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import QueueMessage
from tests.testapp.models import Handled
from tests.worker_harness import position_of, wait_until, watermark, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def test_a_dead_letter_handler_learns_the_group_origin_error_and_attempts(workers):
    original = sqlqueue.publish("poison", {"order": 7}, key="c-1", id="order-7")
    failing = workers.start("failing", "--topic", "poison")
    triage = workers.start("triage", "--topic", "poison_dlq")

    seen = wait_until(lambda: Handled.objects.filter(topic="poison_dlq").first(),
                      what="the dead letter handled", watch=[failing, triage])
    assert seen.key == "c-1"
    info = seen.payload
    assert info["group"] == "billing"
    assert info["original_topic"] == "poison"
    assert info["original_offset"] == original.offset
    assert info["original_id"] == "order-7"
    assert info["attempts"] == 3
    assert "poison message" in info["error"]


def test_a_dead_letter_is_kept_even_when_its_original_was_collected_meanwhile(workers):
    original = sqlqueue.publish("vanishing", {"order": 8}, key="c-2", id="order-8")
    worker = workers.start("vanishing", "--topic", "vanishing")

    wait_until(lambda: watermark("billing", "vanishing", "c-2") > 0,
               what="the message settled", watch=[worker])
    copy = QueueMessage.objects.get(topic="vanishing_dlq")
    assert copy.payload == {"order": 8}
    assert (copy.message_key, copy.original_offset, copy.original_id) == (
        "c-2", original.offset, "order-8")
    assert copy.consumer_group == "billing" and "gone" in copy.last_error
    assert position_of(original.offset) is None  # the original really was gone
