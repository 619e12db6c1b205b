"""The message log, partitions and subscribers pages: rows, filters, actions, permissions."""

from __future__ import annotations

import html

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqlqueue import publish
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
)
from django_sqlqueue.sequencing import sequence_pending
from tests.admin_fixtures import client_for, dead_letter, staff

pytestmark = pytest.mark.django_db

MESSAGES = reverse("admin:django_sqlqueue_queuemessage_changelist")
PARTITIONS = reverse("admin:django_sqlqueue_partition_changelist")
SUBSCRIBERS = reverse("admin:django_sqlqueue_subscriber_changelist")


def db_now() -> int:
    return LogSequencer.objects.head("default")[2]


def sequenced(topic: str, count: int, **kwargs) -> list[QueueMessage]:
    stored = [publish(topic, {"n": n}, **kwargs) for n in range(count)]
    sequence_pending("default")
    return list(QueueMessage.objects.filter(offset__in=[s.offset for s in stored]).order_by("offset"))


# --------------------------------------------------------------------------- messages


def test_the_log_lists_messages_newest_first_filterable_by_topic_and_partition(admin_client):
    orders = sequenced("orders", 6, key="k1") + sequenced("orders", 2, key="k2")
    sequenced("invoices", 3)
    every = admin_client.get(MESSAGES)
    assert every.status_code == 200
    assert len(every.context["cl"].result_list) == 11
    by_topic = admin_client.get(MESSAGES, {"topic": "orders"})
    assert {m.offset for m in by_topic.context["cl"].result_list} == {m.offset for m in orders}
    partition = orders[0].partition_key
    in_partition = admin_client.get(MESSAGES, {"topic": "orders", "partition": partition})
    assert {m.offset for m in in_partition.context["cl"].result_list} == {
        m.offset for m in orders if m.partition_key == partition}
    assert f"partition={partition}" in in_partition.content.decode()


def test_a_message_page_shows_every_groups_delivery_state(admin_client):
    message = sequenced("orders", 1, key="k")[0]
    part = message.partition_key
    ConsumerOffset.objects.ensure("billing", "orders", [part], using="default")
    ConsumerOffset.objects.ensure("shipping", "orders", [part], using="default")
    ConsumerOffset.objects.ensure("audit", "orders", [part], using="default")
    ConsumerOffset.objects.ensure("archive", "orders", [part], using="default")
    ConsumerOffset.objects.filter(consumer_group="audit").update(offset_acked=message.position)
    DeliveryState.objects.create(consumer_group="billing", topic="orders", partition_key=part,
                                 message_offset=message.offset, retry_count=2,
                                 invisible_until=db_now() + 60_000,
                                 last_error="RuntimeError: <card> declined")
    QueueMessage.objects.copy_to_dead_letters(
        __import__("django_sqlqueue.models.messages", fromlist=["x"]).DeadLetterSource(
            message.offset, "orders", "k", message.message_id, "{}", "{}", 0),
        "orders_dlq", "shipping", 5, "gave up", using="default")
    response = admin_client.get(
        reverse("admin:django_sqlqueue_queuemessage_change", args=[message.offset]))
    assert response.status_code == 200
    states = {d.group: d for d in response.context["sqlqueue_deliveries"]}
    assert states["audit"].state == "acked"
    assert states["archive"].state == "not read yet"
    assert states["shipping"].state == "dead-lettered" and states["shipping"].dead_letter
    assert states["billing"].state == "retrying after a backoff"
    assert states["billing"].attempts == 3 and states["billing"].waiting
    text = response.content.decode()
    assert "RuntimeError: &lt;card&gt; declined" in text
    assert "<card>" not in text


def test_the_message_page_reads_a_fixed_number_of_queries_whatever_the_groups(admin_client):
    message = sequenced("orders", 1)[0]
    url = reverse("admin:django_sqlqueue_queuemessage_change", args=[message.offset])
    ConsumerOffset.objects.ensure("g0", "orders", [message.partition_key], using="default")
    admin_client.get(url)
    with CaptureQueriesContext(connection) as one:
        admin_client.get(url)
    for n in range(1, 8):
        ConsumerOffset.objects.ensure(f"g{n}", "orders", [message.partition_key], using="default")
    with CaptureQueriesContext(connection) as eight:
        response = admin_client.get(url)
    assert len(response.context["sqlqueue_deliveries"]) == 8
    assert len(eight.captured_queries) == len(one.captured_queries)


def test_the_log_is_read_only(admin_client):
    message = sequenced("orders", 1)[0]
    assert admin_client.get(reverse("admin:django_sqlqueue_queuemessage_add")).status_code == 403
    page = admin_client.get(reverse("admin:django_sqlqueue_queuemessage_change", args=[message.offset]))
    assert 'name="_save"' not in page.content.decode()
    assert admin_client.post(reverse("admin:django_sqlqueue_queuemessage_delete",
                                     args=[message.offset])).status_code == 403
    assert QueueMessage.objects.filter(offset=message.offset).exists()


# --------------------------------------------------------------------------- partitions


def test_the_partitions_page_shows_owner_lease_age_staleness_watermark_and_lag(admin_client):
    messages = sequenced("slow", 5)  # one partition
    now = db_now()
    ConsumerOffset.objects.ensure("billing", "slow", ["0"], using="default")
    ConsumerOffset.objects.ensure("audit", "slow", ["0"], using="default")
    ConsumerOffset.objects.filter(consumer_group="billing").update(offset_acked=messages[1].position)
    ConsumerOffset.objects.filter(consumer_group="audit").update(offset_acked=messages[4].position)
    PartitionLease.objects.create(consumer_group="billing", topic="slow", partition_key="0",
                                  leased_by="w-1", leased_at=now - 120_000,
                                  lease_renewed_at=now - 60_000, generation=1)
    PartitionLease.objects.create(consumer_group="audit", topic="slow", partition_key="0",
                                  leased_by="w-2", leased_at=now - 5_000,
                                  lease_renewed_at=now, generation=1)
    response = admin_client.get(PARTITIONS)
    assert response.status_code == 200
    rows = {r["group"]: r for r in response.context["rows"]}
    assert rows["billing"]["owner"] == "w-1" and rows["billing"]["stale"]
    assert rows["billing"]["lease_age"] == "2 min"
    assert rows["billing"]["lag"] == 3 and rows["billing"]["watermark"] == messages[1].position
    assert rows["billing"]["newest"] == messages[4].position
    assert rows["billing"]["oldest"] != "-"
    assert rows["audit"]["lag"] == 0 and not rows["audit"]["stale"]
    assert rows["audit"]["oldest"] == "-"
    only_audit = admin_client.get(PARTITIONS, {"group": "audit"})
    assert [r["group"] for r in only_audit.context["rows"]] == ["audit"]


def test_the_partitions_page_reads_a_fixed_number_of_queries(admin_client):
    sequenced("orders", 24)
    ConsumerOffset.objects.ensure("billing", "orders", ["0"], using="default")
    admin_client.get(PARTITIONS)
    with CaptureQueriesContext(connection) as one:
        admin_client.get(PARTITIONS)
    ConsumerOffset.objects.ensure("billing", "orders", [str(p) for p in range(12)], using="default")
    ConsumerOffset.objects.ensure("shipping", "orders", [str(p) for p in range(12)], using="default")
    with CaptureQueriesContext(connection) as many:
        response = admin_client.get(PARTITIONS)
    assert len(response.context["rows"]) == 24
    assert len(many.captured_queries) == len(one.captured_queries)


# --------------------------------------------------------------------------- subscribers


def beat(name: str, group: str = "billing", topic: str = "orders", age_ms: int = 0,
         stopped: bool = False) -> None:
    now = db_now()
    SubscriberHeartbeat.objects.create(consumer_group=group, topic=topic, subscriber_name=name,
                                       heartbeat_at=now - age_ms,
                                       deregistered_at=now if stopped else 0)


def test_the_subscribers_page_tells_live_stale_and_stopped_workers(admin_client):
    beat("w-live")
    beat("w-stale", age_ms=600_000)
    beat("w-stopped", group="retired", stopped=True)
    response = admin_client.get(SUBSCRIBERS)
    assert response.status_code == 200
    states = {r["name"]: r["state"] for r in response.context["rows"]}
    assert states == {"w-live": "live", "w-stale": "stale", "w-stopped": "stopped"}


def test_forget_retires_a_stopped_group_records_it_and_says_so(admin_client):
    beat("w-stopped", group="retired", stopped=True)
    ConsumerOffset.objects.ensure("retired", "orders", ["0", "1"], using="default")
    response = admin_client.post(SUBSCRIBERS, {"action": "forget", "group": "retired",
                                               "topic": "orders"}, follow=True)
    assert response.status_code == 200
    assert not ConsumerOffset.objects.filter(consumer_group="retired").exists()
    assert "Forgot consumer group &#x27;retired&#x27;" in response.content.decode()
    entry = LogEntry.objects.get()
    assert "retired" in entry.change_message


def test_forget_refuses_a_group_with_a_live_worker(admin_client):
    beat("w-live", group="billing")
    ConsumerOffset.objects.ensure("billing", "orders", ["0"], using="default")
    response = admin_client.post(SUBSCRIBERS, {"action": "forget", "group": "billing",
                                               "topic": "orders"}, follow=True)
    assert "running worker" in html.unescape(response.content.decode())
    assert ConsumerOffset.objects.filter(consumer_group="billing").exists()
    assert not LogEntry.objects.exists()


def test_forget_with_an_empty_topic_forgets_nothing_and_says_to_choose(admin_client):
    beat("w-stopped", group="retired", stopped=True)
    for topic in ("orders", "invoices"):
        ConsumerOffset.objects.ensure("retired", topic, ["0"], using="default")
    response = admin_client.post(SUBSCRIBERS, {"action": "forget", "group": "retired",
                                               "topic": ""}, follow=True)
    assert "choose &#x27;all topics&#x27;" in response.content.decode()
    assert set(ConsumerOffset.objects.filter(consumer_group="retired")
               .values_list("topic", flat=True)) == {"orders", "invoices"}
    assert not LogEntry.objects.exists()


def test_forget_on_all_topics_is_an_explicit_choice(admin_client):
    beat("w-stopped", group="retired", stopped=True)
    for topic in ("orders", "invoices"):
        ConsumerOffset.objects.ensure("retired", topic, ["0"], using="default")
    ConsumerOffset.objects.ensure("billing", "orders", ["0"], using="default")
    page = admin_client.get(SUBSCRIBERS).content.decode()
    assert 'name="all_topics" value="1"' in page
    response = admin_client.post(SUBSCRIBERS, {"action": "forget", "group": "retired",
                                               "all_topics": "1"}, follow=True)
    assert "Forgot consumer group &#x27;retired&#x27; on invoices, orders" in response.content.decode()
    assert not ConsumerOffset.objects.filter(consumer_group="retired").exists()
    assert ConsumerOffset.objects.filter(consumer_group="billing").exists()


def test_forget_refuses_a_topic_and_all_topics_together(admin_client):
    beat("w-stopped", group="retired", stopped=True)
    ConsumerOffset.objects.ensure("retired", "orders", ["0"], using="default")
    admin_client.post(SUBSCRIBERS, {"action": "forget", "group": "retired", "topic": "orders",
                                    "all_topics": "1"})
    assert ConsumerOffset.objects.filter(consumer_group="retired").exists()


def test_forget_is_offered_for_a_stale_group_and_retires_it(admin_client):
    # A worker killed with SIGKILL never deregisters: its heartbeat only goes stale.
    beat("w-killed", group="crashed", age_ms=600_000)
    beat("w-live", group="billing")
    ConsumerOffset.objects.ensure("crashed", "orders", ["0", "1"], using="default")
    response = admin_client.get(SUBSCRIBERS)
    text = response.content.decode()
    offered = {r.split('name="group" value="')[1].split('"')[0]
               for r in text.split('class="sqlqueue-inline sqlqueue-forget"')[1:]}
    assert offered == {"crashed"}
    response = admin_client.post(SUBSCRIBERS, {"action": "forget", "group": "crashed",
                                               "topic": "orders"}, follow=True)
    assert "Forgot consumer group &#x27;crashed&#x27;" in response.content.decode()
    assert not ConsumerOffset.objects.filter(consumer_group="crashed").exists()


def test_view_only_staff_see_the_pages_but_cannot_forget(db):
    beat("w-stopped", group="retired", stopped=True)
    ConsumerOffset.objects.ensure("retired", "orders", ["0"], using="default")
    client = client_for(staff("viewer", "view_subscriber", "view_partition",
                              "view_queuemessage"))
    page = client.get(SUBSCRIBERS)
    assert page.status_code == 200 and "Forget group" not in page.content.decode()
    assert client.get(PARTITIONS).status_code == 200
    assert client.get(MESSAGES).status_code == 200
    refused = client.post(SUBSCRIBERS, {"action": "forget", "group": "retired", "topic": "orders"})
    assert refused.status_code == 403
    assert ConsumerOffset.objects.filter(consumer_group="retired").exists()


def test_staff_without_view_permission_see_none_of_the_pages(db):
    client = client_for(staff("nobody"))
    for url in (MESSAGES, PARTITIONS, SUBSCRIBERS):
        assert client.get(url).status_code == 403


def test_the_admin_index_lists_the_pages(admin_client):
    dead_letter()
    text = admin_client.get(reverse("admin:index")).content.decode()
    for url in (MESSAGES, PARTITIONS, SUBSCRIBERS,
                reverse("admin:django_sqlqueue_deadletter_changelist")):
        assert url in text


def test_the_log_and_the_subscribers_page_read_a_fixed_number_of_queries(admin_client):
    sequenced("orders", 2)
    beat("w-0")
    for url in (MESSAGES, SUBSCRIBERS):
        admin_client.get(url)
        with CaptureQueriesContext(connection) as few:
            admin_client.get(url)
        sequenced("orders", 20)
        for n in range(1, 15):
            beat(f"w-{url[-3:]}-{n}", stopped=n % 2 == 0)
        with CaptureQueriesContext(connection) as many:
            response = admin_client.get(url)
        assert response.status_code == 200
        assert len(many.captured_queries) == len(few.captured_queries), url


def test_django_admin_cannot_register_the_composite_key_tables_hence_the_own_pages():
    from django.contrib.admin import AdminSite
    from django.core.exceptions import ImproperlyConfigured

    for model in (ConsumerOffset, PartitionLease, SubscriberHeartbeat, DeliveryState):
        with pytest.raises(ImproperlyConfigured, match="composite primary key"):
            AdminSite().register(model)
