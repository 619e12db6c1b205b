"""Test helpers: ``captured()`` records what a block publishes, ``drain()`` runs the
subscribers and tasks in the test's own thread, as a worker would.

Imported lazily (PEP 562), like the package itself: the pytest plugin
(:mod:`.pytest_plugin`) is loaded before Django is configured.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .capture import Captured, CapturedTask, captured
    from .draining import drain
    from .inline import DrainLimitExceeded
    from .summary import DrainResult, Failure, TopicCounts

_LAZY = {
    "Captured": "django_sqlqueue.testing.capture",
    "CapturedTask": "django_sqlqueue.testing.capture",
    "captured": "django_sqlqueue.testing.capture",
    "drain": "django_sqlqueue.testing.draining",
    "DrainLimitExceeded": "django_sqlqueue.testing.inline",
    "DrainResult": "django_sqlqueue.testing.summary",
    "Failure": "django_sqlqueue.testing.summary",
    "TopicCounts": "django_sqlqueue.testing.summary",
}

__all__ = ["Captured", "CapturedTask", "DrainLimitExceeded", "DrainResult", "Failure",
           "TopicCounts", "captured", "drain"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_sqlqueue.testing' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
