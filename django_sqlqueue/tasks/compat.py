"""Django's Tasks framework, from Django (6.0+) or from the ``django-tasks`` backport (5.2).

Everything the backend needs from the framework is imported here, so no other module
cares where it came from.
"""

from __future__ import annotations

try:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
except ImportError:  # Django 5.2: the backport package, when installed
    try:
        from django_tasks import (  # type: ignore[no-redef,import-not-found,unused-ignore]
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django_tasks.backends.base import (  # type: ignore[no-redef,import-not-found,unused-ignore]
            BaseTaskBackend,
        )
        from django_tasks.base import (  # type: ignore[no-redef,import-not-found,unused-ignore]
            Task,
            TaskError,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore]
            InvalidTaskError as InvalidTask,  # the backport's name for Django's InvalidTask
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore]
            TaskResultDoesNotExist,
        )
        from django_tasks.signals import (  # type: ignore[no-redef,import-not-found,unused-ignore]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json  # type: ignore[no-redef,import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(
            "django_sqlqueue.tasks needs Django's Tasks framework: Django 6.0 or later, or on "
            "Django 5.2 the django-tasks package (pip install django-tasks)"
        ) from exc
    SOURCE = "django_tasks"


__all__ = [
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
