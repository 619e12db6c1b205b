"""Schedules fired by real worker processes: each tick once whatever the fleet (killed
workers included), run-time schedules added and removed, settings synced at start, and
the catch-up policies of a worker started after downtime."""

from __future__ import annotations

import random
import signal
import time
from datetime import UTC, datetime

import pytest

from django_sqlqueue import schedules
from django_sqlqueue.models import PartitionLease, QueueMessage, Schedule
from django_sqlqueue.scheduling import cron
from django_sqlqueue.scheduling.firing import tick_id
from tests.factories import ScheduleFactory, schedule_definition
from tests.testapp.models import Handled
from tests.worker_harness import wait_stable, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

WORKER_ARGS = ("--topic", "orders", "--concurrency", "1")  # any subscription will do


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def db_now() -> int:
    return Schedule.objects.now_ms("default")


def fired_ticks(name: str) -> list[int]:
    """The ticks of ``name`` whose message is in the log, ascending (epoch ms)."""
    prefix = f"schedule:{name}:"
    ids = QueueMessage.objects.filter(message_id__startswith=prefix).values_list(
        "message_id", flat=True)
    return sorted(int(datetime.strptime(i[len(prefix):], "%Y-%m-%dT%H:%M:%SZ")
                      .replace(tzinfo=UTC).timestamp() * 1000) for i in ids)


def test_each_tick_fires_once_with_eight_workers_some_killed_during_ticks(workers):
    names = [f"fleet-{n}" for n in range(150)]
    for name in names:
        # "all": however late a tick fires under load, none is skipped, so every tick
        # from the first to the last must be there exactly once.
        schedules.add(name, cron="*/2 * * * * *", topic="reports", payload={"n": name},
                      catch_up="all")
    fleet = [workers.start(f"w{n}", *WORKER_ARGS) for n in range(8)]
    wait_until(lambda: QueueMessage.objects.filter(topic="reports").exists(), timeout=30,
               what="the first tick fired")
    killed = 0
    rng = random.Random(21)
    first_round_at = db_now()
    for round_ in range(4):
        # 20-100 ms after a tick, while the fleet fires its 150 schedules (two claims of
        # at most 100), kill three of the eight at once: most rounds hit a worker inside
        # its claim's transaction. Three new ones take their places.
        time.sleep(2 - time.time() % 2 + rng.uniform(0.02, 0.1))
        for victim in rng.sample([w for w in fleet if w.alive], 3):
            victim.send(signal.SIGKILL)
            victim.kill()
            killed += 1
        fleet += [workers.start(f"r{round_}-{n}", *WORKER_ARGS) for n in range(3)]
    # A loaded machine can leave the fleet a few ticks behind ("all" catches them up):
    # wait until every schedule has fired the ticks of the rounds' first ten seconds.
    wait_until(lambda: not Schedule.objects.filter(
        next_run_at__lte=first_round_at + 10_000).exists(), timeout=60,
        what="every schedule past the kill rounds' ticks")
    Schedule.objects.update(paused=True)
    time.sleep(1.0)  # a firing in progress commits (or not) by now
    assert killed == 12
    for row in Schedule.objects.all():
        ticks = fired_ticks(row.name)
        assert len(ticks) >= 5, row.name
        # Consecutive ticks, none missing; the advance and the last message agree.
        assert ticks == list(range(ticks[0], ticks[-1] + 1, 2000)), row.name
        assert (row.last_run_at, row.last_message) == (ticks[-1], tick_id(row.name, ticks[-1]))
        assert row.next_run_at == ticks[-1] + 2000


def test_a_schedule_added_at_run_time_fires_until_removed(workers):
    worker = workers.start("w", *WORKER_ARGS)
    schedules.add("every-second", cron="* * * * * *", topic="reports", payload={})
    wait_until(lambda: len(fired_ticks("every-second")) >= 3, timeout=30,
               what="three ticks of the added schedule", watch=[worker])
    schedules.remove("every-second")
    time.sleep(1.0)  # a firing that had claimed the row before the delete
    count = len(fired_ticks("every-second"))
    wait_stable(lambda: len(fired_ticks("every-second")), count, hold=3.0,
                what="no tick after the removal", watch=[worker])


def test_a_worker_started_with_no_schedules_fires_none(workers):
    schedules.add("every-second", cron="* * * * * *", topic="reports", payload={})
    worker = workers.start("w", *WORKER_ARGS, "--no-schedules")
    wait_until(lambda: PartitionLease.objects.filter(leased_by="w").exists(), timeout=30,
               what="the worker started", watch=[worker])
    wait_stable(lambda: len(fired_ticks("every-second")), 0, hold=2.5,
                what="no tick fired", watch=[worker])


def test_a_task_schedule_runs_its_task_once_per_tick(workers):
    worker = workers.start("w")  # every subscription, the task queues too
    schedules.add("remember", cron="* * * * * *", task="tests.testapp.tasks.remember",
                  args=["scheduled"])
    wait_until(lambda: Handled.objects.filter(key="scheduled").count() >= 3, timeout=30,
               what="three runs of the scheduled task", watch=[worker])
    schedules.pause("remember")
    time.sleep(1.0)
    ran = Handled.objects.filter(key="scheduled").count()
    assert ran == len(fired_ticks("remember"))


def test_settings_schedules_are_synced_at_start_and_stop_when_no_longer_declared(workers):
    declared = {"SCHEDULES": {"from-settings": {"cron": "* * * * * *", "topic": "reports",
                                                "payload": {"from": "settings"}}}}
    first = workers.start("w1", *WORKER_ARGS, settings=declared)
    wait_until(lambda: len(fired_ticks("from-settings")) >= 2, timeout=30,
               what="ticks of the settings schedule", watch=[first])
    first.terminate()
    first.wait_exit(15)
    second = workers.start("w2", *WORKER_ARGS, settings={"SCHEDULES": {}})
    # Kept (another release may declare it), not fired by this one, and says why.
    wait_until(lambda: "SCHEDULES" in Schedule.objects.get(name="from-settings").reason,
               timeout=30, what="the schedule removed from settings held", watch=[second])
    count = len(fired_ticks("from-settings"))
    wait_stable(lambda: len(fired_ticks("from-settings")), count, hold=2.0,
                what="no tick once removed from settings", watch=[second])
    schedules.remove("from-settings")
    assert not Schedule.objects.filter(name="from-settings").exists()


def test_a_worker_started_after_downtime_applies_each_catch_up_policy(workers):
    now = db_now()
    # An hourly tick half an hour ago: missed (too late for "none"), and five before it.
    minute = (datetime.fromtimestamp(now / 1000, UTC).minute + 30) % 60
    expression = f"{minute} * * * *"
    latest = cron.due_ticks(expression, UTC, 0, now, "latest")[0][-1]
    for policy in cron.CATCH_UP_POLICIES:
        ScheduleFactory(name=f"late-{policy}", cron=expression, catch_up=policy,
                        next_run_at=latest - 5 * 3_600_000,
                        definition=schedule_definition(cron=expression, catch_up=policy))
    worker = workers.start("w", *WORKER_ARGS)
    wait_until(lambda: not Schedule.objects.filter(next_run_at__lte=now).exists(), timeout=30,
               what="every late schedule advanced", watch=[worker])
    assert fired_ticks("late-latest") == [latest]
    assert fired_ticks("late-all") == [latest - h * 3_600_000 for h in range(5, -1, -1)]
    assert fired_ticks("late-none") == []
