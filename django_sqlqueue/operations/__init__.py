"""What an operator can see and do, as plain functions: the CLI (``manage.py sqlqueue``),
the admin and the metrics all call these, so each action has one implementation.

Every function takes ``using`` (the database alias, default ``"default"``) and raises an
:class:`~django_sqlqueue.operations.errors.OperationError` subclass (also a ValueError)
for input it cannot act on.
"""

from .control import Collected, Released, deliver_now, forget, pause, release_leases, resume, run_gc
from .dead_letters import (
    DeadLetterFilter,
    DeadLetterSample,
    Outcome,
    Replayed,
    count,
    discard,
    replay,
    sample,
)
from .errors import (
    AlreadyHandled,
    AmbiguousMessage,
    InvalidFilter,
    OperationError,
    UnknownMessage,
    UnknownSubscriber,
    UnknownSubscription,
)
from .stats import Health, SubscriptionStats, health, overview

__all__ = [
    "AlreadyHandled",
    "AmbiguousMessage",
    "Collected",
    "DeadLetterFilter",
    "DeadLetterSample",
    "Health",
    "InvalidFilter",
    "OperationError",
    "Outcome",
    "Released",
    "Replayed",
    "SubscriptionStats",
    "UnknownMessage",
    "UnknownSubscriber",
    "UnknownSubscription",
    "count",
    "deliver_now",
    "discard",
    "forget",
    "health",
    "overview",
    "pause",
    "release_leases",
    "replay",
    "resume",
    "run_gc",
    "sample",
]
