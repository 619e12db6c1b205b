"""Admin actions against real runqueueworker processes: replay after GC, pause and resume."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.urls import reverse

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations
from django_sqlqueue.models import DeadLetter, QueueMessage
from tests.testapp.models import Handled
from tests.worker_harness import wait_stable, wait_until, worker_pool

pytestmark = pytest.mark.worker

DEAD_LETTERS = reverse("admin:django_sqlqueue_deadletter_changelist")
OVERVIEW = reverse("admin:django_sqlqueue_overview")
FAST_GC = {"GC_INTERVAL": 0.2}


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def runs(group: str, **filters) -> int:
    return Handled.objects.filter(group=group, topic="checkout", **filters).count()


def lag(group: str) -> int:
    return next(r.lag for r in operations.overview(topic="checkout") if r.group == group)


def test_a_replay_from_the_admin_reaches_only_the_group_that_failed_even_after_gc(
        workers, admin_client, tmp_path: Path):
    broken = tmp_path / "payments-broken"
    broken.touch()
    original = sqlqueue.publish("checkout", {"customer_id": 42, "broken_while": str(broken)},
                                key="cart-1")
    worker = workers.start("w", "--topic", "checkout", settings=FAST_GC)
    letter = wait_until(lambda: DeadLetter.objects.filter(consumer_group="payments").first(),
                        what="the payments dead letter", watch=[worker])
    assert letter.original_offset == original.offset
    wait_until(lambda: not QueueMessage.objects.filter(offset=original.offset).exists(),
               what="GC deleting the original", watch=[worker])
    assert runs("emails") == 1 and runs("payments") == 3
    broken.unlink()  # the fix is deployed
    query = "?" + urlencode({"q": "customer_id=42"})
    response = admin_client.post(DEAD_LETTERS + query, {
        "action": "replay_dead_letters", "index": "0", "select_across": "1",
        "_selected_action": [str(letter.offset)], "sqlqueue_confirm": "yes"}, follow=True)
    assert "Replayed 1 dead letter" in response.content.decode()
    wait_until(lambda: runs("payments") == 4, what="the replay handled", watch=[worker])
    wait_stable(lambda: (runs("emails"), runs("payments"), lag("payments"), lag("emails")),
                (1, 4, 0, 0), hold=1.0, watch=[worker])
    replayed = Handled.objects.filter(group="payments").order_by("-pk").first()
    assert replayed.message_id == original.id and replayed.payload["customer_id"] == 42
    assert not DeadLetter.objects.exists()


def test_pause_from_the_admin_stops_a_real_worker_and_resume_goes_on(workers, admin_client):
    worker = workers.start("w", "--topic", "checkout")
    sqlqueue.publish("checkout", {"n": 0}, key="a")
    wait_until(lambda: runs("payments") == 1 and runs("emails") == 1, watch=[worker])
    admin_client.post(OVERVIEW, {"action": "pause", "group": "payments", "topic": "checkout"})
    wait_until(lambda: "paused by an operator group=payments topic=checkout"
               in worker.stdout + worker.stderr, what="the worker seeing the pause",
               watch=[worker])
    for n in range(1, 4):
        sqlqueue.publish("checkout", {"n": n}, key=f"k{n}")
    wait_until(lambda: runs("emails") == 4, what="emails going on", watch=[worker])
    wait_stable(lambda: runs("payments"), 1, hold=1.0, watch=[worker])
    page = admin_client.get(OVERVIEW)
    payments = next(r for r in page.context["rows"] if r["group"] == "payments")
    assert payments["paused"] and payments["lag"] == 3
    admin_client.post(OVERVIEW, {"action": "resume", "group": "payments", "topic": "checkout"})
    wait_until(lambda: runs("payments") == 4, what="payments resuming", watch=[worker])
    wait_until(lambda: lag("payments") == 0, watch=[worker])
