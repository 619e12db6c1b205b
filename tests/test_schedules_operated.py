"""Operators and schedules: ``manage.py sqlqueue schedules``, the admin page, and the
system checks of ``SQLQUEUE["SCHEDULES"]``."""

from __future__ import annotations

import io

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse

from django_sqlqueue import schedules
from django_sqlqueue.checks import check_schedules
from django_sqlqueue.models import QueueMessage, Schedule
from tests.admin_fixtures import client_for, staff
from tests.test_command_input import refused

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_sqlqueue_schedule_changelist")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("sqlqueue", "schedules", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def nightly() -> Schedule:
    return schedules.add("nightly", cron="0 3 * * *", timezone="Europe/Paris",
                         topic="reports", payload={"kind": "nightly"})


# --------------------------------------------------------------------------- CLI

def test_list_shows_each_schedule_with_its_next_run(nightly):
    lines = run().splitlines()
    assert lines[0].split()[:4] == ["NAME", "CRON", "TIMEZONE", "TARGET"]
    assert lines[1].startswith("nightly") and "Europe/Paris" in lines[1]
    assert "topic reports" in lines[1]


def test_list_says_when_there_is_no_schedule():
    assert run("list").strip() == "no schedule is defined"


def test_pause_and_resume_from_the_command_line(nightly):
    assert run("pause", "nightly").strip() == "schedule 'nightly': paused"
    assert run("pause", "nightly").strip() == "schedule 'nightly': was paused already"
    assert Schedule.objects.get().paused
    assert run("resume", "nightly").strip() == "schedule 'nightly': resumed"
    assert not Schedule.objects.get().paused


def test_run_now_publishes_once_outside_the_ticks(nightly):
    next_run = Schedule.objects.get().next_run_at
    line = run("run-now", "nightly").strip()
    message = QueueMessage.objects.get(topic="reports")
    assert line == f"schedule 'nightly': published {message.message_id}"
    assert message.message_id.startswith("schedule:nightly:now:")
    assert Schedule.objects.get().next_run_at == next_run


@pytest.mark.parametrize("args,text", [
    (("schedules", "stop", "nightly"), "unknown action 'stop'"),
    (("schedules", "pause"), "pause needs the schedule's NAME"),
    (("schedules", "pause", "missing"), "no schedule is named 'missing'"),
    (("schedules", "run-now", "missing"), "no schedule is named 'missing'"),
    (("schedules", "list", "nightly"), "list takes no NAME"),
])
def test_bad_input_is_refused_in_one_line(nightly, args, text):
    assert text in str(refused("sqlqueue", *args))


# --------------------------------------------------------------------------- admin

def test_the_admin_lists_schedules_with_next_and_last_run(nightly):
    response = client_for(staff("viewer", "view_schedule")).get(CHANGELIST)
    assert response.status_code == 200
    page = response.content.decode()
    assert "nightly" in page and "topic reports" in page and "Next run" in page


def test_the_admin_pauses_and_resumes_with_actions(nightly):
    client = client_for(staff("operator", "view_schedule", "change_schedule"))
    response = client.post(CHANGELIST, {"action": "pause_schedules",
                                        "_selected_action": ["nightly"]})
    assert response.status_code == 302
    assert Schedule.objects.get().paused
    assert LogEntry.objects.filter(object_repr__contains="paused 1 of 1").exists()
    client.post(CHANGELIST, {"action": "resume_schedules", "_selected_action": ["nightly"]})
    assert not Schedule.objects.get().paused


def test_viewers_cannot_pause(nightly):
    client = client_for(staff("viewer", "view_schedule"))
    client.post(CHANGELIST, {"action": "pause_schedules", "_selected_action": ["nightly"]})
    assert not Schedule.objects.get().paused


# --------------------------------------------------------------------------- checks

def ids(declared: object) -> list[str]:
    with override_settings(SQLQUEUE={"SCHEDULES": declared}):
        return [e.id for e in check_schedules()]


def test_valid_schedules_pass_the_checks():
    assert ids({"a": {"cron": "@daily", "task": "tests.testapp.tasks.noop"},
                "b": {"cron": "*/5 * * * *", "topic": "orders", "payload": {},
                      "timezone": "Europe/Paris", "catch_up": "all"}}) == []


@pytest.mark.parametrize("options,check_id", [
    ({"cron": "0 25 * * *", "topic": "orders"}, "sqlqueue.E091"),
    ({"cron": "@often", "topic": "orders"}, "sqlqueue.E091"),
    ({"cron": "@daily", "topic": "orders", "timezone": "Europe/Atlantis"}, "sqlqueue.E092"),
    ({"cron": "@daily", "topic": "orders", "catch_up": "some"}, "sqlqueue.E093"),
    ({"cron": "@daily", "task": "tests.testapp.tasks.nothing_here"}, "sqlqueue.E094"),
    ({"cron": "@daily", "task": "tests.testapp.queues.record"}, "sqlqueue.E094"),
    ({"cron": "@daily", "topic": "bad topic!"}, "sqlqueue.E095"),
    ({"cron": "@daily"}, "sqlqueue.E096"),
    ({"cron": "@daily", "topic": "orders", "when": "now"}, "sqlqueue.E096"),
])
def test_bad_schedules_fail_the_checks(options, check_id):
    assert check_id in ids({"s": options})


def test_a_bad_schedule_name_fails_the_checks():
    assert ids({"no spaces": {"cron": "@daily", "topic": "orders"}}) == ["sqlqueue.E090"]


def test_a_topic_no_subscriber_consumes_is_a_deployment_warning():
    from django.core.checks import run_checks

    declared = {"s": {"cron": "@daily", "topic": "nobody-reads-this"}}
    assert ids(declared) == []
    with override_settings(SQLQUEUE={"SCHEDULES": declared}):
        # What every manage.py command runs: not repeated there ...
        assert "sqlqueue.W090" not in [e.id for e in run_checks(tags=["sqlqueue"])]
        # ... but reported by `manage.py check --deploy`.
        deploy = run_checks(tags=["sqlqueue"], include_deployment_checks=True)
        # (W101, workers judged by their leases alone, comes with SQLite: see test_checks.)
        assert [e.id for e in deploy if e.id != "sqlqueue.W101"] == ["sqlqueue.W090"]
