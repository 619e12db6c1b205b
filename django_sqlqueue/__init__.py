"""django-sqlqueue: a partitioned, at-least-once message queue in your Django database.

The public API is imported lazily (PEP 562) so that ``import django_sqlqueue`` works in
settings files and before the app registry is ready.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .exceptions import (
    ConfigurationError,
    DeadLetter,
    InvalidMessage,
    LeaseLost,
    Retry,
    SQLQueueError,
    TopicNotDrained,
)

if TYPE_CHECKING:
    from .cancelling import CancelResult, CancelStatus, cancel
    from .consuming.backoff import ExponentialBackoff
    from .consuming.message import Message
    from .consuming.registry import subscriber
    from .publishing import StoredMessage, publish, publish_many

_LAZY = {
    "CancelResult": "django_sqlqueue.cancelling",
    "CancelStatus": "django_sqlqueue.cancelling",
    "cancel": "django_sqlqueue.cancelling",
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
    "subscriber",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_sqlqueue' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
