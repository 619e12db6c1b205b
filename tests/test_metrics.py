"""Prometheus metrics: the database gauges served by django_sqlqueue.urls, and a worker's
own counters and histograms served by runqueueworker --metrics-port."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations as ops
from django_sqlqueue import views
from django_sqlqueue.metrics.database import GAUGES, LIMIT_GAUGES, DatabaseCollector
from tests.test_command_input import refused
from tests.test_operations import TOPIC, dead_letter, publish, register
from tests.worker_harness import wait_until, worker_pool


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


GT = (("group", "billing"), ("topic", TOPIC))
TOKEN = "s3cret-metrics-token-0123456789"


@pytest.fixture(autouse=True)
def fresh_collectors():
    """Each test starts with no cached gauges (the view keeps one collector per process)."""
    views._collectors.clear()
    yield
    views._collectors.clear()


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
    limits = {name for name, _, _ in LIMIT_GAUGES}  # the test app's subscriptions declare some
    assert names - limits == {name for name, _, _ in GAUGES}
    assert all(name.startswith("sqlqueue_") for name in names)
    assert {label for name, labels in got for label, _ in labels
            if name not in limits} == {"group", "topic"}


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


# --------------------------------------------------------------------------- the view's cache


@pytest.mark.django_db
@override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_CACHE_SECONDS": 60})
def test_a_second_scrape_within_the_cache_window_reads_nothing(client, django_assert_num_queries):
    register("billing")
    publish(3)
    first = client.get("/sqlqueue/metrics")
    publish(2)

    with django_assert_num_queries(0):
        second = client.get("/sqlqueue/metrics")

    assert second.status_code == 200
    assert samples(second.content.decode())[("sqlqueue_consumer_group_lag", GT)] == 3
    assert second.content == first.content


@pytest.mark.django_db
@override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_CACHE_SECONDS": 0})
def test_with_no_cache_window_every_scrape_reads_the_database(client):
    register("billing")
    publish(3)
    client.get("/sqlqueue/metrics")
    publish(2)

    with CaptureQueriesContext(connection) as queries:
        second = client.get("/sqlqueue/metrics")

    assert len(queries) > 0
    assert samples(second.content.decode())[("sqlqueue_consumer_group_lag", GT)] == 5


@pytest.mark.django_db
def test_scrapes_after_the_cache_window_read_the_database_again(client):
    register("billing")
    publish(3)
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_CACHE_SECONDS": 0.2}):
        client.get("/sqlqueue/metrics")
        publish(2)
        time.sleep(0.25)
        later = client.get("/sqlqueue/metrics")

    assert samples(later.content.decode())[("sqlqueue_consumer_group_lag", GT)] == 5


# --------------------------------------------------------------------------- the view's token


@pytest.mark.django_db
@override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_TOKEN": TOKEN})
@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", f"Basic {TOKEN}", TOKEN])
def test_with_a_token_set_a_request_without_it_is_refused_401(client, header):
    extra = {} if header is None else {"HTTP_AUTHORIZATION": header}
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/sqlqueue/metrics", **extra)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"sqlqueue_" not in response.content
    assert len(queries) == 0


@pytest.mark.django_db
@override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_TOKEN": TOKEN})
@pytest.mark.parametrize("given", [TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "wrong"])
def test_with_a_token_set_another_token_is_refused_403(client, given):
    response = client.get("/sqlqueue/metrics", HTTP_AUTHORIZATION=f"Bearer {given}")

    assert response.status_code == 403
    assert b"sqlqueue_" not in response.content


@pytest.mark.django_db
@override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_TOKEN": TOKEN})
def test_with_a_token_set_the_right_bearer_token_is_served(client):
    register("billing")
    publish(1)

    response = client.get("/sqlqueue/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 200
    assert samples(response.content.decode())[("sqlqueue_consumer_group_lag", GT)] == 1


@pytest.mark.parametrize(("setting", "value", "check_id"), [
    ("METRICS_CACHE_SECONDS", -1, "sqlqueue.E070"),
    ("METRICS_CACHE_SECONDS", 3601, "sqlqueue.E070"),
    ("METRICS_CACHE_SECONDS", "5", "sqlqueue.E070"),
    ("METRICS_CACHE_SECONDS", float("nan"), "sqlqueue.E070"),
    ("METRICS_TOKEN", "", "sqlqueue.E071"),
    ("METRICS_TOKEN", "short", "sqlqueue.E071"),
    ("METRICS_TOKEN", "has a space in it, sixteen+", "sqlqueue.E071"),
    ("METRICS_TOKEN", 1234567890123456, "sqlqueue.E071"),
])
def test_a_bad_metrics_setting_is_a_system_check_error(setting, value, check_id):
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, setting: value}):
        errors = [e for e in run_checks(tags=["sqlqueue"]) if e.id == check_id]

    assert len(errors) == 1
    assert setting in errors[0].msg


@pytest.mark.parametrize(("setting", "value"), [
    ("METRICS_CACHE_SECONDS", 0), ("METRICS_CACHE_SECONDS", 2.5), ("METRICS_TOKEN", None),
    ("METRICS_TOKEN", TOKEN),
])
def test_good_metrics_settings_pass_the_checks(setting, value):
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, setting: value}):
        assert not [e for e in run_checks(tags=["sqlqueue"]) if e.id.startswith("sqlqueue.E07")]


# --------------------------------------------------------------------------- the worker's server


def answers(host: str, port: int) -> bool:
    """Whether something accepts connections on (host, port)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_worker_serves_metrics_on_loopback_only_unless_told_an_address(tmp_path):
    # Linux routes all of 127.0.0.0/8 to the loopback interface: a server bound to
    # 0.0.0.0 answers on 127.0.0.2 too, one bound to 127.0.0.1 does not.
    default_port, chosen_port = free_port(), free_port()
    with worker_pool(tmp_path) as workers:
        default = workers.start("w1", "--topic", TOPIC, "--metrics-port", str(default_port))
        chosen = workers.start("w2", "--topic", TOPIC, "--metrics-port", str(chosen_port),
                               "--metrics-address", "127.0.0.2")
        wait_until(lambda: answers("127.0.0.1", default_port) and answers("127.0.0.2", chosen_port),
                   what="both metrics servers answering", watch=[default, chosen])

        assert "sqlqueue_poll_duration_seconds" in urllib.request.urlopen(
            f"http://127.0.0.1:{default_port}/metrics", timeout=2).read().decode()
        assert not answers("127.0.0.2", default_port)
        assert not answers("127.0.0.1", chosen_port)


@pytest.mark.django_db
@pytest.mark.parametrize("address", ["not an address", "", "256.1.1.1", "-", "\x00"])
def test_a_bad_metrics_address_is_one_line_and_exit_2(address):
    error = refused("runqueueworker", "--metrics-port", str(free_port()), "--metrics-address",
                    address)

    assert "metrics" in str(error)


@pytest.mark.django_db
def test_a_metrics_address_that_is_not_on_this_machine_is_one_line_and_exit_2():
    # 192.0.2.0/24 is reserved for documentation: no machine has it.
    error = refused("runqueueworker", "--metrics-port", str(free_port()), "--metrics-address",
                    "192.0.2.1")

    assert "cannot serve metrics on 192.0.2.1" in str(error)


@pytest.mark.django_db
def test_a_metrics_address_without_a_port_is_one_line_and_exit_2():
    error = refused("runqueueworker", "--metrics-address", "127.0.0.1")

    assert "--metrics-address needs --metrics-port" in str(error)
