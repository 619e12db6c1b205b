"""The tasks benchmark: django-sqlqueue's Tasks backend next to django-tasks-db.

The same script, on the same database, for both, in three alternating rounds (medians):
enqueue ``--tasks`` no-op tasks one at a time (each its own transaction), then drain them
with two workers (``runqueueworker --queue bench``; django-tasks-db's ``db_worker
--queue-name bench``). Completed per second is measured between the first and the last
``finished_at`` the workers wrote.
During each django-sqlqueue round, once a fifth of the backlog is done, a high-priority task
is enqueued behind the rest, and a task with ``run_after`` two seconds ahead: the results
say how many backlog tasks started between the first's enqueue and its start (on its
worker, and on the other one), and whether the second started early.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from . import suite
from .database import QUEUE_TABLES, truncate
from .suite import Context, Result, ratio_result

TASK_WORKERS = 2
COMPLETED_RATIO = 10.0  # sqlqueue tasks completed per second / django-tasks-db's
ENQUEUE_RATIO = 1.0
DRAIN_TIMEOUT = 600.0  # seconds
DEFER_SECONDS = 2.0
ROUNDS = 3
RESULT_TABLES = {"sqlqueue": "queue_task_results", "db": "django_tasks_database_dbtaskresult"}


def tasks(ctx: Context) -> list[Result]:
    if importlib.util.find_spec("django_tasks_db") is None:
        raise RuntimeError("django-tasks-db is not installed: `make bench` installs it "
                           "(pip install django-tasks-db)")
    from .benchapp.tasks import noop, noop_db  # type: ignore[attr-defined]

    # Alternating rounds, medians: the server's load drifts (other clients, flushing), and
    # it should hit both sides alike.
    ours, theirs = [], []
    for _ in range(ROUNDS):
        ours.append(_run(ctx, "sqlqueue", noop, ctx.task_count, probes=True))
        theirs.append(_run(ctx, "db", noop_db, ctx.baseline_task_count, probes=False))
    details = {"sqlqueue": ours, "django_tasks_db": theirs, "workers": TASK_WORKERS,
               "rounds": ROUNDS}
    return [
        ratio_result("tasks_completed", _median(ours, "completed_per_s"),
                     _median(theirs, "completed_per_s"), "tasks/s", COMPLETED_RATIO, details),
        ratio_result("tasks_enqueue", _median(ours, "enqueue_per_s"),
                     _median(theirs, "enqueue_per_s"), "tasks/s", ENQUEUE_RATIO, {}),
    ]


def _median(runs: list[dict[str, Any]], name: str) -> float:
    return float(statistics.median(run[name] for run in runs))


def _run(ctx: Context, which: str, task: Any, count: int, probes: bool) -> dict[str, Any]:
    _empty(ctx)
    ctx.log(f"  {which}: enqueuing {count} tasks")
    started = time.perf_counter()
    for _ in range(count):
        task.enqueue()
    enqueue_per_s = round(count / (time.perf_counter() - started), 1)
    extra: dict[str, Any] = {}
    for n in range(TASK_WORKERS):
        _start_worker(ctx, which, f"tasks-{which}-{n}")
    table = RESULT_TABLES[which]
    if probes:
        # Behind a backlog the workers are already draining: a high-priority task, and one
        # deferred by DEFER_SECONDS.
        _wait_for(ctx, table, count // 5, which)
        probed_at = timezone.now()
        high = task.using(priority=100).enqueue()
        run_after = timezone.now() + timedelta(seconds=DEFER_SECONDS)
        deferred = task.using(run_after=run_after).enqueue()
        count += 2
    _wait_for(ctx, table, count, which)
    suite.stop_workers(ctx)
    first, last = suite.fetch_all(
        f"SELECT MIN(finished_at), MAX(finished_at) FROM {table}")[0]  # noqa: S608 - fixed names
    span = (_as_datetime(last) - _as_datetime(first)).total_seconds()
    if probes:
        extra.update(_priority_probe(table, high.id, probed_at))
        deferred_started = _started_at(table, deferred.id)
        extra["run_after_early_ms"] = max(
            0.0, round((run_after - deferred_started).total_seconds() * 1000, 1))
        extra["run_after_late_ms"] = round((deferred_started - run_after).total_seconds() * 1000, 1)
    return {
        "tasks": count, "enqueue_per_s": enqueue_per_s,
        "completed_per_s": round((count - 1) / span, 1) if span > 0 else None,
        "drain_seconds": round(span, 2), **extra,
    }


def _wait_for(ctx: Context, table: str, done: int, which: str) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while _count(table, "SUCCESSFUL") < done:
        suite.check_workers_alive(ctx)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{which}: tasks not drained within {DRAIN_TIMEOUT:.0f}s")
        time.sleep(0.05)


def _priority_probe(table: str, high_id: str, enqueued_at: datetime) -> dict[str, int]:
    """How many backlog tasks started after the high-priority one was enqueued and before
    it started: on the worker that ran it (its scope), and on the other."""
    high_started, high_workers = suite.fetch_all(
        f"SELECT started_at, worker_ids FROM {table} WHERE id = %s", [high_id])[0]  # noqa: S608 - fixed names
    worker = json.loads(high_workers)[0] if isinstance(high_workers, str) else high_workers[0]
    same = other = 0
    for (workers,) in suite.fetch_all(
            f"SELECT worker_ids FROM {table} WHERE started_at > %s AND started_at < %s",  # noqa: S608 - fixed names
            [enqueued_at, _as_datetime(high_started)]):
        names = json.loads(workers) if isinstance(workers, str) else workers
        if worker in names:
            same += 1
        else:
            other += 1
    return {"started_before_high_same_worker": same, "started_before_high_other_worker": other}


def _empty(ctx: Context) -> None:
    connection.close()
    truncate(ctx.db, (*QUEUE_TABLES, *RESULT_TABLES.values()))


def _count(table: str, status: str) -> int:
    return int(suite.fetch_all(
        f"SELECT COUNT(*) FROM {table} WHERE status = %s", [status])[0][0])  # noqa: S608 - fixed names


def _started_at(table: str, result_id: str) -> datetime:
    value = suite.fetch_all(f"SELECT started_at FROM {table} WHERE id = %s",  # noqa: S608 - fixed names
                            [result_id.replace("-", "") if table.startswith("django") else result_id])
    return _as_datetime(value[0][0])


def _as_datetime(value: Any) -> datetime:
    """A datetime column as an aware datetime (SQLite returns text)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)


def _start_worker(ctx: Context, which: str, tag: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(suite.REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    if which == "sqlqueue":
        command = ["runqueueworker", "--queue", "bench", "--name", tag]
    else:
        command = ["db_worker", "--backend", "db", "--queue-name", "bench",
                   "--no-startup-delay", "--no-reload", "--worker-id", tag]
    log = open(ctx.work_dir / f"worker-{tag}.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-m", "django", *command],
        cwd=suite.REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    ctx.workers.append(proc)


BENCHMARKS = {"tasks": tasks}
