"""django-sqlqueue: a partitioned, at-least-once message queue in your Django database.

The public API is imported lazily (PEP 562) so that ``import django_sqlqueue`` works in
settings files and before the app registry is ready, and imports nothing of Django itself
(the pytest plugin, ``django_sqlqueue.testing.pytest_plugin``, is loaded before Django is
configured).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cancelling import CancelResult, CancelStatus, cancel
    from .consuming.backoff import ExponentialBackoff
    from .consuming.message import Message
    from .consuming.registry import subscriber
    from .exceptions import (
        ConfigurationError,
        DeadLetter,
        InvalidMessage,
        LeaseLost,
        Retry,
        SQLQueueError,
        TopicNotDrained,
    )
    from .publishing import StoredMessage, publish, publish_many

_LAZY = {
    "CancelResult": "django_sqlqueue.cancelling",
    "CancelStatus": "django_sqlqueue.cancelling",
    "cancel": "django_sqlqueue.cancelling",
    **dict.fromkeys(["ConfigurationError", "DeadLetter", "InvalidMessage", "LeaseLost", "Retry",
                     "SQLQueueError", "TopicNotDrained"], "django_sqlqueue.exceptions"),
    "ExponentialBackoff": "django_sqlqueue.consuming.backoff",
    "Message": "django_sqlqueue.consuming.message",
    "subscriber": "django_sqlqueue.consuming.registry",
    "StoredMessage": "django_sqlqueue.publishing",
    "publish": "django_sqlqueue.publishing",
    "publish_many": "django_sqlqueue.publishing",
}

__all__ = [
    "CancelResult",
    "CancelStatus",
    "ConfigurationError",
    "DeadLetter",
    "ExponentialBackoff",
    "Message",
    "InvalidMessage",
    "LeaseLost",
    "Retry",
    "SQLQueueError",
    "StoredMessage",
    "TopicNotDrained",
    "cancel",
    "publish",
    "publish_many",
    "schedules",
    "subscriber",
]


def __getattr__(name: str) -> Any:
    if name == "schedules":  # the run-time schedules API, a module of its own
        value = import_module(".schedules", __name__)
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_sqlqueue' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
