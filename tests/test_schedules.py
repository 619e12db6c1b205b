"""Schedules in the table: the run-time API, the settings sync, and what firing a due
schedule writes (run here in-process; test_schedules_workers.py runs real workers)."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_sqlqueue import SQLQueueError, schedules
from django_sqlqueue.models import QueueMessage, Schedule
from django_sqlqueue.scheduling import cron
from django_sqlqueue.scheduling.definitions import sync_settings
from django_sqlqueue.scheduling.firing import tick_id
from django_sqlqueue.scheduling.ticking import HeldSchedules, fire_due
from django_sqlqueue.tasks.compat import TaskResultStatus, task_backends
from tests.factories import ScheduleFactory, schedule_definition

pytestmark = pytest.mark.django_db

HOUR = 3_600_000


def db_now() -> int:
    return Schedule.objects.now_ms("default")


def hour_start(ms: int) -> int:
    return ms - ms % HOUR


def published(**filters: object) -> list[str]:
    return list(QueueMessage.objects.filter(**filters).order_by("offset")
                .values_list("message_id", flat=True))


# ----------------------------------------------------------------------- the API

def test_add_stores_a_schedule_whose_first_tick_is_the_next_one():
    before = db_now()
    row = schedules.add("tenant-7-report", cron="0 8 * * MON", timezone="Europe/Paris",
                        topic="reports", payload={"tenant": 7}, key="tenant-7")
    assert row.origin == "api" and not row.paused
    assert row.next_run_at == cron.next_tick("0 8 * * MON", cron.zone("Europe/Paris"), before)
    assert row.target == "topic reports" and row.last_run_at is None


def test_adding_the_same_definition_again_keeps_the_schedule_state():
    schedules.add("nightly", cron="0 3 * * *", topic="reports", payload=1)
    Schedule.objects.filter(name="nightly").update(next_run_at=123, last_message="m")
    schedules.add("nightly", cron="0 3 * * *", topic="reports", payload=1)
    assert Schedule.objects.filter(name="nightly").values_list(
        "next_run_at", "last_message").get() == (123, "m")


def test_a_new_cron_starts_again_from_its_next_tick():
    schedules.add("nightly", cron="0 3 * * *", topic="reports", payload=1)
    Schedule.objects.filter(name="nightly").update(next_run_at=123)
    row = schedules.add("nightly", cron="0 4 * * *", topic="reports", payload=1)
    assert row.next_run_at > 123 and row.cron == "0 4 * * *"


def test_add_refuses_a_bad_schedule_naming_every_problem():
    with pytest.raises(schedules.InvalidSchedule) as caught:
        schedules.add("bad name", cron="61 * * * *", timezone="Mars/Olympus", topic="t",
                      payload=1, catch_up="sometimes")
    text = str(caught.value)
    assert all(part in text for part in ("bad name", "Bad minute", "Mars/Olympus", "sometimes"))
    assert isinstance(caught.value, SQLQueueError) and isinstance(caught.value, ValueError)
    assert not Schedule.objects.exists()


def test_a_schedule_needs_a_task_or_a_topic():
    with pytest.raises(schedules.InvalidSchedule, match="exactly one of"):
        schedules.add("nothing", cron="@daily")
    with pytest.raises(schedules.InvalidSchedule, match="cannot be imported"):
        schedules.add("ghost", cron="@daily", task="tests.testapp.tasks.missing")


def test_an_added_schedule_rolls_back_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        schedules.add("tenant-1", cron="@daily", topic="reports", payload=1)
        raise RuntimeError("the tenant was not created after all")
    assert not Schedule.objects.exists()


def test_remove_pause_and_resume_name_an_existing_schedule():
    for action in (schedules.remove, schedules.pause, schedules.resume):
        with pytest.raises(schedules.ScheduleNotFound, match="missing"):
            action("missing")


def test_pause_and_resume_say_whether_they_changed_anything():
    schedules.add("nightly", cron="@daily", topic="reports", payload=1)
    assert schedules.pause("nightly") is True
    assert schedules.pause("nightly") is False
    assert schedules.resume("nightly") is True
    assert schedules.resume("nightly") is False


def test_a_removed_schedule_is_gone():
    schedules.add("nightly", cron="@daily", topic="reports", payload=1)
    schedules.remove("nightly")
    assert not Schedule.objects.exists()


# ----------------------------------------------------------------------- settings

SETTINGS_SCHEDULES = {"hourly-report": {"cron": "@hourly", "topic": "reports",
                                        "payload": {"kind": "hourly"}}}


def test_settings_schedules_are_synced_into_the_table():
    with override_settings(SQLQUEUE={"SCHEDULES": SETTINGS_SCHEDULES}):
        sync_settings()
    row = Schedule.objects.get()
    assert (row.name, row.origin, row.cron) == ("hourly-report", "settings", "@hourly")


def test_a_schedule_removed_from_settings_is_kept_with_its_state_until_removed():
    # Another release's workers may still declare it (a rolling deploy, a rollback).
    schedules.add("tenant-1", cron="@daily", topic="reports", payload=1)
    with override_settings(SQLQUEUE={"SCHEDULES": SETTINGS_SCHEDULES}):
        sync_settings()
        schedules.pause("hourly-report")
    with override_settings(SQLQUEUE={"SCHEDULES": {}}):
        sync_settings()
        assert Schedule.objects.get(name="hourly-report").paused
        schedules.remove("hourly-report")
    assert list(Schedule.objects.values_list("name", flat=True)) == ["tenant-1"]


def test_settings_schedules_cannot_be_removed_or_redefined_through_the_api():
    with override_settings(SQLQUEUE={"SCHEDULES": SETTINGS_SCHEDULES}):
        sync_settings()
        with pytest.raises(schedules.InvalidSchedule, match="SCHEDULES"):
            schedules.remove("hourly-report")
        with pytest.raises(schedules.InvalidSchedule, match="SCHEDULES"):
            schedules.add("hourly-report", cron="@daily", topic="reports", payload=1)


def test_a_paused_settings_schedule_stays_paused_through_a_sync():
    with override_settings(SQLQUEUE={"SCHEDULES": SETTINGS_SCHEDULES}):
        sync_settings()
        schedules.pause("hourly-report")
        sync_settings()
    assert Schedule.objects.get().paused


# ----------------------------------------------------------------------- firing

def test_a_due_schedule_publishes_its_tick_and_advances_in_one_go():
    now = db_now()
    tick = hour_start(now)
    ScheduleFactory(name="nightly", next_run_at=tick)
    assert fire_due(now, "default") == 1
    assert published(topic="reports") == [f"schedule:nightly:{cron.tick_label(tick)}"]
    row = Schedule.objects.get()
    assert (row.last_run_at, row.last_message) == (tick, tick_id("nightly", tick))
    assert row.next_run_at == tick + HOUR


def test_a_schedule_not_due_yet_is_left_alone():
    now = db_now()
    ScheduleFactory(next_run_at=now + 60_000)
    assert fire_due(now, "default") == 0
    assert not QueueMessage.objects.exists()


def test_a_tick_published_already_is_not_published_again():
    now = db_now()
    tick = hour_start(now)
    ScheduleFactory(name="nightly", next_run_at=tick)
    fire_due(now, "default")
    Schedule.objects.update(next_run_at=tick)  # as if the advance had been lost
    fire_due(now, "default")
    assert len(published(topic="reports")) == 1


def test_a_paused_schedule_does_not_fire_and_resumes_at_its_next_tick():
    now = db_now()
    ScheduleFactory(name="nightly", next_run_at=hour_start(now) - 5 * HOUR, paused=True)
    assert fire_due(now, "default") == 0
    schedules.resume("nightly")
    assert Schedule.objects.get().next_run_at > now  # the paused hours are not fired


@pytest.mark.parametrize("policy,fired", [("latest", 1), ("all", 6), ("none", 0)])
def test_after_downtime_the_catch_up_policy_decides_what_fires(policy, fired):
    now = db_now()
    first = hour_start(now) - 5 * HOUR
    if now - hour_start(now) < cron.MISSED_AFTER_MS:
        now = hour_start(now) + cron.MISSED_AFTER_MS  # the latest tick is missed too
    ScheduleFactory(name="late", next_run_at=first, catch_up=policy)
    fire_due(now, "default")
    ids = published(topic="reports")
    assert len(ids) == fired
    if ids:
        assert ids[-1] == tick_id("late", hour_start(now))
    assert Schedule.objects.get().next_run_at == hour_start(now) + HOUR


def test_a_message_schedule_publishes_its_payload_key_and_headers():
    now = db_now()
    ScheduleFactory(next_run_at=hour_start(now), definition=schedule_definition(
        payload={"tenant": 7}, key="tenant-7", headers={"source": "cron"}))
    fire_due(now, "default")
    message = QueueMessage.objects.get(topic="reports")
    assert message.message_key == "tenant-7"


def test_a_task_schedule_enqueues_the_task_under_the_tick_id():
    now = db_now()
    ScheduleFactory(name="sums", next_run_at=hour_start(now), target="task tests.testapp.tasks.add",
                    definition=schedule_definition(
                        topic=None, payload=None, task="tests.testapp.tasks.add",
                        args=[2, 3]))
    fire_due(now, "default")
    message_id = Schedule.objects.get().last_message
    assert message_id.startswith("schedule:sums:")
    result = task_backends["default"].get_result(message_id)
    assert result.status == TaskResultStatus.READY and result.args == [2, 3]


def test_schedule_names_are_case_sensitive():
    schedules.add("nightly", cron="@daily", topic="reports", payload=1)
    schedules.add("Nightly", cron="@hourly", topic="reports", payload=2)
    assert sorted(Schedule.objects.values_list("name", "cron")) == [
        ("Nightly", "@hourly"), ("nightly", "@daily")]


def test_migrate_syncs_the_settings_schedules():
    from django_sqlqueue.scheduling.definitions import sync_after_migrate

    with override_settings(SQLQUEUE={"SCHEDULES": SETTINGS_SCHEDULES}):
        sync_after_migrate(using="default")
    assert Schedule.objects.filter(name="hourly-report", origin="settings").exists()


# ----------------------------------------------------------------------- DST, end to end

def fire_through(start: str, end: str, step_ms: int = 10 * 60_000) -> None:
    """Run the scheduler from ``start`` to ``end`` (UTC), as if the database clock went
    by in ``step_ms`` steps."""
    from datetime import datetime

    now = int(datetime.fromisoformat(start).timestamp() * 1000)
    stop = int(datetime.fromisoformat(end).timestamp() * 1000)
    while now <= stop:
        fire_due(now, "default")
        now += step_ms


def add_paris_0230(first_tick: str) -> None:
    from datetime import datetime

    expression = "30 2 * * *"
    ScheduleFactory(name="paris", cron=expression, timezone="Europe/Paris",
                    next_run_at=int(datetime.fromisoformat(first_tick).timestamp() * 1000),
                    definition=schedule_definition(cron=expression, timezone="Europe/Paris"))


def test_a_0230_job_fires_once_on_the_spring_forward_day():
    add_paris_0230("2026-03-28T01:30:00+00:00")
    fire_through("2026-03-28T00:00:00+00:00", "2026-03-30T23:00:00+00:00")
    assert published(topic="reports") == [
        "schedule:paris:2026-03-28T01:30:00Z",  # 02:30 CET
        "schedule:paris:2026-03-29T01:00:00Z",  # 03:00 CEST: 02:30 did not exist
        "schedule:paris:2026-03-30T00:30:00Z",  # 02:30 CEST
    ]


def test_a_0230_job_fires_once_on_the_autumn_day_that_repeats_its_hour():
    add_paris_0230("2026-10-24T00:30:00+00:00")
    fire_through("2026-10-24T00:00:00+00:00", "2026-10-26T23:00:00+00:00", step_ms=5 * 60_000)
    assert published(topic="reports") == [
        "schedule:paris:2026-10-24T00:30:00Z",  # 02:30 CEST
        "schedule:paris:2026-10-25T00:30:00Z",  # 02:30 CEST, the first of two 02:30s
        "schedule:paris:2026-10-26T01:30:00Z",  # 02:30 CET
    ]


# ----------------------------------------------------------------------- releases

def test_a_task_on_a_queue_this_release_lacks_is_left_due_with_its_reason():
    now = db_now()
    tick = hour_start(now)
    ScheduleFactory(name="later", next_run_at=tick, target="task tests.testapp.tasks.remember",
                    definition=schedule_definition(topic=None, payload=None,
                                                   task="tests.testapp.tasks.remember",
                                                   args=["x"]))
    tasks = {"default": {**settings.TASKS["default"], "QUEUES": ["default", "emails"]}}
    with override_settings(TASKS=tasks):
        assert fire_due(now, "default") == 1
    row = Schedule.objects.get()
    assert (row.next_run_at, row.last_message) == (tick, "")
    assert "queue 'ordered'" in row.reason
    fire_due(now, "default")  # with the queue configured, it fires the waiting tick
    row = Schedule.objects.get()
    assert row.last_message == tick_id("later", tick) and row.reason == ""


def test_a_tick_whose_task_is_gone_is_left_due_and_logged_once(caplog):
    now = db_now()
    ScheduleFactory(name="gone", next_run_at=hour_start(now), definition=schedule_definition(
        topic=None, payload=None, task="tests.testapp.tasks.add"))
    Schedule.objects.update(definition=Schedule.objects.get().definition.replace(
        "tests.testapp.tasks.add", "tests.testapp.tasks.removed_since"))
    held = HeldSchedules(retry=0.0)
    with caplog.at_level(logging.INFO, "django_sqlqueue.schedules"):
        for _ in range(3):
            fire_due(now, "default", held=held)
    assert caplog.text.count("schedule left to workers that can fire it name=gone") == 1
    row = Schedule.objects.get()
    assert row.next_run_at == hour_start(now) and row.last_message == ""
    assert "removed_since" in row.reason


def test_a_worker_passes_over_a_schedule_it_cannot_fire_for_a_while():
    now = db_now()
    ScheduleFactory(name="elsewhere", origin="settings", next_run_at=hour_start(now))
    held = HeldSchedules()
    assert fire_due(now, "default", held=held) == 1
    assert "SCHEDULES" in Schedule.objects.get().reason
    assert fire_due(now, "default", held=held) == 0
    assert Schedule.objects.next_due("default", held.names())[0] is None


def test_a_tick_refused_for_good_is_logged_and_the_schedule_moves_on(caplog):
    now = db_now()
    ScheduleFactory(name="big", next_run_at=hour_start(now), definition=schedule_definition(
        payload={"text": "x" * 2000}))  # stored before the limit was lowered
    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": 1024}), \
            caplog.at_level(logging.ERROR, "django_sqlqueue.schedules"):
        fire_due(now, "default")
    assert "schedule tick not fired name=big" in caplog.text
    row = Schedule.objects.get()
    assert row.next_run_at > now and row.last_message == "" and row.reason == ""


# ----------------------------------------------------------------------- refused at add

def test_add_refuses_a_payload_over_max_payload_bytes():
    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": 1024}), \
            pytest.raises(schedules.InvalidSchedule, match="1024"):
        schedules.add("big", cron="@daily", topic="reports", payload={"text": "x" * 2000})
    assert not Schedule.objects.exists()


def test_settings_schedules_over_max_payload_bytes_are_not_synced():
    declared = {"big": {"cron": "@daily", "topic": "reports", "payload": "x" * 2000}}
    with override_settings(SQLQUEUE={"SCHEDULES": declared, "MAX_PAYLOAD_BYTES": 1024}):
        sync_settings()
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("expression,field", [
    ("*/61 * * * *", "minute"), ("0 */25 * * *", "hour"), ("0 0 */32 * *", "day-of-month"),
    ("0 0 1 */13 *", "month"), ("0 0 * * */8", "day-of-week"), ("*/61 * * * * *", "second"),
    ("5-50/0 * * * *", "minute"),
])
def test_add_refuses_a_cron_step_out_of_its_field_range(expression, field):
    with pytest.raises(schedules.InvalidSchedule, match=f"in the {field} field is out of range"):
        schedules.add("bad", cron=expression, topic="reports", payload=1)


def test_cron_steps_within_range_are_accepted():
    schedules.add("ok", cron="*/59 */23 */31 */12 */7", topic="reports", payload=1)
    assert Schedule.objects.filter(name="ok").exists()
