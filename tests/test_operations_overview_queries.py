"""The overview's cost does not grow with its rows: one query per kind of figure, the same
for one topic x group row as for twenty (the admin page, ``stats``, ``health`` and the
metrics all read it)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqlqueue import operations as ops
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    QueueMessage,
    SubscriberHeartbeat,
    Throughput,
)
from django_sqlqueue.models.throughput import MINUTE_MS
from tests.helpers import now_ms
from tests.test_operations import dead_letter, publish, register

pytestmark = pytest.mark.django_db

# now, lag per watermark row, parked messages, heartbeats, controls, throughput, unsequenced
# messages, dead letters, delivery windows; MariaDB/MySQL read the watermarks before the lag (see
# ConsumerOffsetManager.lag_figures); PostgreSQL turns JIT off and back on around them.
OVERVIEW_QUERIES = {"mysql": 10, "postgresql": 11}.get(connection.vendor, 9)


def arrange(topics: int, groups: int, prefix: str = "") -> int:
    """``topics`` x ``groups`` registered rows, each with lag, an out-of-order ack, a
    message in flight, a dead letter, a live worker and throughput; one of them paused.
    Returns the row count."""
    now = now_ms()
    for t in range(topics):
        topic = f"{prefix}topic{t}"
        stored = publish(4, key="k", topic=topic)
        publish(3, key="other", topic=topic)
        partition = QueueMessage.objects.get(offset=stored[0].offset).partition_key
        for g in range(groups):
            group = f"group{g}"
            register(group, topic)
            ConsumerOffset.objects.filter(consumer_group=group, topic=topic,
                                          partition_key=partition).update(
                offset_acked=QueueMessage.objects.get(offset=stored[0].offset).position)
            dead_letter(group, stored[1], topic=topic)
            DeliveryState.objects.create(
                consumer_group=group, topic=topic, partition_key=partition,
                message_offset=stored[2].offset, acked=False, invisible_until=now + 60_000,
                retry_count=0, last_error="")
            DeliveryState.objects.create(
                consumer_group=group, topic=topic, partition_key=partition,
                message_offset=stored[3].offset, acked=True, invisible_until=0,
                retry_count=0, last_error="")
            SubscriberHeartbeat.objects.create(consumer_group=group, topic=topic,
                                               subscriber_name=f"w-{group}",
                                               # Live for the whole test, however slow
                                               # the machine is while the rows are made.
                                               heartbeat_at=now_ms() + 60_000)
            Throughput.objects.create(minute=now - now % MINUTE_MS, consumer_group=group,
                                      topic=topic, subscriber_name=f"w-{group}", handled=3,
                                      failed=1)
    GroupControl.objects.set_paused("group0", f"{prefix}topic0", True, "test", "default")
    publish(2, key="late", topic=f"{prefix}topic0")  # published, not sequenced...
    return topics * groups


def overview_queries() -> tuple[int, list]:
    with CaptureQueriesContext(connection) as queries:
        rows = ops.overview()
    return len(queries), rows


@pytest.mark.parametrize(("topics", "groups"), [(1, 1), (5, 4)])
def test_the_overview_reads_one_query_per_kind_of_figure(topics, groups, django_assert_num_queries):
    count = arrange(topics, groups)

    with django_assert_num_queries(OVERVIEW_QUERIES):
        rows = ops.overview()

    assert len(rows) == count
    for row in rows:
        # 7 published, 1 acked in order and 1 out of order (+2 unsequenced on topic0)
        assert row.lag == (7 if row.topic == "topic0" else 5)
        assert row.in_flight == 1 and row.dead_letters == 1
        assert row.workers == 1 and row.partitions == 12
        # The figures' minute is the last one, or the one before if a minute began
        # while the rows were written.
        assert sum(row.handled_per_minute[-2:]) == 3 and sum(row.failed_per_minute[-2:]) == 1
        assert row.oldest_pending_age_seconds is not None
        assert row.paused == ((row.topic, row.group) == ("topic0", "group0"))


def test_the_overview_page_sends_as_many_queries_for_twenty_rows_as_for_one(admin_client):
    url = reverse("admin:django_sqlqueue_overview")
    arrange(1, 1)
    admin_client.get(url)  # the session and the user, loaded once
    with CaptureQueriesContext(connection) as one:
        response = admin_client.get(url)
    assert len(response.context["rows"]) == 1
    arrange(5, 4, prefix="more-")
    with CaptureQueriesContext(connection) as twenty:
        response = admin_client.get(url)

    assert len(response.context["rows"]) == 21  # topic0/group0 of the first call, and 20
    assert len(twenty) == len(one), [q["sql"][:120] for q in twenty.captured_queries]


def test_the_overview_leaves_the_sessions_jit_setting_as_it_found_it():
    if connection.vendor != "postgresql":
        pytest.skip("JIT is PostgreSQL's")
    arrange(1, 1)
    with connection.cursor() as cursor:
        cursor.execute("SET jit = on")
        ops.overview()
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "on"
