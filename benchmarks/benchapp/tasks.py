"""The tasks benchmark's no-op tasks: one on django-sqlqueue's backend, one on
django-tasks-db's (when it is installed), so the figures measure the backends."""

from __future__ import annotations

from django.conf import settings
from django.tasks import task


@task(queue_name="bench")
def noop() -> None:
    return None


if "db" in settings.TASKS:

    @task(queue_name="bench", backend="db")
    def noop_db() -> None:
        return None
