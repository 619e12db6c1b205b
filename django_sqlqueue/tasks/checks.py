"""System checks for the ``QueueBackend`` entries of ``TASKS`` (``sqlqueue.E050`` …
``sqlqueue.E057``), registered by :mod:`django_sqlqueue.checks`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

from ..docs import see
from .backend import MAX_QUEUE_NAME, QueueBackend
from .options import option_errors

_SETTINGS_HINT = see("tasks", "Settings")
DEFAULT_QUEUE = "default"  # a backend without QUEUES has this one queue


def task_backend_errors() -> list[CheckMessage]:
    """Every bad setting of every ``QueueBackend`` entry, and queue names two of them share."""
    errors: list[CheckMessage] = []
    owners: dict[str, str] = {}
    for alias, params, backend in _queue_backends():
        where = f"TASKS[{alias!r}]"
        errors += [Error(message, hint=_SETTINGS_HINT, id=check_id, obj=where)
                   for check_id, message in option_errors(params.get("OPTIONS", {}))]
        queues = params.get("QUEUES", [DEFAULT_QUEUE])  # Django's default
        if backend is None or not isinstance(queues, list | tuple) or not queues:
            errors.append(Error(
                f"{where}['QUEUES'] must be a non-empty list of queue names, got {queues!r}: "
                "a worker runs only the queues named (Django would read an empty list as "
                "'any queue', and enqueue tasks no worker runs)",
                hint="List every queue this backend's tasks use, e.g. "
                "'QUEUES': ['default', 'emails'].",
                id="sqlqueue.E056", obj=where))
            continue
        bad = [q for q in queues if not backend.queue_name_ok(q)]
        if bad:
            errors.append(Error(
                f"{where}['QUEUES'] {', '.join(map(repr, bad))}: a queue name must be 1-"
                f"{MAX_QUEUE_NAME} characters from [A-Za-z0-9._-] (it names the topic "
                "tasks.<queue>)",
                hint="Rename the queue.", id="sqlqueue.E055", obj=where))
        for queue in sorted({q for q in queues if backend.queue_name_ok(q)}):
            other = owners.setdefault(queue, alias)
            if other != alias:
                errors.append(Error(
                    f"task queue {queue!r} is in TASKS[{other!r}] and {where}: both would "
                    "publish to the topic tasks." + queue + " and a worker refuses to start",
                    hint="Give each queue of a django_sqlqueue backend a name of its own.",
                    id="sqlqueue.E057", obj=where))
    return errors


def _queue_backends() -> list[tuple[str, dict[str, Any], QueueBackend | None]]:
    """(alias, params, backend) of each QueueBackend entry; backend None when its QUEUES
    cannot even be read as a set of names."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return []
    found: list[tuple[str, dict[str, Any], QueueBackend | None]] = []
    for alias, params in configured.items():
        try:
            backend_class: Any = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own check reports a backend it cannot import
        if not (isinstance(backend_class, type) and issubclass(backend_class, QueueBackend)):
            continue
        try:
            backend = backend_class(alias, params)
        except TypeError:  # QUEUES holds something unhashable
            backend = None
        found.append((alias, params, backend))
    return found
