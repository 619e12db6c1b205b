"""Schedules through a rolling deploy, with real workers of two releases (the test
settings, and tests/settings_release2.py, which adds a task module and a task queue):
a tick the running release cannot fire is left due for one that can, with its reason on
the schedule; an operator's pause survives a worker of either release starting."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import call_command

from django_sqlqueue import schedules
from django_sqlqueue.models import PartitionLease, Schedule
from tests.factories import ScheduleFactory
from tests.test_schedules_workers import WORKER_ARGS, db_now, fired_ticks
from tests.worker_harness import wait_stable, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

RELEASE_2 = "tests.settings_release2"
EVERY_SECOND = "* * * * * *"


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def release_2_task_schedule(name: str, task: str, first_tick: int) -> None:
    """A task schedule as release 2's migrate stores it (this process cannot import
    release 2's module, so the row is written as it stands)."""
    definition = {"cron": EVERY_SECOND, "timezone": "UTC", "catch_up": "all", "task": task,
                  "args": [name], "kwargs": {}}
    ScheduleFactory(name=name, cron=EVERY_SECOND, catch_up="all", next_run_at=first_tick,
                    target=f"task {task}",
                    definition=json.dumps(definition, sort_keys=True, separators=(",", ":")))


def reason(name: str) -> str:
    return Schedule.objects.get(name=name).reason


def test_ticks_the_old_release_cannot_fire_wait_for_the_new_release(workers):
    why = "'newtasks.weekly_report' is not a known task of this release"
    now = db_now()
    first = now - now % 1000 + 1000
    release_2_task_schedule("report", "newtasks.weekly_report", first)
    old = workers.start("old", *WORKER_ARGS)
    wait_until(lambda: reason("report") != "", timeout=30,
               what="the reason recorded on the schedule", watch=[old])
    assert why in reason("report")
    # Ticks go by: none is fired, none skipped; the reason is logged once, not per tick.
    wait_stable(lambda: Schedule.objects.get(name="report").next_run_at, first, hold=3.0,
                what="the schedule left due", watch=[old])
    assert fired_ticks("report") == []
    assert old.stderr.count("schedule left to workers that can fire it name=report") == 1
    listing = io.StringIO()
    call_command("sqlqueue", "schedules", stdout=listing)
    assert "WAITING BECAUSE" in listing.getvalue() and why in listing.getvalue()

    new = workers.start("new", *WORKER_ARGS, settings_module=RELEASE_2)
    wait_until(lambda: reason("report") == "" and fired_ticks("report"), timeout=45,
               what="release 2 firing the waiting ticks", watch=[old, new])
    ticks = fired_ticks("report")
    # catch_up="all": every tick since the first one, fired by release 2.
    assert ticks[0] == first
    assert ticks == list(range(first, ticks[-1] + 1, 1000))


def test_an_operators_pause_survives_workers_of_a_release_without_the_schedule(workers):
    declared = {"SCHEDULES": {"nightly-v2": {"cron": EVERY_SECOND, "topic": "reports",
                                             "payload": {}}}}
    new = workers.start("new", *WORKER_ARGS, settings=declared)
    wait_until(lambda: fired_ticks("nightly-v2"), timeout=30, what="the schedule firing",
               watch=[new])
    schedules.pause("nightly-v2")
    new.terminate()
    new.wait_exit(15)
    old = workers.start("old", *WORKER_ARGS)  # its settings declare no schedule
    wait_until(lambda: "schedules not declared in these settings kept" in old.stderr,
               timeout=30, what="the old release's sync", watch=[old])
    row = Schedule.objects.get(name="nightly-v2")
    assert row.paused
    old.terminate()
    old.wait_exit(15)
    fired = len(fired_ticks("nightly-v2"))
    again = workers.start("again", *WORKER_ARGS, settings=declared)
    wait_until(lambda: PartitionLease.objects.filter(leased_by="again").exists(), timeout=30,
               what="the new release's worker started", watch=[again])
    time.sleep(2.0)  # its sync, and ticks that would fire were the pause lost
    assert Schedule.objects.get(name="nightly-v2").paused
    assert len(fired_ticks("nightly-v2")) == fired
