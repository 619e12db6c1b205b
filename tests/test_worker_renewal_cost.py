"""A worker's renewal (heartbeats, lease renewal, reconciling what it holds) costs the same
statements whether it runs two subscriptions or thirty: an idle worker's cost must not grow
with what it subscribes to."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_sqlqueue.consuming.registry import autodiscover, subscriptions
from django_sqlqueue.models import PartitionLease, SubscriberHeartbeat
from django_sqlqueue.worker.leasing import Leasing

pytestmark = pytest.mark.django_db


def renewal_statements(first: int, count: int) -> tuple[int, Leasing]:
    """Statements of the second renewal of a worker that runs ``count`` subscriptions (from
    the ``first``) and holds all their partitions (the first renewal takes them)."""
    autodiscover()
    chosen = sorted(subscriptions(), key=lambda s: (s.topic, s.group))[first:first + count]
    assert len(chosen) == count
    leasing = Leasing(f"w{count}", "default", chosen, lease_duration=30)
    leasing.prepare()
    leasing.maintain(int(time.time() * 1000))
    with CaptureQueriesContext(connection) as queries:
        leasing.maintain(int(time.time() * 1000))
    return len(queries), leasing


def test_a_renewal_costs_the_same_statements_for_2_and_for_20_subscriptions():
    # Subscriptions no other worker here shares: each worker holds all it runs.
    few, _ = renewal_statements(20, 2)
    many, leasing = renewal_statements(0, 20)

    assert many == few
    # And it did its work: every subscription's heartbeat and every partition held.
    beats = SubscriberHeartbeat.objects.filter(subscriber_name="w20")
    assert beats.count() == 20
    held = PartitionLease.objects.filter(leased_by="w20").count()
    assert held == len(leasing.partitions) > 20
