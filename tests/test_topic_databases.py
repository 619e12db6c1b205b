"""Topics across databases: ``SQLQUEUE["TOPICS"]["orders"]["DATABASE"] = "events"`` places
``orders`` (its log, groups, offsets, leases, dead letters) on a second database, every
other topic staying on ``default``.

``events`` is a second database on the suite's server (a second file on SQLite), created
for this module only. In-process tests switch to those settings with
``override_settings``; the worker runs in a process of its own under
tests/settings_topic_databases.py. tests/test_topic_database_outage.py stops a second
server under a running fleet.
"""

from __future__ import annotations

import io
import json
from typing import Any

import django
import pytest
from django.conf import settings
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.test import override_settings

import django_sqlqueue as sqlqueue
from django_sqlqueue.checks import check_settings, check_topic_databases
from django_sqlqueue.conf import queue_aliases, queue_database
from django_sqlqueue.metrics.database import DatabaseCollector
from django_sqlqueue.models import ConsumerOffset, QueueMessage, Topic
from django_sqlqueue.testing import drain
from tests.testapp.models import Handled
from tests.topic_databases import EVENTS, NAME_VARIABLE, events_database
from tests.worker_harness import DEFAULT_TIMEOUT, run_command

BOTH = ["default", EVENTS]
ROUTER = "django_sqlqueue.routers.QueueRouter"


@pytest.fixture(scope="module", autouse=True)
def events_alias(django_db_setup: Any, django_db_blocker: Any):
    """The ``events`` alias, its test database created and migrated for this module."""
    config = events_database(connections["default"].settings_dict)
    settings.DATABASES[EVENTS] = connections.configure_settings(
        {"default": settings.DATABASES["default"], EVENTS: config})[EVENTS]
    with django_db_blocker.unblock():
        unserialized = {} if django.VERSION >= (6, 0) else {"serialize": False}
        connections[EVENTS].creation.create_test_db(verbosity=0, autoclobber=True,
                                                    **unserialized)
    try:
        yield config["NAME"]
    finally:
        with django_db_blocker.unblock():
            connections[EVENTS].creation.destroy_test_db(config["NAME"], verbosity=0)
        connections[EVENTS].close()
        del connections[EVENTS]
        del settings.DATABASES[EVENTS]


def placed(**changes: Any) -> override_settings:
    """These tests' settings: ``orders`` on ``events`` (and ``changes`` to SQLQUEUE)."""
    topics = {**settings.SQLQUEUE["TOPICS"], "orders": {"PARTITIONS": 12, "DATABASE": EVENTS}}
    return override_settings(DATABASE_ROUTERS=[ROUTER],
                             SQLQUEUE={**settings.SQLQUEUE, "TOPICS": topics, **changes})


@pytest.fixture
def on_two_databases():
    with placed():
        yield


def rows(alias: str, **filters: Any) -> int:
    return QueueMessage.objects.using(alias).filter(**filters).count()


# --------------------------------------------------------------------------- settings


def test_a_placed_topic_and_its_dead_letters_live_on_its_alias(on_two_databases):
    assert queue_database("orders") == EVENTS
    assert queue_database("orders_dlq") == EVENTS
    assert queue_database("manykeys") == "default"
    assert queue_database() == "default"
    assert queue_aliases() == ["default", EVENTS]


def test_a_topic_on_an_unknown_alias_is_e019():
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "TOPICS": {"orders": {
            "DATABASE": "evnets"}}}):
        errors = [e for e in check_settings() if e.id == "sqlqueue.E019"]
    assert len(errors) == 1 and "'evnets'" in errors[0].msg


class _DefaultOnly:
    """A project's router that migrates every app on ``default`` only."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"


def test_a_topic_on_an_alias_the_routers_do_not_migrate_is_e019():
    with placed(), override_settings(DATABASE_ROUTERS=[_DefaultOnly()]):
        errors = check_topic_databases()
    assert [e.id for e in errors] == ["sqlqueue.E019"]
    assert isinstance(errors[0], Error) and "QueueRouter" in (errors[0].hint or "")
    with placed():
        assert check_topic_databases() == []


# --------------------------------------------------------------------------- publishing


@pytest.mark.django_db(databases=BOTH)
def test_publish_and_publish_many_write_each_message_to_its_topics_alias(on_two_databases):
    sqlqueue.publish("orders", {"n": 1}, key="k")
    sqlqueue.publish("manykeys", {"n": 1}, key="k")
    sqlqueue.publish_many("orders", [{"payload": {"n": i}} for i in range(3)])
    assert rows(EVENTS, topic="orders") == 4
    assert rows("default", topic="orders") == 0
    assert rows("default", topic="manykeys") == 1
    assert rows(EVENTS, topic="manykeys") == 0


@pytest.mark.django_db(databases=BOTH)
def test_tasks_of_a_placed_queue_are_enqueued_read_and_cancelled_there():
    from tests.testapp.tasks import noop

    topics = {**settings.SQLQUEUE["TOPICS"], "tasks.emails": {"DATABASE": EVENTS}}
    with override_settings(DATABASE_ROUTERS=[ROUTER],
                           SQLQUEUE={**settings.SQLQUEUE, "TOPICS": topics}):
        placed_task = noop.using(queue_name="emails").enqueue()
        home_task = noop.enqueue()
        assert rows(EVENTS, topic="tasks.emails") == 1
        assert rows("default", topic="tasks.default") == 1
        assert noop.get_result(placed_task.id).id == placed_task.id
        backend = placed_task.task.get_backend()
        assert backend.cancel(placed_task.id).cancelled
        assert noop.get_result(placed_task.id).status == "FAILED"
        assert noop.get_result(home_task.id).status == "READY"


# --------------------------------------------------------------------------- operations


@pytest.mark.django_db(databases=BOTH)
def test_drain_stats_and_metrics_cover_every_alias_each_row_labelled(on_two_databases):
    sqlqueue.publish("orders", {"n": 1}, key="k")
    sqlqueue.publish("manykeys", {"n": 1}, key="k")
    result = drain(["orders", "manykeys"])
    assert result.topic("orders").handled == 2  # billing and shipping
    assert result.topic("manykeys").handled == 1
    assert set(ConsumerOffset.objects.using(EVENTS).filter(topic="orders").values_list(
        "consumer_group", flat=True)) == {"billing", "shipping"}
    assert not ConsumerOffset.objects.using("default").filter(topic="orders").exists()
    out = io.StringIO()
    call_command("sqlqueue", "stats", "--json", stdout=out)
    seen = {(s["database"], s["topic"], s["group"]) for s in json.loads(out.getvalue())}
    assert {(EVENTS, "orders", "billing"), (EVENTS, "orders", "shipping"),
            ("default", "manykeys", "bulk")} <= seen
    out = io.StringIO()
    call_command("sqlqueue", "stats", stdout=out)
    table = out.getvalue().splitlines()
    assert table[0].split()[:2] == ["DATABASE", "TOPIC"]
    assert any(line.split()[:2] == [EVENTS, "orders"] for line in table)
    collected = {(r.database, r.topic, r.group) for r in DatabaseCollector().rows()}
    assert (EVENTS, "orders", "billing") in collected
    assert ("default", "manykeys", "bulk") in collected


@pytest.mark.django_db(databases=BOTH)
def test_health_names_each_alias(on_two_databases):
    sqlqueue.publish("orders", {"n": 1}, key="k")
    drain("orders", "billing")
    with pytest.raises(CommandError) as failed:  # no live worker anywhere
        call_command("sqlqueue", "health", "--group", "billing")
    assert f"database {EVENTS}:" in str(failed.value)


@pytest.mark.django_db(databases=BOTH)
def test_cancel_forget_and_repartition_act_on_the_topics_alias(on_two_databases):
    sqlqueue.publish("orders", {"n": 1}, id="to-cancel")
    out = io.StringIO()
    call_command("sqlqueue", "cancel", "--topic", "orders", "--id", "to-cancel", stdout=out)
    assert "groups registering later skip it" in out.getvalue()
    assert QueueMessage.objects.using(EVENTS).filter(message_id="to-cancel").exists()
    drain("orders")
    out = io.StringIO()
    call_command("sqlqueue", "forget", "--group", "shipping", "--topic", "orders", stdout=out)
    assert "forgot consumer group 'shipping'" in out.getvalue()
    assert not ConsumerOffset.objects.using(EVENTS).filter(consumer_group="shipping").exists()
    out = io.StringIO()
    call_command("sqlqueue", "repartition", "--topic", "orders", "--partitions", "3", stdout=out)
    assert "12 -> 3 partitions" in out.getvalue()
    assert Topic.objects.using(EVENTS).get(topic="orders").partitions == 3
    assert Topic.objects.using("default").get(topic="orders").partitions == 12  # untouched


# --------------------------------------------------------------------------- the worker


@pytest.mark.worker
@pytest.mark.django_db(databases=BOTH, transaction=True)
def test_one_worker_serves_topics_on_both_aliases(events_alias):
    with placed():
        on_events = sqlqueue.publish("orders", {"n": 1}, key="k")
        at_home = sqlqueue.publish("manykeys", {"n": 1}, key="k")
    run = run_command("--burst", "--name", "w1", "--topic", "orders", "--topic", "manykeys",
                      settings_module="tests.settings_topic_databases",
                      timeout=DEFAULT_TIMEOUT, extra_env={NAME_VARIABLE: events_alias})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "database=default" in run.stderr and f"database={EVENTS}" in run.stderr
    handled = set(Handled.objects.values_list("topic", "group", "offset"))
    assert handled == {("orders", "billing", on_events.offset),
                       ("orders", "shipping", on_events.offset),
                       ("manykeys", "bulk", at_home.offset)}
    assert ConsumerOffset.objects.using(EVENTS).filter(topic="orders",
                                                       offset_acked__gt=0).count() == 2
    assert ConsumerOffset.objects.using("default").filter(topic="manykeys",
                                                          offset_acked__gt=0).count() == 1


# --------------------------------------------------------------------------- the admin


@pytest.mark.django_db(databases=BOTH)
def test_the_admin_shows_and_acts_on_each_alias(on_two_databases, admin_client):
    from django.urls import reverse

    from django_sqlqueue.models import GroupControl

    stored = sqlqueue.publish("orders", {"n": 1}, id="on-events")
    drain("orders", "billing")  # registers the group there
    overview = reverse("admin:django_sqlqueue_overview")
    home = admin_client.get(overview).content.decode()
    assert "Database: <strong>default</strong>" in home
    assert f'href="{overview}?database={EVENTS}"' in home
    assert 'data-topic="orders"' not in home
    away = admin_client.get(f"{overview}?database={EVENTS}").content.decode()
    assert f"<strong>{EVENTS}</strong>" in away and 'data-topic="orders"' in away
    assert f"database={EVENTS}" in away.split('data-topic="orders"')[1].split("</tr>")[0]

    messages = reverse("admin:django_sqlqueue_queuemessage_changelist")
    assert "on-events" not in admin_client.get(messages).content.decode()
    listed = admin_client.get(f"{messages}?database={EVENTS}")
    assert listed.status_code == 200 and "on-events" in listed.content.decode()
    detail = reverse("admin:django_sqlqueue_queuemessage_change", args=[stored.offset])
    assert admin_client.get(f"{detail}?_changelist_filters=database%3D{EVENTS}").status_code == 200
    assert admin_client.get(f"{detail}?database={EVENTS}").status_code == 200
    assert admin_client.get(f"{detail}?database=nowhere").status_code in (302, 404)

    paused = admin_client.post(f"{overview}?database={EVENTS}",
                               {"action": "pause", "group": "billing", "topic": "orders"},
                               follow=True)
    assert "Paused consumer group" in paused.content.decode()
    assert GroupControl.objects.using(EVENTS).get(consumer_group="billing",
                                                  topic="orders").paused
    assert not GroupControl.objects.using("default").filter(consumer_group="billing",
                                                            topic="orders").exists()


@pytest.mark.django_db(databases=BOTH)
def test_a_schedule_aimed_at_a_placed_topic_publishes_there(on_two_databases):
    from django_sqlqueue import schedules

    schedules.add("to-events", cron="0 3 * * *", topic="orders", payload={"n": 1})
    out = io.StringIO()
    call_command("sqlqueue", "schedules", "run-now", "to-events", stdout=out)
    assert rows(EVENTS, topic="orders") == 1
    assert rows("default", topic="orders") == 0


@pytest.mark.django_db(databases=BOTH)
def test_replay_of_a_placed_topic_runs_on_its_alias(on_two_databases):
    from django_sqlqueue.models import DeadLetter

    sqlqueue.publish("orders", {"fail_for": "billing"}, key="k")
    drain("orders", "billing", advance_delays=True)
    assert DeadLetter.objects.using(EVENTS).filter(consumer_group="billing").count() == 1
    from django_sqlqueue import operations  # the Python API follows the topic too

    assert operations.replay(operations.DeadLetterFilter(topic="orders"),
                             dry_run=True).matched == 1
    assert operations.overview(topic="orders")[0].dead_letters == 1
    out = io.StringIO()
    call_command("sqlqueue", "replay", "--topic", "orders", "--group", "billing", stdout=out)
    assert "replayed 1 of 1 dead letter(s)" in out.getvalue()
    out = io.StringIO()  # without --topic: every alias, each under its name
    call_command("sqlqueue", "replay", "--group", "billing", stdout=out)
    assert f"database {EVENTS}:" in out.getvalue()
