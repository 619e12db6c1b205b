"""What an operator can see and do, as plain functions: the CLI (``manage.py sqlqueue``),
the admin and the metrics all call these, so each action has one implementation.

Every function takes ``using`` (the database alias, default the queue's:
:func:`django_sqlqueue.conf.queue_database`) and raises an
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
from .limits import LimitStats, limits_overview
from .schedules import (
    ScheduleRow,
    UnknownSchedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    run_now,
)
from .stats import Health, SubscriptionStats, health, overview
from .topics import UnclaimedTopic, has_messages, silent_topics, unclaimed_topics

__all__ = [
    "AlreadyHandled",
    "AmbiguousMessage",
    "Collected",
    "DeadLetterFilter",
    "DeadLetterSample",
    "Health",
    "InvalidFilter",
    "LimitStats",
    "OperationError",
    "Outcome",
    "Released",
    "Replayed",
    "ScheduleRow",
    "SubscriptionStats",
    "UnclaimedTopic",
    "UnknownMessage",
    "UnknownSchedule",
    "UnknownSubscriber",
    "UnknownSubscription",
    "count",
    "deliver_now",
    "discard",
    "forget",
    "has_messages",
    "health",
    "limits_overview",
    "list_schedules",
    "overview",
    "pause",
    "pause_schedule",
    "release_leases",
    "replay",
    "resume",
    "resume_schedule",
    "run_now",
    "run_gc",
    "sample",
    "silent_topics",
    "unclaimed_topics",
]
