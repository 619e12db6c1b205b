"""Which subscriptions a worker runs: runqueueworker's --group, --topic and --queue, and
the embedded worker's keywords of the same names (:mod:`django_sqlqueue.embedded`)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from django_sqlqueue.consuming.registry import Subscription, autodiscover, subscriptions
from django_sqlqueue.exceptions import ConfigurationError

USAGE_ERROR = 2  # exit status for bad options, as argparse uses


def _select(options: dict[str, Any], worker_name: str) -> list[Subscription]:
    """The subscriptions the options ask for: task queues named by --queue, plus the
    @subscriber handlers (and task queues, group "tasks") --group and --topic pick; with
    none of the three, all of them."""
    try:
        autodiscover()
        queues = _task_queues()
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from exc
    wanted_queues = set(options["queue"])
    unknown_queues = wanted_queues - set(queues)
    if unknown_queues:
        known = ", ".join(sorted(queues)) or "none (no django_sqlqueue.tasks.QueueBackend in TASKS)"
        raise CommandError(
            f"unknown task queue(s): {', '.join(sorted(map(repr, unknown_queues)))}; known: "
            f"{known}", returncode=USAGE_ERROR,
        )
    available = subscriptions()
    if queues:
        from django_sqlqueue.tasks.queues import task_subscriptions

        available += task_subscriptions(queues, worker_name)
    if not available:
        raise CommandError(
            "no @subscriber handlers found; declare them in a queues.py module of an "
            "installed app (or configure a django_sqlqueue.tasks.QueueBackend in TASKS)"
        )
    groups, topics = set(options["group"]), set(options["topic"])
    # repr(): a name given on the command line may hold a line break or an undecodable
    # byte, and the error stays one printable line.
    unknown_groups = groups - {s.group for s in available}
    if unknown_groups:
        raise CommandError(
            f"unknown group(s): {', '.join(sorted(map(repr, unknown_groups)))}; known: "
            f"{', '.join(sorted({s.group for s in available}))}", returncode=USAGE_ERROR,
        )
    unknown_topics = topics - {s.topic for s in available}
    if unknown_topics:
        raise CommandError(
            f"unknown topic(s): {', '.join(sorted(map(repr, unknown_topics)))}; known: "
            f"{', '.join(sorted({s.topic for s in available}))}", returncode=USAGE_ERROR,
        )
    if not (groups or topics or wanted_queues):
        return available
    from django_sqlqueue.tasks.options import topic_for

    queue_topics = {topic_for(q) for q in wanted_queues}
    selected = [
        s for s in available
        if s.topic in queue_topics
        or ((groups or topics) and (not groups or s.group in groups)
            and (not topics or s.topic in topics))
    ]
    if not selected:
        raise CommandError("no subscription matches both --group and --topic",
                           returncode=USAGE_ERROR)
    return selected


def _task_queues() -> dict[str, str]:
    """Queue name → backend alias of every configured django_sqlqueue task queue; none
    when the Tasks framework is not installed (Django 5.2 without django-tasks)."""
    from django_sqlqueue.tasks.queues import configured_queues

    try:
        return configured_queues()
    except ImportError:
        return {}
