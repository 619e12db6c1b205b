"""The CLI and the overview know every topic that has messages, not only the ones a
worker has seen: ``cancel`` and ``stats --topic`` work on a topic published to before any
worker ran, a topic with messages and no consumer group is listed, and ``health --strict``
flags it and a @subscriber topic that has never had a message (a typo on either side)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations as ops
from django_sqlqueue.models import QueueMessage
from tests.worker_harness import run_manage

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_works_on_a_topic_no_worker_has_seen():
    sqlqueue.publish("fresh", {"n": 1}, key="k", id="first")

    result = run_manage("sqlqueue", "cancel", "--topic", "fresh", "--id", "first", timeout=60)

    assert result.returncode == 0, result.stderr
    assert "message 'first'" in result.stdout
    assert "groups registering later skip it" in result.stdout


def test_stats_lists_a_topic_with_messages_and_no_consumer_group():
    sqlqueue.publish("order", {"n": 1}, key="k")  # a typo of "orders"
    sqlqueue.publish("order", {"n": 2}, key="k")

    every = run_manage("sqlqueue", "stats", timeout=60)
    one = run_manage("sqlqueue", "stats", "--topic", "order", timeout=60)

    assert every.returncode == 0, every.stderr
    assert one.returncode == 0, one.stderr
    line = "topic 'order' has 2 message(s) and no consumer group"
    assert line in every.stdout
    assert line in one.stdout


def test_health_strict_fails_on_a_topic_nobody_consumes_and_a_subscriber_topic_never_published():
    sqlqueue.publish("order", {"n": 1}, key="k")

    relaxed = run_manage("sqlqueue", "health", timeout=60)
    strict = run_manage("sqlqueue", "health", "--strict", timeout=60)

    assert relaxed.returncode == 0, relaxed.stderr
    assert "topic 'order' has 1 message(s) and no consumer group" in relaxed.stdout
    assert strict.returncode == 1, strict.stdout + strict.stderr
    [line] = strict.stderr.strip().splitlines()
    assert "topic 'order' has 1 message(s) and no consumer group" in line
    assert "@subscriber topic 'orders' has never had a message" in line
    assert "Traceback" not in strict.stderr


def test_the_admin_overview_lists_a_topic_with_messages_and_no_consumer_group(admin_client):
    sqlqueue.publish("order", {"n": 1}, key="k")

    page = admin_client.get(reverse("admin:django_sqlqueue_overview"))

    assert page.status_code == 200
    assert "topic &#x27;order&#x27; has 1 message(s) and no consumer group" in page.content.decode().lower()


def test_the_topics_of_the_log_are_read_one_index_seek_per_topic():
    for topic in ("alpha", "beta", "gamma"):
        sqlqueue.publish_many(topic, [{"payload": n, "key": f"k{n}"} for n in range(30)])

    with CaptureQueriesContext(connection) as queries:
        topics = QueueMessage.objects.topics(2, "default")
    assert topics == ["alpha", "beta"]
    assert len(queries) == 1
    assert [t.topic for t in ops.unclaimed_topics(using="default")] == ["alpha", "beta", "gamma"]
