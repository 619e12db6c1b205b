"""Prometheus metrics: the database gauges served by django_sqlqueue.urls, and a worker's
own counters and histograms served by runqueueworker --metrics-port."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations as ops
from django_sqlqueue.metrics.database import GAUGES, DatabaseCollector
from tests.test_command_input import refused
from tests.test_operations import TOPIC, dead_letter, publish, register
from tests.worker_harness import wait_until, worker_pool


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


GT = (("group", "billing"), ("topic", TOPIC))


@pytest.mark.django_db
def test_the_view_serves_the_database_gauges_per_group_and_topic(client):
    register("billing")
    stored = publish(3)
    dead_letter("billing", stored[0])
    ops.pause("billing", TOPIC)

    response = client.get("/sqlqueue/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    got = samples(response.content.decode())
    assert got[("sqlqueue_consumer_group_lag", GT)] == 3
    assert got[("sqlqueue_dead_letters", GT)] == 1
    assert got[("sqlqueue_consumer_group_paused", GT)] == 1
    assert got[("sqlqueue_consumer_group_workers", GT)] == 0
    assert got[("sqlqueue_consumer_group_in_flight", GT)] == 0
    assert got[("sqlqueue_consumer_group_oldest_pending_age_seconds", GT)] >= 0
    names = {name for name, _ in got}
    assert names == {name for name, _, _ in GAUGES}
    assert all(name.startswith("sqlqueue_") for name in names)
    assert {label for _, labels in got for label, _ in labels} == {"group", "topic"}


@pytest.mark.django_db
def test_registering_the_collector_reads_nothing_from_the_database():
    with CaptureQueriesContext(connection) as queries:
        CollectorRegistry(auto_describe=True).register(DatabaseCollector())
    assert len(queries) == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return samples(response.read().decode())
    except OSError:
        return {}


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_worker_serves_its_counters_histograms_and_leases(tmp_path):
    port = free_port()
    sqlqueue.publish("poison", {"n": 1}, key="p")
    with worker_pool(tmp_path) as workers:
        worker = workers.start("w1", "--topic", "poison", "--metrics-port", str(port))
        labels = (("group", "billing"), ("topic", "poison"))
        got = wait_until(
            lambda: (s := scrape(port)).get(("sqlqueue_messages_dead_lettered_total", labels))
            and s, what="the dead letter counted", watch=[worker])
    assert got[("sqlqueue_messages_delivered_total", labels)] == 3
    assert got[("sqlqueue_messages_nacked_total", labels)] == 2
    assert got[("sqlqueue_messages_dead_lettered_total", labels)] == 1
    assert ("sqlqueue_messages_acked_total", labels) not in got
    assert got[("sqlqueue_handler_duration_seconds_count", labels)] == 3
    assert got[("sqlqueue_poll_duration_seconds_count", ())] > 0
    assert got[("sqlqueue_leases_held", labels)] == 4


@pytest.mark.django_db
@pytest.mark.parametrize("port", ["0", "65536", "http", "-1"])
def test_a_bad_metrics_port_is_one_line_and_exit_2(port):
    refused("runqueueworker", "--metrics-port", port)
