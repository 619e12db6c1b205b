"""A backend for Django's Tasks framework: ``@task`` functions run by ``runqueueworker``.

    TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.QueueBackend",
                         "QUEUES": ["default", "emails"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}

See docs/tasks.md. On Django 5.2 this needs the ``django-tasks`` backport package.
"""

from .backend import InvalidTaskArguments, QueueBackend, QueueTask

__all__ = ["InvalidTaskArguments", "QueueBackend", "QueueTask"]
