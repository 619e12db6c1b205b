"""Enqueueing many calls of one task at once: ``enqueue_many(task, calls)``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .backend import QueueBackend


def enqueue_many(task: Any, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Any]:
    """Enqueue ``task`` once per ``(args, kwargs)`` pair of ``calls`` with multi-row INSERTs
    (see :meth:`QueueBackend.enqueue_many`); the task's backend must be this app's.

        results = enqueue_many(send_welcome, [((user.pk,), {}) for user in new_users])
    """
    backend = task.get_backend()
    if not isinstance(backend, QueueBackend):
        raise TypeError(
            f"{task.module_path} runs on the backend {task.backend!r} "
            f"({type(backend).__module__}.{type(backend).__name__}); enqueue_many() needs "
            "django_sqlqueue.tasks.QueueBackend")
    return backend.enqueue_many(task, calls)
