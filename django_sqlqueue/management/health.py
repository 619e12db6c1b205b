"""``manage.py sqlqueue health``: one verdict and one line, over every queue alias."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from django_sqlqueue import operations as ops
from django_sqlqueue.db.schema_state import check_migrated
from django_sqlqueue.management.failures import USAGE_ERROR, command_errors
from django_sqlqueue.management.selection import positive_seconds


def verdict(options: dict[str, Any], targets: list[tuple[str, str]],
            subscribed: Callable[[], set[str]]) -> tuple[bool, str]:
    """Whether the queue is healthy on every (label, alias) of ``targets``, and the line
    saying so (one part per alias where topics live on several)."""
    if len(targets) == 1:
        return on_alias(options, targets[0][1], subscribed)
    parts, healthy = [], True
    for label, alias in targets:
        try:
            with command_errors(alias):
                check_migrated(alias)
                found = on_alias(options, alias, subscribed)
        except CommandError as exc:
            if options["group"] is not None and "is not registered" in str(exc):
                continue  # the group consumes topics on other aliases only
            found = (False, str(exc))
        healthy = healthy and found[0]
        parts.append(f"database {label}: {found[1]}")
    if not parts:
        raise CommandError(f"consumer group {options['group']!r} is not registered for any "
                           "topic", returncode=USAGE_ERROR)
    return healthy, "; ".join(parts)


def on_alias(options: dict[str, Any], using: str,
             subscribed: Callable[[], set[str]]) -> tuple[bool, str]:
    """Whether the alias ``using`` is healthy, and the line saying so."""
    max_age = None
    if options["max_age"] is not None:
        max_age = positive_seconds("--max-age", options["max_age"])
    report = ops.health(group=options["group"], max_age=max_age, using=using)
    notes = ([] if options["group"] is not None else
             [topic.line for topic in ops.unclaimed_topics(using=using)])
    if options["strict"]:
        notes += [f"@subscriber topic {topic!r} has never had a message (a typo of a "
                  "published topic?)" for topic in ops.silent_topics(subscribed(), using)]
    if not report.ok:
        return False, "; ".join([report.line, *notes])
    if notes and options["strict"]:
        return False, "unhealthy: " + "; ".join(notes)
    return True, "; ".join([report.line, *notes])
