"""A backend for Django's Tasks framework: ``@task`` functions run by ``runqueueworker``.

    TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.QueueBackend",
                         "QUEUES": ["default", "emails"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}

    @task(queue_name="emails")
    @task_options(max_attempts=10)      # any backend accepts it; this one reads it
    def send_welcome(user_id): ...

See docs/tasks.md. On Django 5.2 this needs the ``django-tasks`` backport package.
"""

from ..exceptions import Cancelled
from .backend import InvalidTaskArguments, QueueBackend, QueueTask
from .bulk import enqueue_many
from .cancelling import TaskCancellation
from .known import UnknownTask
from .options import task_options
from .payload import InvalidTaskPayload

__all__ = ["Cancelled", "InvalidTaskArguments", "InvalidTaskPayload", "QueueBackend",
           "QueueTask", "TaskCancellation", "UnknownTask", "enqueue_many", "task_options"]
