"""``drain()``: run the subscribers and tasks of a test in its own thread until nothing is
due, with the queue's real tables, retries and dead letters (see :mod:`.inline`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from ..consuming.registry import Subscription, autodiscover, subscriptions
from ..models.fields import SUBSCRIBER_NAME_LENGTH
from ..worker.engines import by_database
from .inline import InlineWorker, TestClock
from .summary import DrainResult

MAX_MESSAGES = 1000  # handler runs one drain() allows by default
MAX_CYCLES = 10_000  # polls one drain() allows by default


def drain(
    topic: str | Iterable[str] | None = None,
    group: str | Iterable[str] | None = None,
    *,
    advance_delays: bool = False,
    now: datetime | None = None,
    max_messages: int = MAX_MESSAGES,
    max_cycles: int = MAX_CYCLES,
    using: str | None = None,
) -> DrainResult:
    """Run the matching subscribers and task queues here until nothing is due; return
    what ran.

    ``topic`` and ``group`` pick subscriptions (a name or several; task queues are the
    topics ``tasks.<queue>`` of group ``tasks``). ``advance_delays`` moves the queue's clock
    to each waiting message's due time (a delay, a retry's backoff) instead of stopping;
    ``now`` starts that clock at another time. Raises DrainLimitExceeded after
    ``max_messages`` handler runs or ``max_cycles`` polls with work left.
    """
    for name, value in (("max_messages", max_messages), ("max_cycles", max_cycles)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"drain(): {name} must be an int >= 1, got {value!r}")
    if now is not None and not isinstance(now, datetime):
        raise ValueError(f"drain(): now must be a datetime, got {type(now).__name__}")
    worker_name = _worker_name()
    selected = _select(_names("topic", topic), _names("group", group), worker_name)
    start_ms = None if now is None else _epoch_ms(now)
    placed = {using: selected} if using else by_database(selected)
    if len(placed) == 1:
        [(alias, subscriptions)] = placed.items()
        return InlineWorker(
            subscriptions, name=worker_name, using=alias, clock=TestClock(),
            advance_delays=advance_delays, max_messages=max_messages, max_cycles=max_cycles,
        ).run(start_ms)
    # Topics on several aliases (SQLQUEUE["TOPICS"]): each alias in turn, again while a
    # pass handled something (a handler may publish to a topic on another alias).
    total = DrainResult()
    while True:
        before = total.delivered
        for alias, subscriptions in placed.items():
            part = InlineWorker(
                subscriptions, name=worker_name, using=alias, clock=TestClock(),
                advance_delays=advance_delays,
                max_messages=max(1, max_messages - total.delivered),
                max_cycles=max(1, max_cycles - total.cycles),
            ).run(start_ms)
            total.merge(part)
        if total.delivered == before:
            return total


def _names(what: str, value: str | Iterable[str] | None) -> set[str]:
    if value is None:
        return set()
    names = {value} if isinstance(value, str) else set(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"drain(): {what} must be a name or a list of names, got {value!r}")
    return names


def _select(topics: set[str], groups: set[str], worker_name: str) -> list[Subscription]:
    """The subscriptions a worker would run (every app's queues.py, and the task queues
    of the TASKS backends), narrowed to ``topics`` and ``groups``."""
    autodiscover()
    available = subscriptions()
    queues = _task_queues()
    if queues:
        from ..tasks.queues import task_subscriptions

        available += task_subscriptions(queues, worker_name)
    selected = [s for s in available if (not topics or s.topic in topics)
                and (not groups or s.group in groups)]
    if not selected:
        known = ", ".join(f"{s.topic} (group {s.group})" for s in available) or "none"
        wanted = " and ".join(f"{what} {', '.join(sorted(names))}" for what, names in
                              (("topic", topics), ("group", groups)) if names)
        raise ValueError(f"drain(): no subscriber or task queue matches {wanted or 'anything'}; "
                         f"registered: {known}")
    return selected


def _task_queues() -> dict[str, str]:
    from ..tasks.queues import configured_queues

    try:
        return configured_queues()
    except ImportError:  # no Tasks framework (Django 5.2 without django-tasks)
        return {}


def _worker_name() -> str:
    return f"drain:{socket.gethostname()}:{os.getpid()}"[:SUBSCRIBER_NAME_LENGTH]


def _epoch_ms(when: datetime) -> int:
    if timezone.is_naive(when):
        when = timezone.make_aware(when)
    return round(when.timestamp() * 1000)
