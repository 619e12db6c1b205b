"""The chaos run's tasks (queue ``chaos``): a normal one, and two whose outcome no
database column takes as it is (a NUL character; a value over the stored size limit)."""

from __future__ import annotations

from . import records

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport, when installed
    from django_tasks import task  # type: ignore[no-redef]

QUEUE = "chaos"
# Over the largest outcome the queue stores as it is: recorded in a form that says so.
BIG_RESULT_CHARACTERS = 3 * 1024 * 1024


@task(queue_name=QUEUE)
def note(n: int) -> int:
    records.write("tasks", e="ran", n=n, kind="note")
    return n


@task(queue_name=QUEUE)
def nul_result(n: int) -> str:
    records.write("tasks", e="ran", n=n, kind="nul")
    return f"before\x00after {n}"


@task(queue_name=QUEUE)
def big_result(n: int) -> str:
    records.write("tasks", e="ran", n=n, kind="big")
    return "x" * BIG_RESULT_CHARACTERS
