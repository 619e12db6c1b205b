"""Tasks only the later release has (see tests/settings_release2.py): a worker of the
earlier release cannot import this module, nor enqueue on its "reports" queue."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef,import-not-found,unused-ignore]

from tests.testapp.tasks import record


@task
def weekly_report(label: str) -> None:
    record(label)


@task(queue_name="reports")
def on_new_queue(label: str) -> None:
    record(label)
