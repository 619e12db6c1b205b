"""The overview page and the operator actions around it: pause and resume, release,
deliver now."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqlqueue import publish
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
)
from django_sqlqueue.sequencing import sequence_all
from tests.admin_fixtures import client_for, dead_letter, staff

pytestmark = pytest.mark.django_db

OVERVIEW = reverse("admin:django_sqlqueue_overview")
PARTITIONS = reverse("admin:django_sqlqueue_partition_changelist")


def db_now() -> int:
    return LogSequencer.objects.head("default")[2]


def registered(group: str, topic: str, partitions: int = 4) -> None:
    ConsumerOffset.objects.ensure(group, topic, [str(p) for p in range(partitions)], using="default")


def row(response, topic: str, group: str) -> dict:
    return next(r for r in response.context["rows"] if (r["topic"], r["group"]) == (topic, group))


def test_the_overview_shows_lag_dead_letters_workers_and_a_sparkline_per_group(admin_client):
    registered("billing", "orders", 12)
    registered("shipping", "orders", 12)
    for n in range(5):
        publish("orders", {"n": n}, key=f"k{n}")
    sequence_all()
    ConsumerOffset.objects.filter(consumer_group="shipping").update(offset_acked=10**9)
    dead_letter(topic="orders", group="shipping")
    SubscriberHeartbeat.objects.create(consumer_group="shipping", topic="orders",
                                       subscriber_name="w-1", heartbeat_at=db_now())
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    billing, shipping = row(response, "orders", "billing"), row(response, "orders", "shipping")
    assert billing["lag"] >= 5 and billing["workers"] == 0 and billing["trouble"]
    assert shipping["dead_letters"] == 1 and shipping["workers"] == 1
    text = response.content.decode()
    assert text.count('<svg class="sqlqueue-spark"') == len(response.context["rows"])
    assert text.count('<svg class="sqlqueue-lag"') == len(response.context["rows"])
    assert "original_topic=orders&amp;consumer_group=shipping" in text  # links to its dead letters
    assert "cdn" not in text.lower() and "<script src=\"http" not in text


def test_the_overview_is_linked_from_the_admin_index(admin_client):
    assert OVERVIEW in admin_client.get(reverse("admin:index")).content.decode()


def test_the_overview_shows_an_empty_queue_without_error(admin_client):
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    assert "No consumer group has registered" in response.content.decode()


def test_the_overview_renders_without_staticfiles(admin_client):
    from django.conf import settings
    assert "django.contrib.staticfiles" not in settings.INSTALLED_APPS
    registered("billing", "orders")
    with override_settings(STATIC_URL=None):
        assert admin_client.get(OVERVIEW).status_code == 200


def test_pause_and_resume_from_the_overview_are_recorded_and_reported(admin_client):
    registered("billing", "orders")
    paused = admin_client.post(OVERVIEW, {"action": "pause", "group": "billing",
                                          "topic": "orders"}, follow=True)
    assert "Paused consumer group" in paused.content.decode()
    assert GroupControl.objects.get(consumer_group="billing", topic="orders").paused
    assert row(paused, "orders", "billing")["paused"]
    resumed = admin_client.post(OVERVIEW, {"action": "resume", "group": "billing",
                                           "topic": "orders"}, follow=True)
    assert "Resumed consumer group" in resumed.content.decode()
    assert not GroupControl.objects.get(consumer_group="billing", topic="orders").paused
    assert [e.change_message.split(" ")[0] for e in LogEntry.objects.order_by("pk")] == [
        "Paused", "Resumed"]


def test_pausing_an_unregistered_group_says_why(admin_client):
    response = admin_client.post(OVERVIEW, {"action": "pause", "group": "nobody",
                                            "topic": "orders"}, follow=True)
    assert response.status_code == 200
    assert "nobody" in response.content.decode()
    assert not GroupControl.objects.exists() and not LogEntry.objects.exists()


def test_pause_and_resume_each_need_their_own_permission(db):
    registered("billing", "orders")
    viewer = client_for(staff("viewer", "view_overview"))
    page = viewer.get(OVERVIEW)
    assert page.status_code == 200 and 'value="pause"' not in page.content.decode()
    assert viewer.post(OVERVIEW, {"action": "pause", "group": "billing",
                                  "topic": "orders"}).status_code == 403
    pauser = client_for(staff("pauser", "view_overview", "pause_group"))
    pauser.post(OVERVIEW, {"action": "pause", "group": "billing", "topic": "orders"})
    assert GroupControl.objects.get().paused
    assert pauser.post(OVERVIEW, {"action": "resume", "group": "billing",
                                  "topic": "orders"}).status_code == 403
    assert GroupControl.objects.get().paused
    assert client_for(staff("nobody")).get(OVERVIEW).status_code == 403


def test_the_overview_query_count_grows_only_with_the_operations_per_row_reads(admin_client):
    registered("g0", "orders")
    admin_client.get(OVERVIEW)
    with CaptureQueriesContext(connection) as one:
        admin_client.get(OVERVIEW)
    registered("g1", "orders")
    with CaptureQueriesContext(connection) as two:
        admin_client.get(OVERVIEW)
    registered("g2", "orders")
    with CaptureQueriesContext(connection) as three:
        admin_client.get(OVERVIEW)
    per_row = len(two.captured_queries) - len(one.captured_queries)
    # The page adds nothing per row; operations.overview() reads a few indexed rows each.
    assert len(three.captured_queries) - len(two.captured_queries) == per_row
    assert per_row <= 4


# --------------------------------------------------------------------------- release


def test_release_frees_a_partition_lease_and_is_recorded(admin_client):
    registered("billing", "slow", 1)
    PartitionLease.objects.create(consumer_group="billing", topic="slow", partition_key="0",
                                  leased_by="w-1", leased_at=db_now(), lease_renewed_at=db_now(),
                                  generation=3)
    response = admin_client.post(PARTITIONS, {"action": "release", "group": "billing",
                                              "topic": "slow", "partition": "0"}, follow=True)
    assert "Released partition 0" in response.content.decode()
    assert PartitionLease.objects.get().leased_by == ""
    assert "Released partition 0" in LogEntry.objects.get().change_message


def test_release_needs_its_permission(db):
    registered("billing", "slow", 1)
    PartitionLease.objects.create(consumer_group="billing", topic="slow", partition_key="0",
                                  leased_by="w-1", leased_at=db_now(), lease_renewed_at=db_now(),
                                  generation=3)
    viewer = client_for(staff("viewer", "view_partition"))
    assert "Release" not in viewer.get(PARTITIONS).content.decode()
    assert viewer.post(PARTITIONS, {"action": "release", "group": "billing", "topic": "slow",
                                    "partition": "0"}).status_code == 403
    assert PartitionLease.objects.get().leased_by == "w-1"


# --------------------------------------------------------------------------- deliver now


def waiting_message() -> QueueMessage:
    """A message of 'orders' waiting out a retry backoff for 'billing'."""
    registered("billing", "orders", 12)
    stored = publish("orders", {"n": 1}, key="k")
    sequence_all()
    message = QueueMessage.objects.get(offset=stored.offset)
    DeliveryState.objects.create(consumer_group="billing", topic="orders",
                                 partition_key=message.partition_key,
                                 message_offset=message.offset, retry_count=1,
                                 invisible_until=db_now() + 3_600_000, last_error="boom")
    return message


def test_deliver_now_makes_a_waiting_message_due_for_that_group(admin_client):
    message = waiting_message()
    url = reverse("admin:django_sqlqueue_queuemessage_deliver", args=[message.offset])
    page = admin_client.get(reverse("admin:django_sqlqueue_queuemessage_change",
                                    args=[message.offset])).content.decode()
    assert url in page and "Deliver now" in page
    response = admin_client.post(url, {"group": "billing"}, follow=True)
    assert "deliverable to consumer group" in response.content.decode()
    state = DeliveryState.objects.get(consumer_group="billing", message_offset=message.offset)
    assert state.invisible_until <= db_now()
    assert LogEntry.objects.get().object_id == str(message.offset)


def test_deliver_now_needs_its_permission_and_a_post(db):
    message = waiting_message()
    url = reverse("admin:django_sqlqueue_queuemessage_deliver", args=[message.offset])
    viewer = client_for(staff("viewer", "view_queuemessage"))
    assert "Deliver now" not in viewer.get(reverse(
        "admin:django_sqlqueue_queuemessage_change", args=[message.offset])).content.decode()
    assert viewer.post(url, {"group": "billing"}).status_code == 403
    deliverer = client_for(staff("deliverer", "view_queuemessage", "deliver_message"))
    assert deliverer.get(url).status_code == 405
    state = DeliveryState.objects.get(consumer_group="billing", message_offset=message.offset)
    assert state.invisible_until > db_now()


def test_the_overview_warns_of_messages_no_worker_has_sequenced(admin_client):
    registered("billing", "orders")
    publish("orders", {"n": 1})
    publish("orders", {"n": 2})
    response = admin_client.get(OVERVIEW)
    assert response.context["unsequenced"] == 2
    assert "2 published messages not sequenced yet" in response.content.decode()
    sequence_all()
    assert "not sequenced yet" not in admin_client.get(OVERVIEW).content.decode()


def test_the_system_checks_pass_without_staticfiles():
    from django.conf import settings
    from django.core import checks

    assert "django.contrib.staticfiles" not in settings.INSTALLED_APPS
    assert [m for m in checks.run_checks() if m.level >= checks.ERROR] == []


def test_an_estimated_lag_is_marked_as_one(admin_client):
    from django_sqlqueue import publish_many
    registered("billing", "slow", 1)
    publish_many("slow", [{"payload": {"n": n}} for n in range(300)])
    sequence_all()
    response = admin_client.get(OVERVIEW)
    billing = row(response, "slow", "billing")
    assert billing["lag_estimated"] and billing["lag"] > 200
    assert f'data-lag="{billing["lag"]}" title="estimated' in response.content.decode()
