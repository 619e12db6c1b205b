"""A @task outside any installed app's tasks module: known only when
``SQLQUEUE["TASK_MODULES"]`` lists this module (tests/test_task_paths.py)."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef,import-not-found,unused-ignore]


@task
def multiply(a: int, b: int) -> int:
    return a * b
