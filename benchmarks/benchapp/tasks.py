"""The tasks benchmark's no-op tasks: one on django-sqlqueue's backend, one on
django-tasks-db's (when it is installed), so the figures measure the backends."""

from __future__ import annotations

import os
import time

from django.conf import settings
from django.tasks import task

from .queues import append_line


@task(queue_name="bench")
def noop() -> None:
    return None


@task(queue_name="latency")
def record_latency(number: int) -> None:
    """Append ``number time pid`` at the task's start (latency_workers, latency_notify)."""
    received = time.time()
    append_line(os.environ.get("SQLQUEUE_BENCH_LATENCY_LOG"),
                f"{number} {received:.6f} {os.getpid()}")


if "db" in settings.TASKS:

    @task(queue_name="bench", backend="db")
    def noop_db() -> None:
        return None
