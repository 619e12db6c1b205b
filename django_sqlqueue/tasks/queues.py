"""The task queues a worker runs: one subscription per queue of each ``QueueBackend``."""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from ..conf import get_settings
from ..consuming.registry import Subscription
from ..exceptions import ConfigurationError
from .claims import TaskLimits
from .options import GROUP, MAX_TASK_ATTEMPTS, queues_by_database, topic_for


def configured_queues() -> dict[str, str]:
    """Every queue name of the ``QueueBackend`` entries of ``TASKS``, with its backend alias.

    Raises ConfigurationError when two such backends share a queue name: they would share
    its topic; or when a module holding tasks cannot be imported (see known.py: they are
    found here, as a worker starts).
    """
    # ImportError without Django's Tasks framework (Django 5.2 without django-tasks).
    from .backend import QueueBackend
    from .compat import task_backends
    from .known import known_tasks

    queues: dict[str, str] = {}
    for alias, params in (task_backends.settings or {}).items():
        try:
            backend_class = import_string(params["BACKEND"])
        except (ImportError, KeyError):
            continue  # Django's own check reports a backend it cannot import
        if not (isinstance(backend_class, type) and issubclass(backend_class, QueueBackend)):
            continue
        for queue in sorted(task_backends[alias].queues):
            other = queues.setdefault(queue, alias)
            if other != alias:
                raise ConfigurationError(
                    f"task queue {queue!r} is in TASKS[{other!r}] and TASKS[{alias!r}]; each "
                    "queue of a django_sqlqueue backend needs a name of its own")
    if queues:
        known_tasks()
    return queues


def task_subscriptions(queues: dict[str, str], worker_id: str) -> list[Subscription]:
    """Subscriptions running ``queues`` (name → backend alias) in a worker named ``worker_id``."""
    from .compat import task_backends
    from .runner import TaskRunner

    conf = get_settings()
    # A runner per database the queues' topics live on: each worker engine (one per alias,
    # see worker/engines.py) starts the hooks of its own subscriptions.
    runners: dict[str, TaskRunner] = {}
    for names in queues_by_database(queues).values():
        placed = {queue: queues[queue] for queue in names}
        runner = TaskRunner(worker_id, sorted(set(placed.values())), backends=placed)
        runners.update((queue, runner) for queue in names)
    subscriptions = []
    for queue, alias in sorted(queues.items()):
        runner = runners[queue]
        backend: Any = task_backends[alias]
        subscriptions.append(Subscription(
            topic=topic_for(queue), group=GROUP, handler=runner,
            # The runner decides when a task has had its attempts (each task may set its
            # own); the subscription only stops a message whose workers keep dying.
            max_attempts=MAX_TASK_ATTEMPTS,
            visibility_timeout=backend.queue_options.visibility_timeout,
            # Tasks have no key and no order: concurrent mode, never strict.
            batch_size=max(2, conf.batch_size),
            backoff=backend.queue_options.backoff, auto_extend=True, priority_of=_priority,
            hooks=runner, limits=TaskLimits(queues),
        ))
    return subscriptions


def _priority(payload: Any) -> int:
    priority = payload.get("priority", 0) if isinstance(payload, dict) else 0
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
