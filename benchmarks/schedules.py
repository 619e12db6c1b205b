"""The schedules benchmark: 10,000 run-time schedules fired by two schedulers.

``--schedules`` schedules are stored (as ``django_sqlqueue.schedules.add`` stores them);
all but 300 are daily, at times spread over the day. The 300 tick once a minute each, at
second ``n % 60``: five ticks a second. Two schedulers (each a worker's scheduler thread,
on a connection of its own) run side by side for ``--schedule-seconds``:

* ``schedules_statements_idle``: statements per second per scheduler while none is due
  (the 300 paused): the cost of the schedules when nothing fires.
* ``schedules_statements_firing``: the same while the 300 fire.
* ``schedules_delay_p99``: seconds from each tick to its message's commit time
  (``published_at``, the database clock), 99th percentile; the target is 1 s.
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import UTC, datetime
from typing import Any

from django.db import connections

from django_sqlqueue.models import QueueMessage, Schedule
from django_sqlqueue.scheduling import cron
from django_sqlqueue.scheduling.spec import normalize
from django_sqlqueue.worker.scheduling import Scheduler

from .suite import Context, Result, at_most

TOPIC = "schedule_bench"
FIRING = 300  # schedules that tick once a minute each, spread over the seconds
SCHEDULERS = 2
IDLE_SECONDS = 10.0


def schedules(ctx: Context) -> list[Result]:
    ctx.empty_queue()
    total = ctx.schedule_count
    seconds = ctx.schedule_seconds
    ctx.log(f"  storing {total} schedules ({FIRING} ticking every minute)")
    _store(total)
    Schedule.objects.filter(name__startswith="firing-").update(paused=True)
    idle = _run(IDLE_SECONDS)
    ctx.log(f"  idle: {idle['per_scheduler_per_second']} statements/s per scheduler")
    now = Schedule.objects.now_ms("default")
    for row in Schedule.objects.filter(name__startswith="firing-"):
        Schedule.objects.filter(name=row.name).update(
            paused=False, next_run_at=cron.next_tick(row.cron, UTC, now))
    started = Schedule.objects.now_ms("default")
    firing = _run(seconds)
    delays = _delays(started)
    ctx.empty_queue()
    details = {"schedules": total, "schedulers": SCHEDULERS, "seconds": seconds}
    p99 = round(_percentile(delays, 99), 3) if delays else None
    return [
        at_most("schedules_statements_idle", idle["per_scheduler_per_second"], "statements/s",
                None, {**details, "seconds": IDLE_SECONDS, **idle}),
        at_most("schedules_statements_firing", firing["per_scheduler_per_second"],
                "statements/s", None, {**details, **firing}),
        at_most("schedules_delay_p99", p99, "s", 1.0, {
            **details, "ticks": len(delays),
            "p50_s": round(statistics.median(delays), 3) if delays else None,
            "max_s": round(max(delays), 3) if delays else None}),
    ]


def _store(total: int) -> None:
    now = Schedule.objects.now_ms("default")
    rows = []
    for n in range(total):
        if n < FIRING:
            name, expression = f"firing-{n}", f"{n % 60} * * * * *"
        else:
            name, expression = f"daily-{n}", f"{n % 60} {n % 24} * * *"
        spec = normalize(name, {"cron": expression, "topic": TOPIC, "payload": {"n": n},
                                "key": f"tenant-{n}"})
        rows.append(Schedule(name=name, cron=spec.cron, timezone=spec.timezone,
                             catch_up=spec.catch_up, target=spec.target,
                             definition=spec.definition_json(),
                             next_run_at=cron.next_tick(spec.cron, UTC, now),
                             created_at=now, updated_at=now))
    Schedule.objects.bulk_create(rows, batch_size=1000)


def _run(seconds: float) -> dict[str, Any]:
    """Run SCHEDULERS schedulers for ``seconds``; count their statements."""
    counts = [0] * SCHEDULERS
    stop = threading.Event()

    def scheduler(index: int) -> None:
        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            counts[index] += 1
            return execute(sql, params, many, context)

        worker = Scheduler("default")
        worker.synced = True  # nothing declared in settings
        try:
            with connections["default"].execute_wrapper(count):
                while not stop.wait(worker.step()):
                    pass
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=scheduler, args=(i,)) for i in range(SCHEDULERS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    took = time.monotonic() - began
    return {"statements": counts,
            "per_scheduler_per_second": round(sum(counts) / SCHEDULERS / took, 2)}


def _delays(since_ms: int) -> list[float]:
    """Seconds from each tick fired since ``since_ms`` to its message's publish time."""
    delays = []
    for message_id, published_at in QueueMessage.objects.filter(topic=TOPIC).values_list(
            "message_id", "published_at"):
        label = message_id.split(":", 2)[2]  # schedule:<name>:<tick>
        tick = int(datetime.strptime(label, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                   .timestamp() * 1000)
        if tick >= since_ms:
            delays.append((published_at - tick) / 1000)
    return delays


def _percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(percent / 100 * len(ordered)) - 1))
    return ordered[index]


BENCHMARKS = {"schedules": schedules}
